"""Issues 13 and 29's targets in one run: each as the median of paired ratios, with PASS/MISS.

Starts a private ``redis-server`` (``bench.py``'s) and measures, in pairs whose order
alternates (A B, B A, ...):

* ``round trip p50``: ``bench/round_trip_one.py`` (enqueue one no-op task, a worker in a
  second process runs it, the producer awaits the result; 300 trips after 30 warm-ups) under
  this tree, beside the same file under blitzq 1.1.0 (the venv that
  ``../shared/bench-anchor/compare.sh`` makes under ``/tmp/blitzq-bench-anchor``, Python >=
  3.12). Ratio: this tree's p50 / blitzq 1.1.0's p50 of the same pair; goal <= 0.5. Without
  that venv the row is skipped with a note (``--make-anchor`` makes it). Beside them, in
  the same rotation, ``bench/round_trip_floor.py``: the same trip by two bare processes with
  no queue (one pipelined ``XADD`` + ``BLPOP``, ``XREADGROUP`` + ``LPUSH``), a reference row
  (this tree's p50 / the floor's, the floor being the faster of two runs of it) that says
  how much of the trip the machine itself costs.
* ``enqueue one at a time``: ``await task.enqueue()`` of a no-argument task (reliable mode,
  5,000 calls) beside redis-py's own loop doing one awaited ``XADD`` per call with a freshly
  encoded message of the same size, on a ``redis.asyncio`` client of the same kind (a pooled
  TCP connection, hiredis parser) to the same server; the two sides alternate in 50 slices
  within each pair. Ratio: blitzq's calls/s / redis-py's; goal >= 0.9.
* the drain rows, when ``bench/ceiling_ratio.py`` is there: that script is run on the same
  server (``--redis-url``) and its rows are added to the summary.
* issue 29's rows (``bench/round3.py``): fast-mode drain over the reliable drain of this
  tree (no-op and INCR bodies, results stored and not; goal >= 1.2), the idle ``blitzq
  worker``'s RSS (<= 35 MB), ``import blitzq`` and ``blitzq --help`` over ``python -c pass``
  in CPU time (<= 1.5), Redis bytes per queued no-argument message (<= 80), and the
  server's CPU per task of a reliable drain with results over blitzq 1.1.0's (<= 0.5,
  ``../shared/bench-anchor/server_cost.py``).

Absolute round-trip times mean something only on an idle machine: the load average is printed
beside them. Prints the summary table (target, measured ratio, reference, goal, PASS/MISS,
the ratios of every pair) to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis.asyncio as aioredis

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench as harness  # noqa: E402  (the sibling script: its private server and loops)
import round3  # noqa: E402  (issue 29's rows)

ANCHOR_VENV = Path(os.environ.get("BENCH_HOME", "/tmp/blitzq-bench-anchor")) / "anchor"
ANCHOR_PYTHON = ANCHOR_VENV / "bin" / "python"
ROUND_TRIP = HERE / "round_trip_one.py"
FLOOR = HERE / "round_trip_floor.py"
DRAIN_SCRIPT = HERE / "ceiling_ratio.py"


@dataclass
class Line:
    """One row of the summary.

    Attributes:
        target: what is measured.
        reference: what it is compared with.
        goal: the ratio to reach, as text (``<= 0.5``, ``>= 0.9``).
        ratios: the per-pair ratios (empty: skipped, see ``note``).
        passed: whether the median of ``ratios`` meets the goal (``None``: skipped).
        note: why skipped, or the absolute figures.
    """

    target: str
    reference: str
    goal: str
    ratios: list[float] = field(default_factory=list)
    passed: bool | None = None
    note: str = ""
    measured: str = ""
    verdict: str = ""

    def cells(self) -> list[str]:
        """Markdown cells of the row."""
        verdict = self.verdict or (
            "skipped" if self.passed is None else "PASS" if self.passed else "MISS"
        )
        each = ", ".join(f"{r:.2f}" for r in self.ratios)
        measured = self.measured or (
            f"{statistics.median(self.ratios):.2f}" if self.ratios else "-"
        )
        detail = "; ".join(x for x in (each, self.note) if x)
        return [self.target, measured, self.reference, self.goal, verdict, detail]


def _env(url: str, project: bool) -> dict[str, str]:
    env = dict(os.environ, BARS_REDIS_URL=url)
    if project:
        env["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    else:
        env.pop("PYTHONPATH", None)
    return env


def round_trip_once(
    python: str, url: str, project: bool, trips: int, script: Path = ROUND_TRIP
) -> dict[str, float]:
    """p50/p99 (ms) of one run of ``script`` (``round_trip_one.py``) with ``python``.

    Raises:
        RuntimeError: the child failed or printed no figures.
    """
    done = subprocess.run(
        [python, str(script), str(trips)],
        env=_env(url, project),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd="/tmp",  # the anchor must not import this tree's blitzq from the working directory
    )
    for line in reversed(done.stdout.strip().splitlines()):
        if line.startswith("{"):
            figures: dict[str, float] = json.loads(line)
            return figures
    raise RuntimeError(f"{script.name} failed: {done.stderr[-2000:]}")


def measure_round_trip(url: str, pairs: int, trips: int) -> list[Line]:
    """The round-trip rows: this tree against blitzq 1.1.0 (the target), and against the
    floor of ``round_trip_floor.py`` (two processes, no queue: a reference), ``pairs``
    rounds whose order rotates."""
    line = Line("round trip p50 (worker in a 2nd process)", "blitzq 1.1.0, same run", "<= 0.5")
    floor_line = Line(
        "the same round trip p50",
        "the floor: XADD + BLPOP, XREADGROUP + LPUSH, no queue (round_trip_floor.py)",
        "-",
        verdict="-",
    )
    ours: list[dict[str, float]] = []
    floors: list[dict[str, float]] = []
    have_anchor = ANCHOR_PYTHON.exists()
    if not have_anchor:
        line.note = (
            f"blitzq 1.1.0 skipped: no venv at {ANCHOR_VENV} (Python >= 3.12; "
            "--make-anchor or ../shared/bench-anchor/compare.sh makes it)"
        )
    for i in range(pairs):
        sides = [
            ("ours", sys.executable, ROUND_TRIP, True),
            ("floor", sys.executable, FLOOR, False),
        ]
        if have_anchor:
            sides.append(("anchor", str(ANCHOR_PYTHON), ROUND_TRIP, False))
        shift = i % len(sides)
        sides = sides[shift:] + sides[:shift]
        got = {
            name: round_trip_once(py, url, project, trips, script)
            for name, py, script, project in sides
        }
        # The floor is bimodal on this VM (0.5 or 1.4 ms by how the scheduler places the
        # three processes, run by run): a floor is the faster of two runs.
        again = round_trip_once(sys.executable, url, False, trips, FLOOR)
        if again["p50_ms"] < got["floor"]["p50_ms"]:
            got["floor"] = again
        ours.append(got["ours"])
        floors.append(got["floor"])
        floor_line.ratios.append(got["ours"]["p50_ms"] / got["floor"]["p50_ms"])
        text = f"pair {i + 1}: round trip p50 {got['ours']['p50_ms']:.3f} ms"
        if have_anchor:
            line.ratios.append(got["ours"]["p50_ms"] / got["anchor"]["p50_ms"])
            text += f" / {got['anchor']['p50_ms']:.3f} ms (blitzq 1.1.0)"
        print(f"{text}; floor {got['floor']['p50_ms']:.3f} ms", file=sys.stderr)
    if have_anchor:
        line.passed = statistics.median(line.ratios) <= 0.5

    def medians(runs: list[dict[str, float]]) -> tuple[float, float]:
        return (
            statistics.median(r["p50_ms"] for r in runs),
            statistics.median(r["p99_ms"] for r in runs),
        )

    (p50, p99), (floor_p50, floor_p99) = medians(ours), medians(floors)
    absolute = (
        f"this tree p50 {p50:.3f} ms, p99 {p99:.3f} ms; the floor p50 {floor_p50:.3f} ms, "
        f"p99 {floor_p99:.3f} ms (medians of runs; load average {os.getloadavg()[0]:.2f}: "
        "absolute figures only when idle)"
    )
    line.note = "; ".join(x for x in (line.note, absolute) if x)
    return [line, floor_line]


def _payload() -> bytes:
    """The reference's message: a no-argument envelope like blitzq's (same fields and size),
    its id made the way blitzq makes one (``os.urandom(16).hex()``), encoded with msgspec."""
    now = time.time()
    env = harness.RawEnvelope(
        os.urandom(16).hex(),
        harness.TASK_NAME,
        harness.QUEUE,
        [],
        {},
        1,
        now,
        now,
        None,
        None,
        None,
    )
    return harness._ENCODER.encode(env)


async def _enqueue_pairs(url: str, pairs: int, n: int) -> list[float]:
    """Per pair: ``n`` calls of each side in 50 interleaved slices (A B A B ...), so that a
    change of the machine's load during the pair hits both sides alike."""
    client = aioredis.Redis.from_url(url)
    ratios = []
    slices, part = 50, max(1, n // 50)
    try:
        for i in range(pairs):
            bench = harness.Bench(url, "reliable", True, "targets-enq")
            key = f"raw-enq-{i}-{os.getpid()}"
            try:
                await bench.task.enqueue()  # connect and register the queue off the clock
                await client.xadd(key, {"m": _payload()})
                ours = raw = 0.0
                for j in range(slices):
                    for side in ("ours", "raw") if (i + j) % 2 == 0 else ("raw", "ours"):
                        t0 = time.perf_counter()
                        if side == "ours":
                            for _ in range(part):
                                await bench.task.enqueue()
                            ours += time.perf_counter() - t0
                        else:
                            for _ in range(part):
                                await client.xadd(key, {"m": _payload()})
                            raw += time.perf_counter() - t0
            finally:
                await client.delete(key)
                await bench.close(client)
            ratios.append(raw / ours)  # calls/s of ours over calls/s of raw
            calls = slices * part
            print(
                f"pair {i + 1}: enqueue {calls / ours:,.0f}/s / XADD {calls / raw:,.0f}/s",
                file=sys.stderr,
            )
    finally:
        await client.aclose()
    return ratios


def measure_enqueue(url: str, pairs: int, n: int) -> list[Line]:
    """The one-at-a-time enqueue row against redis-py's one XADD per call."""
    line = Line(
        "one awaited enqueue() at a time, reliable",
        "redis-py, one awaited XADD per call",
        ">= 0.9",
    )
    line.ratios = asyncio.run(_enqueue_pairs(url, pairs, n))
    line.passed = statistics.median(line.ratios) >= 0.9
    return [line]


def measure_drains(url: str, pairs: int) -> list[Line]:
    """The rows of ``bench/ceiling_ratio.py`` (the drain targets), run on the same server."""
    if not DRAIN_SCRIPT.exists():
        return [Line("drain targets", "-", "-", note=f"skipped: {DRAIN_SCRIPT.name} not found")]
    done = subprocess.run(
        [sys.executable, str(DRAIN_SCRIPT), "--redis-url", url, "--pairs", str(pairs)],
        env=_env(url, True),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    sys.stderr.write(done.stderr)
    lines = parse_drain_table(done.stdout)
    if not lines:
        return [Line("drain targets", "-", "-", note=f"no table from {DRAIN_SCRIPT.name}")]
    return lines


def parse_drain_table(text: str) -> list[Line]:
    """Rows of ``ceiling_ratio.py``'s table (``| target | blitzq /s | reference /s | ratio |
    pairs | goal | verdict |``; the target reads ``<what> / <reference>``)."""
    lines = []
    for row in text.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 7 or cells[0] in ("target", "") or set(cells[0]) <= {"-"}:
            continue
        what, _, reference = cells[0].rpartition(" / ")
        verdict = cells[6]
        ratios = []
        for r in cells[4].split(","):
            with contextlib.suppress(ValueError):
                ratios.append(float(r))
        line = Line(what or cells[0], reference or "-", cells[5], ratios)
        line.measured = cells[3]
        line.passed = {"PASS": True, "MISS": False}.get(verdict)
        if line.passed is None:
            line.verdict = verdict or "-"
            if not ratios:
                line.note = cells[4]
        lines.append(line)
    return lines


def render(lines: list[Line]) -> str:
    """The summary table."""
    out = [
        "| target | measured (median of paired ratios) | reference | goal | verdict | pairs |",
        "|---|---:|---|---|---|---|",
    ]
    out += ["| " + " | ".join(line.cells()) + " |" for line in lines]
    return "\n".join(out)


def make_anchor() -> None:
    """Make the blitzq 1.1.0 venv (as ``compare.sh`` does) with a Python >= 3.12 found on
    ``PATH`` or under pyenv, if it is missing; without such a Python say so and go on."""
    if ANCHOR_PYTHON.exists():
        return
    candidates = [shutil.which("python3.12"), shutil.which("python3.13")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(str(p) for p in Path(root).glob("versions/3.1[2-9]*/bin/python3"))
    for python in candidates:
        if python and subprocess.run([python, "--version"], capture_output=True).returncode == 0:
            subprocess.run([python, "-m", "venv", str(ANCHOR_VENV)], check=True)
            pip = str(ANCHOR_VENV / "bin" / "pip")
            subprocess.run([pip, "install", "-q", "blitzq==1.1.0", "hiredis", "redis"], check=True)
            return
    print("no Python >= 3.12 found: the blitzq 1.1.0 rows are skipped", file=sys.stderr)


def main() -> None:
    """Parse arguments, start the private server, measure, print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="pairs per row (default 5)")
    parser.add_argument("--trips", type=int, default=300, help="round trips per run")
    parser.add_argument("--enqueues", type=int, default=5000, help="enqueues per run")
    parser.add_argument(
        "--only",
        help="rows: round-trip, enqueue, drain, fast, server, rss, startup, memory "
        "(comma-separated)",
    )
    parser.add_argument("--make-anchor", action="store_true", help="make the 1.1.0 venv")
    parser.add_argument("--redis-url", help="use this server instead of a private one")
    args = parser.parse_args()
    every = {"round-trip", "enqueue", "drain", "fast", "server", "rss", "startup", "memory"}
    only = set(args.only.split(",")) if args.only else every
    if args.make_anchor:
        make_anchor()
    started = time.perf_counter()

    def run(url: str) -> list[Line]:
        lines: list[Line] = []
        if "round-trip" in only:
            lines += measure_round_trip(url, args.pairs, args.trips)
        if "enqueue" in only:
            lines += measure_enqueue(url, args.pairs, args.enqueues)
        if "drain" in only:
            lines += measure_drains(url, args.pairs)
        if "fast" in only:
            lines += round3.fast_over_reliable(url, args.pairs)
        if "server" in only:
            lines += round3.server_cost(url, args.pairs, ANCHOR_PYTHON)
        if "rss" in only:
            lines += round3.idle_worker_rss(url, args.pairs)
        if "startup" in only:
            lines += round3.start_up(args.pairs)
        if "memory" in only:
            lines += round3.bytes_per_message(url)
        return lines

    if args.redis_url:
        lines = run(args.redis_url)
    else:
        with harness.private_redis() as url:
            lines = run(url)
    load = os.getloadavg()[0]
    print(f"{time.perf_counter() - started:.0f} s, load average {load:.2f}", file=sys.stderr)
    print(render(lines))


if __name__ == "__main__":
    main()
