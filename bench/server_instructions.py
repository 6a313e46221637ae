"""The server's instructions per task of a drain, counted by callgrind (steady under load,
unlike CPU time): a private ``redis-server`` run under ``valgrind --tool=callgrind``.

Usage::

    .venv/bin/python bench/server_instructions.py [--tasks 3000] [--index 10000]
        [--mode reliable] [--no-results] [--python PATH] [--functions 0] [--enqueue]
        [--keep FILE] [--warm]

The parent starts ``valgrind --tool=callgrind redis-server`` on a free port (no persistence)
and runs a child with ``--python`` (default: this interpreter with this tree's ``src`` first
on ``sys.path``; give the blitzq 1.1.0 venv's python to measure that release). The child
enqueues ``--tasks`` no-op tasks in batches of 1,000 (``enqueue_many``), zeroes the
server's counters (``callgrind_control -z``), drains them with one in-process
``Worker(concurrency=200)`` until every task ran, stops the worker (its last notes of ended
tasks are written at the stop) and dumps the counters (``callgrind_control -d``). Printed:
the dump's total instructions (``Ir``) and per task, and with ``--functions N`` the N
functions of the server with the most inclusive instructions (``callgrind_annotate``).

``--index`` sets ``Queue(recent_index=...)`` (this tree only; 0: no index of ended tasks),
so that two runs give the index's own cost as their difference.

``--notes M`` measures the index of ended tasks alone instead of a drain: the child writes
M notes of one queue through ``broker.state.browse.add_ended`` (what a worker's
``EndNotes`` sends once a second), ``--batch`` notes a call (default 1,000: a worker ending
1,000 tasks a second), ``--index`` kept (default 10,000: with M past it, the trim works too),
between the zeroing and the dump. ``--src`` runs another checkout's ``src`` (e.g. the tree
before a change) with this interpreter; give it as an absolute path (the child runs in
``/tmp``).

``--warm`` loads every script of the tree (``SCRIPT LOAD``, the texts the worker would send)
before the zeroing: the worker's ``EVALSHA`` then finds them, and the count leaves out their
compiling, a cost of the worker's start (about 3.8 k instructions a task over 3,000 tasks,
0.6 k over the 20,000 of ``server_cost.py``), not of its tasks. A tree without
``blitzq.broker.redis.scripts`` (blitzq 1.1.0, whose scripts are small) loads nothing.

The worker's lease renewals (``renew.lua``: ``XPENDING`` + ``XCLAIM`` of each running task)
come every 10 s at most, by the second, not by the task: a drain slowed some 50 times by
valgrind runs into one or two of them where a real one does not (1.4-2.7 k instructions a
task when one falls in the count; ``--functions`` shows them as ``xclaimCommand``).

``--enqueue`` counts the bulk enqueue instead of the drain: one message first (the script
loaded, the stream made), then the zeroing, the ``enqueue_many`` calls of ``--tasks``
messages, the dump; printed per message. ``--keep FILE`` copies the dump there (for
``callgrind_annotate --inclusive=yes --tree=calling FILE``: what each command and each part
of a Lua call cost).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _child(args: argparse.Namespace) -> None:
    """The drain, in the process whose ``blitzq`` is measured (see the module docstring)."""
    import uuid

    from blitzq import Queue, Worker

    url, pid = os.environ["CG_REDIS_URL"], os.environ["CG_PID"]
    if args.notes:
        await _notes_child(args, url, pid)
        return
    options = {"recent_index": args.index} if args.index is not None else {}
    queue = Queue(
        name="default",
        redis_url=url,
        namespace="cg" + uuid.uuid4().hex[:8],
        mode=args.mode,
        store_results=not args.no_results,
        **options,
    )
    done = 0
    finished = asyncio.Event()

    @queue.task
    async def noop() -> int:
        nonlocal done
        done += 1
        if done == args.tasks:
            finished.set()
        return 1

    if args.enqueue:
        await noop.enqueue_many([()])  # the script loaded, the stream made
        subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
    for start in range(0, args.tasks, 1000):
        await noop.enqueue_many([() for _ in range(min(1000, args.tasks - start))])
    if args.enqueue:
        subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
        await queue.close()
        return
    if args.warm:
        _load_scripts(url)
    subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
    worker = Worker(queue, concurrency=200)
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(finished.wait(), timeout=600)
    stopped = worker.stop()
    if asyncio.iscoroutine(stopped):
        await stopped
    await asyncio.wait_for(run, timeout=120)
    subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
    await queue.close()


def _load_scripts(url: str) -> None:
    """``--warm``: ``SCRIPT LOAD`` of every script of the tree (see the module docstring)."""
    import redis

    try:
        from blitzq.broker.redis import scripts
    except ImportError:  # blitzq 1.1.0: its few scripts live elsewhere (and cost little)
        return
    client = redis.Redis.from_url(url)
    for name in scripts.names():
        client.script_load(scripts.load(name).source)
    client.close()


async def _notes_child(args: argparse.Namespace, url: str, pid: str) -> None:
    """``--notes``: the index's writes alone (see the module docstring)."""
    import time
    import uuid

    from blitzq import Queue

    queue = Queue(name="default", redis_url=url, namespace="cg" + uuid.uuid4().hex[:8])
    browse = queue.broker.state.browse
    cap = 10_000 if args.index is None else args.index
    notes = [f"succeeded\nbench.noop\n{uuid.uuid4().hex}" for _ in range(args.notes)]
    await browse.add_ended("warm", notes[:1], time.time(), cap, 600)  # the script loaded
    subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
    for start in range(0, args.notes, args.batch):
        await browse.add_ended("default", notes[start : start + args.batch], time.time(), cap, 600)
    subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
    await queue.close()


