"""Issue 29's new rows for ``bench/targets.py``: fast mode against reliable, the idle worker's
memory, start-up, and Redis memory per queued message.

* ``fast / reliable drain``: the same drain in fast mode and in reliable mode of this tree,
  each side a fresh process, the order alternating pair by pair: no-op tasks
  (``bench.drain_measured``: one ``Worker(concurrency=200)``) and ``bench/drain_incr.py``'s
  INCR body at concurrency 10, results stored and not. Ratio: fast tasks/s over reliable
  tasks/s of the same pair; goal >= 1.2.
* ``idle worker RSS``: ``blitzq worker MODULE:ATTR --no-supervise`` (a one-task app in a
  temporary directory) left idle for 3 s once it has logged its start, its ``VmRSS`` (bytecode
  cached, as for ``start-up``); beside it a bare ``redis.asyncio`` process (what the client
  library alone costs). Goal <= 35 MB (an absolute figure: memory does not depend on the
  machine's load).
* ``start-up``: the CPU time (user + system, of the child: steady under load, unlike the wall
  clock) of ``python -c "import blitzq"`` and of ``blitzq --help`` over that of
  ``python -c pass``, paired run by run, with bytecode cached and in a directory with no
  project file (see :func:`start_up`); goal <= 1.5.
* ``Redis memory per queued no-argument message``: ``bench.memory_blitzq``, both modes, and
  beside it the mean over task names of :data:`SWEEP` lengths (a stream's cost steps up at
  some value sizes); goal <= 80 bytes.
* ``server CPU per task``: ``../shared/bench-anchor/server_cost.py`` (20,000 no-op tasks
  enqueued in bulk, then drained by one ``Worker(concurrency=200)``, reliable, results
  stored; the private server's ``used_cpu_user + used_cpu_sys`` per task over the drain)
  under this tree beside the same script under blitzq 1.1.0 (the anchor venv), the order
  alternating pair by pair. Ratio: this tree's drain CPU per task over 1.1.0's; goal <= 0.5.
  The enqueue phase's ratio is printed beside it (goal: no worse than 1.1.0's, <= 1.0).
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench as harness  # noqa: E402  (the sibling script: its drains and memory rows)

_NOOP_CHILD = """
import asyncio, json, os, sys
sys.path.insert(0, %r)
import bench as harness
import redis.asyncio as aioredis
url = os.environ["BARS_REDIS_URL"]
mode, n, store = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
async def one():
    client = aioredis.Redis.from_url(url)
    try:
        return await harness.drain_measured(url, client, mode, store, n)
    finally:
        await client.aclose()
rate, cpu = asyncio.run(one())
print(json.dumps({"drain_per_s": rate, "cpu_us_per_task": cpu / n * 1e6}))
"""

_APP = """
from blitzq import Queue
queue = Queue(name="default", redis_url=%r, namespace="r3rss")

@queue.task
async def noop() -> None:
    return None
