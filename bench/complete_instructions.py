"""The server's instructions per completion of ``complete.lua`` alone, in fixed batches,
counted by callgrind: two source trees alternated on one private ``redis-server``.

Usage::

    .venv/bin/python bench/complete_instructions.py BEFORE_SRC AFTER_SRC [--tasks 2000]
        [--batch 100] [--rounds 3] [--failures 0] [--record 90] [--id-chars 0]

Each run (a child process with that tree's ``src`` first on ``sys.path``, one per tree and
round, alternated) starts from ``FLUSHALL`` and ``SCRIPT FLUSH`` (the Lua heap left by the other
tree's scripts moves the counts by a few percent otherwise), publishes ``--tasks`` + 1 messages
to a reliable queue, fetches them, completes one (the script loaded), zeroes the counters
(``callgrind_control -z``), completes the rest in batches of ``--batch`` plain successes
(records of ``--record`` bytes, one hour; task ids ``t<i>``, or of ``--id-chars`` characters;
every ``--failures``-th one counted as a failed run where the tree counts runs), and dumps
the counters. Printed per run: the tree, the instructions and
the instructions per completion. The server runs with ``--hz 1`` so that its timers add
little. Unlike a drain (``server_instructions.py``), the batches do not vary run to run.
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


async def _child(tasks: int, batch: int, failures: int, record: int, id_chars: int) -> None:
    from blitzq import Queue
    from blitzq.broker import Completion
    from blitzq.serialization import Envelope, encode_envelope

    pid = os.environ["CG_PID"]
    queue = Queue(name="default", redis_url=os.environ["CG_REDIS_URL"], namespace="cg")
    broker = queue.broker
    await broker.prepare_consumer(["default"], "c1")
    messages = [
        encode_envelope(Envelope(_id(i, id_chars), "noop", "default", []), 1 << 20)
        for i in range(tasks + 1)
    ]
    await broker.publish("default", messages)
    deliveries = []
    while len(deliveries) < tasks + 1:
        deliveries += await broker.fetch("default", batch, 0)
    first = deliveries.pop()
    await broker.complete([Completion("default", first.token, "warm", b"x" * 90, 3600)])
    counts = getattr(broker.state, "counts", None)  # a tree that counts runs with them
    batches = []
    for start in range(0, tasks, batch):
        part = []
        for j, d in enumerate(deliveries[start : start + batch]):
            c = Completion("default", d.token, _id(start + j, id_chars), b"x" * record, 3600)
            if counts is not None and counts(c):
                c.tally = 2 if failures and (start + j) % failures == 0 else 1
            part.append(c)
        batches.append(part)
    subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
    for part in batches:
        assert await broker.complete(part) == []
    subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
    await queue.close()


def _id(i: int, chars: int) -> str:
    """Task id ``i``: ``t<i>``, or ``t`` and ``i`` padded to ``chars`` characters in all (a
    generated id has 24: the record key's length, hashed by the server's Lua, is a real
    one's)."""
    return f"t{i:0{chars - 1}d}" if chars > 1 else f"t{i}"


def _total(path: str) -> int:
    found = re.search(r"^(?:summary|totals):\s*(\d+)", Path(path).read_text(), re.M)
    if found is None:
        raise RuntimeError(f"no totals in {path}")
    return int(found.group(1))


def main() -> None:
    """Run the alternated measurement (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", help="the src directories to compare")
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--failures", type=int, default=0, help="every n-th run failed")
    parser.add_argument("--record", type=int, default=90, help="bytes of each record")
    parser.add_argument("--id-chars", type=int, default=0, help="task ids of this length")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        asyncio.run(_child(args.tasks, args.batch, args.failures, args.record, args.id_chars))
        return
    workdir = tempfile.mkdtemp(prefix="blitzq-cgc-")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={workdir}/cg.out"]
    options = ["--port", str(port), "--bind", "127.0.0.1", "--appendonly", "no", "--save", ""]
    server = subprocess.Popen(
        [*valgrind, "redis-server", *options, "--hz", "1", "--dir", workdir],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cli = ["redis-cli", "-p", str(port)]
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([*cli, "ping"], capture_output=True, text=True).stdout != "PONG\n":
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("redis-server under callgrind did not start")
            time.sleep(0.2)
        for _ in range(args.rounds):
            for tree in args.trees:
                subprocess.run([*cli, "flushall"], check=True, capture_output=True)
                subprocess.run([*cli, "script", "flush"], check=True, capture_output=True)
                env = dict(os.environ, CG_REDIS_URL=f"redis://127.0.0.1:{port}/0")
                env.update(CG_PID=str(server.pid), PYTHONPATH=os.path.abspath(tree))
                argv = [sys.executable, os.path.abspath(__file__), "--child"]
                argv += ["--tasks", str(args.tasks), "--batch", str(args.batch)]
                argv += ["--failures", str(args.failures), "--record", str(args.record)]
                argv += ["--id-chars", str(args.id_chars)]
                subprocess.run(argv, env=env, check=True, cwd="/tmp", timeout=1800)
                dump = sorted(glob.glob(f"{workdir}/cg.out.*"), key=os.path.getmtime)[-1]
                total = _total(dump)
                figures = {"tree": tree, "batch": args.batch, "instructions": total}
                print(json.dumps({**figures, "per_task": round(total / args.tasks)}), flush=True)
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