def _total(path: str) -> int:
    text = Path(path).read_text(errors="replace")
    found = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
    if found is None:
        raise RuntimeError(f"no totals in {path}")
    return int(found.group(1))


def main() -> None:
    """Parse arguments; run the server and the child; print the counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--index", type=int, default=None, help="recent_index (this tree)")
    parser.add_argument("--mode", default="reliable", choices=("reliable", "fast"))
    parser.add_argument("--no-results", action="store_true")
    parser.add_argument("--python", default=None, help="the interpreter whose blitzq runs")
    parser.add_argument("--functions", type=int, default=0)
    parser.add_argument("--notes", type=int, default=0, help="the index alone: notes written")
    parser.add_argument("--batch", type=int, default=1000, help="--notes: notes a call")
    parser.add_argument("--src", default=None, help="the checkout's src to run (this tree)")
    parser.add_argument("--enqueue", action="store_true", help="count the bulk enqueue instead")
    parser.add_argument("--keep", default=None, help="copy the callgrind dump to this path")
    parser.add_argument("--warm", action="store_true", help="scripts loaded before the zeroing")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(_child(args))
        return
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed")
    workdir = tempfile.mkdtemp(prefix="blitzq-cg-")
    port = _free_port()
    server = subprocess.Popen(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={workdir}/cg.out",
            "redis-server",
            *f"--port {port} --bind 127.0.0.1 --appendonly no --save".split(),
            "",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            probe = subprocess.run(
                ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True
            )
            if probe.stdout.strip() == "PONG":
                break
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("redis-server under callgrind did not start")
            time.sleep(0.2)
        env = dict(os.environ, CG_REDIS_URL=f"redis://127.0.0.1:{port}/0", CG_PID=str(server.pid))
        argv = [args.python or sys.executable, __file__, "--child", "--tasks", str(args.tasks)]
        argv += ["--mode", args.mode] + (["--no-results"] if args.no_results else [])
        argv += ["--enqueue"] if args.enqueue else []
        argv += ["--warm"] if args.warm else []
        if args.index is not None:
            argv += ["--index", str(args.index)]
        if args.notes:
            argv += ["--notes", str(args.notes), "--batch", str(args.batch)]
        if args.python is None:
            src = args.src or str(ROOT / "src")
            env["PYTHONPATH"] = f"{src}{os.pathsep}{env.get('PYTHONPATH', '')}"
        else:
            env.pop("PYTHONPATH", None)
        subprocess.run(argv, env=env, check=True, cwd="/tmp", timeout=1800)
        dumps = sorted(glob.glob(f"{workdir}/cg.out.*"), key=os.path.getmtime)
        if not dumps:
            raise RuntimeError("callgrind wrote no dump")
        total = _total(dumps[-1])
        if args.keep:
            shutil.copyfile(dumps[-1], args.keep)
        if args.notes:
            figures = {"notes": args.notes, "batch": args.batch, "recent_index": args.index}
            figures.update(src=args.src or str(ROOT / "src"), instructions=total)
            print(json.dumps({**figures, "per_note": round(total / args.notes)}))
        else:
            figures = {"tasks": args.tasks, "mode": args.mode, "results": not args.no_results}
            figures.update(phase="enqueue" if args.enqueue else "drain")
            figures.update(recent_index=args.index, python=args.python or sys.executable)
            figures.update(warm=args.warm)
            figures.update(instructions=total, per_task=round(total / args.tasks))
            print(json.dumps(figures))
        if args.functions:
            shown = subprocess.run(
                ["callgrind_annotate", "--inclusive=yes", dumps[-1]],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.splitlines()
            print("\n".join(shown[: args.functions + 25]))
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