"""


def _env(url: str) -> dict[str, str]:
    env = dict(os.environ, BARS_REDIS_URL=url)
    env["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return env


def _json_of(argv: list[str], url: str) -> dict[str, Any]:
    done = subprocess.run(
        argv, env=_env(url), capture_output=True, text=True, timeout=600, check=False
    )
    for line in reversed(done.stdout.strip().splitlines()):
        if line.startswith("{"):
            figures: dict[str, Any] = json.loads(line)
            return figures
    raise RuntimeError(f"{argv[1]} failed: {done.stderr[-2000:]}")


#: ``../shared/bench-anchor/server_cost.py`` (of the main checkout, or one level further up).
SERVER_COST = next(
    (
        p / "shared" / "bench-anchor" / "server_cost.py"
        for p in (ROOT.parent, ROOT.parent.parent)
        if (p / "shared" / "bench-anchor" / "server_cost.py").exists()
    ),
    ROOT.parent / "shared" / "bench-anchor" / "server_cost.py",
)


def server_cost(url: str, pairs: int, anchor_python: Path, n: int = 20000) -> list[Any]:
    """The server's CPU per task of a reliable drain with results, this tree over blitzq
    1.1.0 (``server_cost.py`` under each, alternating), and the enqueue phase's beside it."""
    from targets import Line

    drain = Line(
        "server CPU per task, reliable drain with results (server_cost.py)",
        "blitzq 1.1.0, same run",
        "<= 0.5",
    )
    enqueue = Line(
        "server CPU per task, bulk enqueue (server_cost.py)", "blitzq 1.1.0, same run", "<= 1.0"
    )
    if not SERVER_COST.exists() or not anchor_python.exists():
        drain.note = f"skipped: no {SERVER_COST} or no blitzq 1.1.0 venv ({anchor_python})"
        return [drain]
    ours_us: list[float] = []
    for i in range(pairs):
        got: dict[str, dict[str, Any]] = {}
        for side in ("ours", "anchor") if i % 2 == 0 else ("anchor", "ours"):
            python = sys.executable if side == "ours" else str(anchor_python)
            argv = [python, str(SERVER_COST), "reliable", str(n), "200", "1"]
            env = _env(url)
            if side == "anchor":
                env.pop("PYTHONPATH", None)
            done = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=600, check=False, cwd="/tmp"
            )
            lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
            if not lines:
                raise RuntimeError(f"server_cost.py ({side}) failed: {done.stderr[-2000:]}")
            got[side] = json.loads(lines[-1])
        ours, anchor = got["ours"], got["anchor"]
        ours_us.append(ours["drain_server_us_per_task"])
        drain.ratios.append(ours["drain_server_us_per_task"] / anchor["drain_server_us_per_task"])
        enqueue.ratios.append(
            ours["enqueue_server_us_per_task"] / anchor["enqueue_server_us_per_task"]
        )
        print(
            f"server cost pair {i + 1}: drain {ours['drain_server_us_per_task']:.2f} / "
            f"{anchor['drain_server_us_per_task']:.2f} us, commands "
            f"{ours['drain_cmds_per_task']:.3f} / {anchor['drain_cmds_per_task']:.3f} a task",
            file=sys.stderr,
        )
    drain.passed = statistics.median(drain.ratios) <= 0.5
    drain.note = f"this tree {statistics.median(ours_us):.2f} us a task"
    enqueue.passed = statistics.median(enqueue.ratios) <= 1.0
    return [drain, enqueue]


def fast_over_reliable(url: str, pairs: int, noop_n: int = 20000, incr_n: int = 10000) -> list[Any]:
    """The four ``fast / reliable`` rows (``targets.Line`` values)."""
    from targets import Line

    cases = [
        ("no-op, c=200, results stored", "noop", True),
        ("no-op, c=200, no results", "noop", False),
        ("INCR body, c=10, results stored", "incr", True),
        ("INCR body, c=10, no results", "incr", False),
    ]
    lines = []
    for name, body, store in cases:
        line = Line(f"fast-mode drain, {name}", "reliable drain of this tree, same run", ">= 1.2")
        cpu: list[float] = []
        for i in range(pairs):
            got: dict[str, dict[str, Any]] = {}
            for mode in ("fast", "reliable") if i % 2 else ("reliable", "fast"):
                if body == "noop":
                    code = _NOOP_CHILD % str(HERE)
                    argv = [sys.executable, "-c", code, mode, str(noop_n), "1" if store else "0"]
                else:
                    script = str(HERE / "drain_incr.py")
                    argv = [sys.executable, script, mode, str(incr_n), "10", "1" if store else "0"]
                got[mode] = _json_of(argv, url)
            line.ratios.append(got["fast"]["drain_per_s"] / got["reliable"]["drain_per_s"])
            cpu.append(got["fast"]["cpu_us_per_task"] / got["reliable"]["cpu_us_per_task"])
            print(f"{line.target} pair {i + 1}: {line.ratios[-1]:.2f}", file=sys.stderr)
        line.passed = statistics.median(line.ratios) >= 1.2
        line.note = f"CPU per task fast/reliable {statistics.median(cpu):.2f}"
        lines.append(line)
    return lines


