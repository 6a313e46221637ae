"""The round-1 drain against this tree with metrics on and off, paired in one run.

Usage::

    git -C /work/main archive 0ee3fda src | tar -x -C /tmp/round1     # round 1's final tree
    .venv/bin/python bench/drain_vs_round1.py --round1 /tmp/round1/src [--rounds 3] [--tasks 20000]
    .venv/bin/python bench/drain_vs_round1.py --round1 /tmp/round1/src --cells all   # 4 cells

Starts a private ``redis-server`` (``bench.py``'s, never the shared 6379) and runs, each round,
three child processes in a rotating order: round 1's tree (``PYTHONPATH=<round1>``, which has
no metrics), this tree with metrics on (``Worker(metrics_port=0)``) and this tree with them
off. Each child drains ``--tasks`` pre-enqueued no-op tasks (concurrency 100, one in-process
worker; by default reliable mode with results stored, ``--cells`` picks others:
``reliable-results``, ``reliable-none``, ``fast-results``, ``fast-none`` or ``all``, each cell
measured in its own rounds) and prints its tasks/s and the CPU microseconds per task of its
process. Reported: every round, the medians of the per-round ratios (metrics on /
round 1, metrics on / off, of tasks/s and of CPU per task) and the median CPU difference on -
off per task (the cost of metrics), with the load average (the machine is shared).

``python bench/drain_vs_round1.py --child`` is one drain (``N``, ``METRICS=1``, ``MODE``,
``STORE=0|1``, ``REDIS_URL`` from the environment), with whichever blitzq the interpreter imports.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent


async def child() -> None:
    """One drain; prints ``tasks/s CPU-us-per-task``."""
    from blitzq import Queue, Worker

    n = int(os.environ.get("N", "20000"))
    metrics = os.environ.get("METRICS") == "1"
    ns = "pair-" + uuid.uuid4().hex[:8]
    q = Queue(
        redis_url=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        namespace=ns,
        mode=os.environ.get("MODE", "reliable"),  # type: ignore[arg-type]
        store_results=os.environ.get("STORE", "1") == "1",
    )

    @q.task(name="noop")
    async def noop() -> None:
        return None

    for start in range(0, n, 1000):
        await noop.enqueue_many([() for _ in range(min(1000, n - start))])
    kw = {"metrics_port": 0, "ops_host": "127.0.0.1"} if metrics else {}
    w = Worker(q, concurrency=100, block_timeout=0.05, **kw)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    c0 = time.process_time()
    task = asyncio.create_task(w.run())
    while w.processed < n:
        await asyncio.sleep(0.005)
    t1 = time.perf_counter()
    c1 = time.process_time()
    w.stop()
    await task
    r: object = q.broker  # this tree: broker.state.client; round 1: broker.client
    client = r.state.client if hasattr(r, "state") else r.client  # type: ignore[attr-defined]
    keys = [k async for k in client.scan_iter(match="{" + ns + "}*")]
    for i in range(0, len(keys), 500):
        await client.delete(*keys[i : i + 500])
    await q.close()
    print(f"{n / (t1 - t0):.0f} {1e6 * (c1 - c0) / n:.2f}")


#: ``--cells`` names: (mode, results stored).
CELLS = {
    "reliable-results": ("reliable", True),
    "reliable-none": ("reliable", False),
    "fast-results": ("fast", True),
    "fast-none": ("fast", False),
}


def run_side(
    src: Path, metrics: bool, url: str, tasks: int, cell: str = "reliable-results"
) -> tuple[float, float]:
    """One child drain with ``src`` first on ``PYTHONPATH``: ``(tasks/s, CPU us/task)``.

    ``cell`` is a key of :data:`CELLS` (mode and whether results are stored).
    """
    mode, store = CELLS[cell]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env.update(PYTHONPATH=str(src), N=str(tasks), REDIS_URL=url, METRICS="1" if metrics else "0")
    env.update(MODE=mode, STORE="1" if store else "0")
    out = subprocess.run(
        [sys.executable, str(HERE / "drain_vs_round1.py"), "--child"],
        env=env, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    rate, cpu = out.stdout.split()
    return float(rate), float(cpu)


def main() -> None:
    """Parse arguments; a child drain, or the paired rounds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--child", action="store_true", help="one drain (see the docstring)")
    parser.add_argument("--round1", type=Path, help="round 1's src directory")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument(
        "--cells", default="reliable-results", help=f"comma list of {', '.join(CELLS)}, or all"
    )
    args = parser.parse_args()
    if args.child:
        asyncio.run(child())
        return
    if args.round1 is None:
        parser.error("--round1 is required (round 1's src directory)")
    sys.path.insert(0, str(HERE))
    import bench as harness  # the sibling script: its private server

    this = HERE.parent / "src"
    cells = list(CELLS) if args.cells == "all" else args.cells.split(",")
    for cell in cells:
        if cell not in CELLS:
            parser.error(f"unknown cell {cell!r}: choose from {', '.join(CELLS)} or all")
    with harness.private_redis() as url:
        run_side(this, True, url, 2000)  # warm-up
        for cell in cells:
            measure_cell(cell, args.round1, this, url, args.rounds, args.tasks)


def measure_cell(cell: str, round1: Path, this: Path, url: str, rounds: int, tasks: int) -> None:
    """The paired rounds of one cell (see :data:`CELLS`); prints its summary lines."""
    sides = {"round1": (round1, False), "on": (this, True), "off": (this, False)}
    order = list(sides)
    got: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    loads = [os.getloadavg()[0]]
    for r in range(rounds):
        line = []
        for name in order[r % 3 :] + order[: r % 3]:
            src, metrics = sides[name]
            got[name].append(run_side(src, metrics, url, tasks, cell))
        for name in sides:
            rate, cpu = got[name][-1]
            line.append(f"{name} {rate:,.0f}/s {cpu:.2f} us")
        loads.append(os.getloadavg()[0])
        print(f"  {cell} round {r + 1}: " + ", ".join(line), file=sys.stderr)
    med = statistics.median

    def ratio(a: str, b: str, i: int) -> float:
        return med(x[i] / y[i] for x, y in zip(got[a], got[b], strict=True))

    cpu = {name: med(c for _, c in got[name]) for name in sides}
    diff = med(on[1] - off[1] for on, off in zip(got["on"], got["off"], strict=True))
    mode, store = CELLS[cell]
    stored = "results stored" if store else "no results"
    print(f"drain {tasks:,} no-op, {mode}, {stored}, c=100, {rounds} rounds")
    print(f"load average (1 min) during the run: {min(loads):.1f} - {max(loads):.1f}")
    print(f"tasks/s, median of per-round ratios: on/round1 {ratio('on', 'round1', 0):.3f}, "
          f"on/off {ratio('on', 'off', 0):.3f}")  # fmt: skip
    print(f"CPU us/task, medians: round1 {cpu['round1']:.2f}, on {cpu['on']:.2f}, "
          f"off {cpu['off']:.2f}; on/off ratio {ratio('on', 'off', 1):.3f}, "
          f"on - off {diff:+.2f} us/task")  # fmt: skip


if __name__ == "__main__":
    main()
