"""The round trip of two trees and of the floor, interleaved: is a change faster per trip?

Starts a private ``redis-server`` (``bench.py``'s) and runs, ``--rounds`` times in a
rotating order, ``round_trip_one.py`` under each tree given with ``--src`` (its
``PYTHONPATH``; this tree's ``src`` by default) and ``round_trip_floor.py`` (two bare
processes, no queue), ``--trips`` timed trips each after 30 warm-ups. Prints, per round and
as medians: p50 and p99, each tree's p50 over the floor's of the same round, and the CPU
time per trip of the producer and of the worker process (``/proc`` times: steadier than
the clock on a loaded machine, though not steady; instruction counts are, see
``bench/README.md``). The first ``--src`` is the "before" of the ratios printed last.

Usage: ``python bench/round_trip_trees.py --src /work/main/src --src src --rounds 9``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench as harness  # noqa: E402  (the sibling script: its private server)

ONE = HERE / "round_trip_one.py"
FLOOR = HERE / "round_trip_floor.py"


def run_once(script: Path, url: str, src: str | None, trips: int) -> dict[str, float]:
    """The JSON figures of one run of ``script`` (with ``src`` on ``PYTHONPATH``).

    Raises:
        RuntimeError: the script failed or printed no figures.
    """
    env = dict(os.environ, BARS_REDIS_URL=url)
    env.pop("PYTHONPATH", None)
    if src is not None:
        env["PYTHONPATH"] = src
    done = subprocess.run(
        [sys.executable, str(script), str(trips), "30"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd="/tmp",
    )
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            figures: dict[str, float] = json.loads(line)
            return figures
    raise RuntimeError(f"{script.name} failed: {done.stderr[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", action="append", help="a tree's src directory (repeat)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--trips", type=int, default=1000)
    args = parser.parse_args()
    trees = [str(Path(s).resolve()) for s in (args.src or [str(HERE.parent / "src")])]
    names = [f"tree{i + 1}" for i in range(len(trees))]
    for name, tree in zip(names, trees, strict=True):
        print(f"{name}: {tree}", file=sys.stderr)
    sides: list[tuple[str, Path, str | None]] = [
        (name, ONE, src) for name, src in zip(names, trees, strict=True)
    ]
    sides.append(("floor", FLOOR, None))
    got: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in sides}
    with harness.private_redis() as url:
        for i in range(args.rounds):
            shift = i % len(sides)
            for name, script, path in sides[shift:] + sides[:shift]:
                got[name].append(run_once(script, url, path, args.trips))
            row = "  ".join(
                f"{name} {got[name][-1]['p50_ms']:.3f}"
                + (
                    f" ({got[name][-1]['p50_ms'] / got['floor'][-1]['p50_ms']:.2f}x floor, "
                    f"CPU us/trip producer {got[name][-1]['producer_cpu_us']:.0f} "
                    f"worker {got[name][-1]['worker_cpu_us']:.0f})"
                )
                for name, _, _ in sides
            )
            print(f"round {i + 1}: p50 ms {row}; load {os.getloadavg()[0]:.1f}", flush=True)

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in got[name])

    def ratio(a: str, b: str, key: str) -> float:
        return statistics.median(x[key] / y[key] for x, y in zip(got[a], got[b], strict=True))

    print(
        "\n| side | p50 ms | p99 ms | p50 / floor (median of rounds) | p99 / floor p99 |"
        " producer CPU us/trip | worker CPU us/trip |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, _, _ in sides:
        cells = [f"{med(name, 'p50_ms'):.3f}", f"{med(name, 'p99_ms'):.3f}"]
        cells += [
            f"{ratio(name, 'floor', 'p50_ms'):.2f}",
            f"{med(name, 'p99_ms') / med('floor', 'p99_ms'):.2f}",
            f"{med(name, 'producer_cpu_us'):.0f}",
            f"{med(name, 'worker_cpu_us'):.0f}",
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if len(names) > 1:
        last, first = names[-1], names[0]
        print(
            f"\n{last} / {first}, medians of per-round ratios: p50 "
            f"{ratio(last, first, 'p50_ms'):.2f}, producer CPU "
            f"{ratio(last, first, 'producer_cpu_us'):.2f}, worker CPU "
            f"{ratio(last, first, 'worker_cpu_us'):.2f}"
        )


if __name__ == "__main__":
    main()