def _vmrss_mb(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _idle_rss(
    argv: list[str],
    cwd: str,
    url: str,
    idle: float = 3.0,
    started: str | None = None,
    pycache: str | None = None,
) -> float:
    """VmRSS (MB) of ``argv`` ``idle`` seconds after it logged a line containing ``started``
    (after its start when ``None``); the process is then terminated. On a loaded machine a
    worker takes more than 3 s to start: a fixed wait measured it half started. With
    ``pycache``, bytecode is cached there (``PYTHONPYCACHEPREFIX``), as an installed package
    has its ``.pyc`` files: compiling blitzq's sources at each start (this machine sets
    ``PYTHONDONTWRITEBYTECODE``) leaves about 1 MB more resident."""
    env = _env(url)
    env["PYTHONPATH"] = f"{cwd}{os.pathsep}{env['PYTHONPATH']}"
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        if started is not None and proc.stderr is not None:
            for line in proc.stderr:  # a worker logs its start once its loops run
                if started in line:
                    break
        time.sleep(idle)
        if proc.poll() is not None:
            raise RuntimeError(
                f"{argv} exited: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
            )
        return _vmrss_mb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def idle_worker_rss(url: str, pairs: int) -> list[Any]:
    """The idle ``blitzq worker`` row, with a bare ``redis.asyncio`` process beside it."""
    from targets import Line

    line = Line("idle worker RSS (blitzq worker app:queue --no-supervise)", "-", "<= 35 MB")
    blitzq = str(Path(sys.executable).with_name("blitzq"))
    worker, bare = [], []
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "r3app.py").write_text(_APP % url)
        argv = [blitzq, "worker", "r3app:queue", "--no-supervise"]
        pycache = str(Path(tmp, "pyc"))
        _idle_rss(argv, tmp, url, idle=0.0, started=" started: ", pycache=pycache)  # writes it
        for _ in range(pairs):
            worker.append(_idle_rss(argv, tmp, url, started=" started: ", pycache=pycache))
            code = "import redis.asyncio, time; time.sleep(60)"
            bare.append(_idle_rss([sys.executable, "-c", code], tmp, url, pycache=pycache))
    mb, bare_mb = statistics.median(worker), statistics.median(bare)
    line.measured = f"{mb:.1f} MB"
    line.passed = mb <= 35
    line.note = f"a bare `import redis.asyncio` process: {bare_mb:.1f} MB"
    return [line]


