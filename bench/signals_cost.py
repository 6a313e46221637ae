"""What the signals cost a worker's per-delivery path: ``Admission.start`` timed alone.

Usage::

    git -C /work/main archive <commit> src | tar -x -C /tmp/before   # a tree to compare with
    .venv/bin/python bench/signals_cost.py --before /tmp/before/src [--rounds 9] [--n 50000]

Each round runs child processes in a rotating order: the ``--before`` tree, this tree with no
signal handler, and this tree with one ``TASK_RECEIVED`` handler (a no-op function). Each
child decodes and admits ``--n`` deliveries of a task without start checks through the
worker's real :class:`~blitzq.worker.admission.Admission` (its runner replaced by a stub whose
``run`` does nothing: no broker, no task body), giving the event loop a turn every
:data:`BATCH` deliveries as a fetch loop does (the handlers' tasks run then, and count), and
prints the CPU nanoseconds per delivery of
the best of 5 passes. Reported: each round, and the medians of the per-round ratios. The
drain as a whole is ``bench/drain_vs_round1.py``'s (on a busy machine its rounds swing by more
than this path's whole cost; this measures the path the change touched).

``python bench/signals_cost.py --child`` is one measurement (``N``, ``HANDLER=0|1`` from the
environment), with whichever blitzq the interpreter imports.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

#: Deliveries admitted between two turns of the event loop (a fetch batch).
BATCH = 500


def child() -> None:
    """One measurement, printed as ``ns_per_delivery``."""
    from blitzq import Queue
    from blitzq.broker import Delivery
    from blitzq.extensions.registry import extensions_of
    from blitzq.serialization import Envelope, encode_envelope
    from blitzq.worker.admission import Admission

    n = int(os.environ.get("N", "50000"))
    queue = Queue(name="bench", redis_url="redis://127.0.0.1:1/0")

    @queue.task(name="bench.noop")
    async def noop() -> None:
        return None

    if os.environ.get("HANDLER") == "1":
        from blitzq import Signal

        queue.on(Signal.TASK_RECEIVED)(lambda event: None)
    ran = [0]

    def run(job: Any, slots: Any) -> None:
        ran[0] += 1

    extensions = extensions_of(queue)
    lifecycle = SimpleNamespace(on=False)
    runner = SimpleNamespace(
        ending=None,
        max_message_size=queue.max_message_size,
        lifecycle=lifecycle,
        tasks=queue.tasks,
        start_limit=0,
        started=0,
        run=run,
        extensions=extensions,
        worker_id="bench-worker",
        worker=SimpleNamespace(id="bench-worker"),
    )
    payloads = [
        encode_envelope(Envelope(f"id-{i}", "bench.noop", "bench", []), 1 << 20) for i in range(n)
    ]
    deliveries = [Delivery("bench", None, p, 1) for p in payloads]

    async def measure() -> float:
        admission = Admission(runner)  # type: ignore[arg-type]
        best = float("inf")
        for _ in range(5):
            start = time.process_time_ns()
            for i, d in enumerate(deliveries, 1):
                admission.start(d, None)  # type: ignore[arg-type]
                if i % BATCH == 0:  # a fetch batch: the handlers' tasks (if any) run here
                    await asyncio.sleep(0)
            best = min(best, (time.process_time_ns() - start) / n)
        await queue.signals.drain()
        return best

    print(f"{asyncio.run(measure()):.1f}")


def run_child(pythonpath: str, handler: bool, n: int) -> float:
    """CPU ns per delivery of one child process."""
    env = {**os.environ, "PYTHONPATH": pythonpath, "N": str(n), "HANDLER": "1" if handler else "0"}
    out = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Parse the arguments, run the rounds, print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="src directory of the tree to compare with")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--n", type=int, default=50000)
    parser.add_argument("--child", action="store_true")
    args = parser.parse_args()
    if args.child:
        child()
        return
    if not args.before:
        parser.error("--before is required")
    here = str(Path(__file__).resolve().parent.parent / "src")
    cells = [("before", args.before, False), ("off", here, False), ("handler", here, True)]
    rows: list[dict[str, float]] = []
    for r in range(args.rounds):
        got: dict[str, float] = {}
        order = cells[r % 3 :] + cells[: r % 3]
        for label, path, handler in order:
            got[label] = run_child(path, handler, args.n)
        rows.append(got)
        print(
            f"  round {r + 1}: before {got['before']:.0f} ns, off {got['off']:.0f} ns, "
            f"one TASK_RECEIVED handler {got['handler']:.0f} ns",
            file=sys.stderr,
        )
    off = statistics.median(g["off"] / g["before"] for g in rows)
    with_handler = statistics.median(g["handler"] / g["before"] for g in rows)
    print(f"Admission.start per delivery, {args.rounds} rounds, n={args.n}")
    print(f"medians of per-round ratios: off/before {off:.3f}, handler/before {with_handler:.3f}")
    print(
        "median ns: before {:.0f}, off {:.0f}, handler {:.0f}".format(
            *(statistics.median(g[k] for g in rows) for k in ("before", "off", "handler"))
        )
    )


if __name__ == "__main__":
    main()