def _cpu_of(argv: list[str], env: dict[str, str], cwd: str) -> float:
    """User + system CPU seconds of one run of ``argv`` (a child of this process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, env=env, cwd=cwd, capture_output=True, timeout=120, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def start_up(pairs: int, runs: int = 5) -> list[Any]:
    """``import blitzq`` and ``blitzq --help`` against ``python -c pass`` (CPU time).

    Every child runs with bytecode caching on (``PYTHONPYCACHEPREFIX`` in a temporary
    directory, one warm-up run first), as an installed package has its ``.pyc`` files: with
    ``PYTHONDONTWRITEBYTECODE`` set, each start would compile blitzq's sources. The children
    run in an empty directory (no ``pyproject.toml`` above it: ``blitzq --help`` prints the
    generated help, :func:`blitzq.cli.fast_help`); ``blitzq --help`` in this repository
    (its ``pyproject.toml`` names blitzq but holds no ``[tool.blitzq]`` table: it is
    scanned, :func:`blitzq._project.may_hold_table`, not parsed, before the generated help
    is printed) is measured beside it, as a note.
    """
    from targets import Line

    blitzq = str(Path(sys.executable).with_name("blitzq"))
    sides = {
        "import blitzq": [sys.executable, "-c", "import blitzq"],
        "blitzq --help": [blitzq, "--help"],
    }
    floor_argv = [sys.executable, "-c", "pass"]
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp, "empty")
        empty.mkdir()
        (empty / ".git").mkdir()  # the project-file search ends here
        env = _env("")
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp, "pyc"))
        for argv in (*sides.values(), floor_argv):
            _cpu_of(argv, env, str(empty))  # warm-up: writes the bytecode
            _cpu_of(argv, env, str(ROOT))
        for name, argv in sides.items():
            line = Line(f"start-up: {name}", "python -c pass, same run (CPU time)", "<= 1.5")
            in_project: list[float] = []
            for _ in range(pairs):
                ours = sum(_cpu_of(argv, env, str(empty)) for _ in range(runs))
                floor = sum(_cpu_of(floor_argv, env, str(empty)) for _ in range(runs))
                line.ratios.append(ours / max(floor, 1e-3))
                if name == "blitzq --help":
                    slow = sum(_cpu_of(argv, env, str(ROOT)) for _ in range(runs))
                    in_project.append(slow / max(floor, 1e-3))
            line.passed = statistics.median(line.ratios) <= 1.5
            if in_project:
                line.note = (
                    f"in this repository (its pyproject.toml looked at first): "
                    f"{statistics.median(in_project):.2f}"
                )
            lines.append(line)
    return lines


#: Task-name lengths of the sweep in :func:`bytes_per_message`: messages of 60 to 71 bytes
#: on the queue ``default`` (``bench.py``'s ``bench.noop`` is 10 characters).
SWEEP = range(4, 16)


async def _bytes_for_name(url: str, client: aioredis.Redis, mode: str, name: str, n: int) -> float:
    """Redis bytes per queued no-argument message of a task called ``name`` (``n`` messages)."""
    from blitzq import Queue

    namespace = harness.new_namespace("r3sweep")
    queue = Queue(harness.QUEUE, redis_url=url, namespace=namespace, mode=mode)

    async def noop() -> None:
        return None

    task = queue.task(name=name)(noop)
    try:
        before = await harness._used_memory(client)
        for start in range(0, n, harness.BATCH):
            await task.enqueue_many([()] * min(harness.BATCH, n - start))
        return (await harness._used_memory(client) - before) / n
    finally:
        await queue.close()
        await harness.delete_matching(client, "{" + namespace + "}:*")


def bytes_per_message(url: str, n: int = 100_000, sweep_n: int = 20_000) -> list[Any]:
    """Redis memory per queued no-argument message, both modes (``bench.memory_blitzq``), and
    its mean over task names of :data:`SWEEP` lengths: a stream entry's cost steps up by about
    18 bytes at some value sizes (a listpack node that overshoots 4,096 bytes on its last entry
    is held in a 5 KiB allocation; bench/README.md), so one size alone can mislead."""
    from targets import Line

    async def both() -> list[Any]:
        client = aioredis.Redis.from_url(url)
        out = []
        try:
            for mode in ("reliable", "fast"):
                per, size = await harness.memory_blitzq(url, client, mode, n)
                swept = [
                    await _bytes_for_name(url, client, mode, "t" * length, sweep_n)
                    for length in SWEEP
                ]
                line = Line(f"Redis bytes per queued no-arg message, {mode}", "-", "<= 80 B")
                line.measured = f"{per:.1f} B"
                line.passed = per <= 80
                line.note = (
                    f"the message itself {size} B; over messages of {size - 6}-{size + 5} B "
                    f"(task names of {SWEEP[0]}-{SWEEP[-1]} characters): mean "
                    f"{statistics.mean(swept):.1f} B, {min(swept):.1f}-{max(swept):.1f}"
                )
                out.append(line)
        finally:
            await client.aclose()
        return out

    return asyncio.run(both())
