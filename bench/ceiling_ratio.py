"""The drain targets (issue 29's goals), each as the median of paired ratios measured in one run.

Starts a private ``redis-server`` (see ``bench.py``) and runs, alternately (A B A B ...,
``--pairs`` pairs, each side a fresh process):

* ``drain, results stored``: this tree's reliable drain of 20,000 no-op tasks (one in-process
  ``Worker(concurrency=200)``, results stored; the clock stops when the broker shows every
  task acked and the last record written, as ``bench.py``'s ``drain`` row) beside
  ``ceiling/stream_lua_records.py`` (a bare loop: ``XREADGROUP 500`` -> decode -> no-op -> one
  Lua call per batch that XACKs, XDELs and SETs each record). Target >= 0.8 (issue 29; issue
  13's was 0.6).
* ``drain, no results``: the same without results, beside ``ceiling/stream_no_records.py``.
  Target >= 0.9 (issue 29; issue 13's was 0.8).
* ``drain x conc 10, one INCR``: ``bench/drain_incr.py`` (10,000 tasks, each body one Redis
  ``INCR``, ``Worker(concurrency=10)``, results stored: both libraries' default) with this
  tree, beside the same script under blitzq 1.1.0 (the venv that
  ``../shared/bench-anchor/compare.sh`` makes under ``/tmp/blitzq-bench-anchor``), a
  reference row without a goal (issue 13's 3x was replaced by issue 29's ratio to the bare
  loop). Skipped, with a note, when that venv is absent (it needs Python >= 3.12; run
  ``compare.sh`` once to make it, or ``--make-anchor``).
  Beside it, the same drain against 10 bare coroutines making the same ``INCR`` commands with no
  queue (the body's own ceiling): target >= 0.7 (issue 29).

The ceiling scripts live in ``../shared/bench-anchor/ceiling/`` (``--anchor`` to move it); a
row whose script is missing is skipped with a note. Prints a Markdown table: each side's
median tasks/s, the median of the per-pair ratios, the ratios of every pair, and PASS/MISS.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench as harness  # noqa: E402  (the sibling script: its private server and drain)

#: ``../shared/bench-anchor`` of the main checkout (or of a worktree one level further down).
DEFAULT_ANCHOR = next(
    (
        p / "shared" / "bench-anchor"
        for p in (ROOT.parent, ROOT.parent.parent)
        if (p / "shared" / "bench-anchor").is_dir()
    ),
    ROOT.parent / "shared" / "bench-anchor",
)
ANCHOR_VENV = Path(os.environ.get("BENCH_HOME", "/tmp/blitzq-bench-anchor")) / "anchor"
_RATE = re.compile(r"drain.*?([0-9][0-9,]*)/s")


@dataclass
class Target:
    """One row: how to run each side, and the ratio it must reach."""

    key: str
    name: str
    goal: float | None  # None: a reference row, no verdict
    product: list[str]
    reference: list[str] | None
    reference_python: str = sys.executable
    note: str = ""
    ours: list[float] = field(default_factory=list)
    theirs: list[float] = field(default_factory=list)


def _child_drain(mode: str, store: bool, n: int) -> None:
    """In a fresh process: one drain of this tree (``bench.drain_measured``), tasks/s printed."""
    import asyncio

    import redis.asyncio as aioredis

    url = os.environ["BARS_REDIS_URL"]

    async def one() -> tuple[float, float]:
        client = aioredis.Redis.from_url(url)
        try:
            return await harness.drain_measured(url, client, mode, store, n)
        finally:
            await client.aclose()

    rate, cpu = asyncio.run(one())
    print(json.dumps({"drain_per_s": round(rate), "cpu_us_per_task": round(cpu / n * 1e6, 2)}))


def _rate(output: str) -> float:
    """Tasks/s from a child's output: its JSON line, or a ceiling script's ``drain ... N/s``."""
    for line in reversed(output.strip().splitlines()):
        if line.startswith("{"):
            return float(json.loads(line)["drain_per_s"])
        found = _RATE.search(line)
        if found:
            return float(found.group(1).replace(",", ""))
    raise RuntimeError(f"no rate in the output: {output[-500:]!r}")


def _run(python: str, argv: list[str], url: str, project: bool) -> float:
    env = dict(os.environ, BARS_REDIS_URL=url, PORT=url.rsplit(":", 1)[1].split("/")[0])
    if project:
        env["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{env.get('PYTHONPATH', '')}"
    else:
        env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [python, *argv], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed: {done.stderr[-2000:]}")
    return _rate(done.stdout)


def targets(anchor: Path, only: set[str] | None, incr_n: int) -> list[Target]:
    """The rows to measure (``only``: a subset of ``results``, ``no-results``, ``incr``,
    ``incr-bare``)."""
    me = str(Path(__file__).resolve())
    ceiling = anchor / "ceiling"
    rows = []
    for key, script, store, goal in (
        ("results", "stream_lua_records.py", True, 0.8),
        ("no-results", "stream_no_records.py", False, 0.9),
    ):
        path = ceiling / script
        label = "results stored" if store else "no results"
        rows.append(
            Target(
                key,
                f"reliable drain x20000, {label} / ceiling/{script}",
                goal,
                [me, "--child", "reliable", "1" if store else "0", "20000"],
                [str(path)] if path.exists() else None,
                note="" if path.exists() else f"skipped: {path} not found",
            )
        )
    anchor_py = ANCHOR_VENV / "bin" / "python"
    incr = [str(HERE / "drain_incr.py"), "reliable", str(incr_n), "10"]
    rows.append(
        Target(
            "incr",
            f"reliable drain x{incr_n} at concurrency 10, one INCR each / blitzq 1.1.0",
            None,
            incr,
            incr if anchor_py.exists() else None,
            str(anchor_py),
            ""
            if anchor_py.exists()
            else f"skipped: no blitzq 1.1.0 venv at {ANCHOR_VENV} "
            "(needs Python >= 3.12; run ../shared/bench-anchor/compare.sh once to make it)",
        )
    )
    bare = [str(HERE / "drain_incr.py"), "bare", str(incr_n), "10"]
    rows.append(
        Target(
            "incr-bare",
            f"the same INCR drain / {incr_n} INCRs by 10 bare coroutines (no queue)",
            0.7,
            incr,
            bare,
        )
    )
    return [t for t in rows if only is None or t.key in only]


def measure(rows: list[Target], url: str, pairs: int) -> None:
    """Run every row's pairs, alternating which side goes first."""
    for i in range(pairs):
        for t in rows:
            if t.reference is None:
                continue
            sides = [("ours", sys.executable, t.product, True)]
            sides.append(("theirs", t.reference_python, t.reference, False))
            if i % 2:
                sides.reverse()
            for side, python, argv, project in sides:
                value = _run(python, argv, url, project)
                (t.ours if side == "ours" else t.theirs).append(value)
            print(
                f"pair {i + 1}: {t.name}: {t.ours[-1]:,.0f} / {t.theirs[-1]:,.0f}",
                file=sys.stderr,
            )


def render(rows: list[Target]) -> str:
    """The Markdown table of the rows measured."""
    out = [
        "| target | blitzq /s | reference /s | ratio (median of pairs) | pairs | goal | verdict |",
        "|---|---:|---:|---:|---|---:|---|",
    ]
    for t in rows:
        name = t.name
        goal = "-" if t.goal is None else f">= {t.goal}"
        if not t.ours or not t.theirs:
            out.append(f"| {name} | - | - | - | {t.note} | {goal} | skipped |")
            continue
        ratios = [a / b for a, b in zip(t.ours, t.theirs, strict=True)]
        ratio = statistics.median(ratios)
        verdict = "-" if t.goal is None else "PASS" if ratio >= t.goal else "MISS"
        each = ", ".join(f"{r:.2f}" for r in ratios)
        out.append(
            f"| {name} | {statistics.median(t.ours):,.0f} | {statistics.median(t.theirs):,.0f} "
            f"| {ratio:.2f} | {each} | {goal} | {verdict} |"
        )
    return "\n".join(out)


def make_anchor() -> None:
    """Make the blitzq 1.1.0 venv (Python 3.12 from ``PATH`` or pyenv) if it is missing."""
    if (ANCHOR_VENV / "bin" / "python").exists():
        return
    candidates = [shutil.which("python3.12")]
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(str(p) for p in Path(root).glob("versions/3.12*/bin/python3"))
    for c in candidates:
        if c and subprocess.run([c, "--version"], capture_output=True).returncode == 0:
            subprocess.run([c, "-m", "venv", str(ANCHOR_VENV)], check=True)
            pip = str(ANCHOR_VENV / "bin" / "pip")
            subprocess.run([pip, "install", "-q", "blitzq==1.1.0", "hiredis", "redis"], check=True)
            return
    print("no Python 3.12 found: the blitzq 1.1.0 row is skipped", file=sys.stderr)


def main() -> None:
    """Parse arguments, start the private server, measure, print the table."""
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child_drain(sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=5, help="pairs per row (default 5)")
    parser.add_argument(
        "--only", help="rows: results, no-results, incr, incr-bare (comma-separated)"
    )
    parser.add_argument("--anchor", type=Path, default=DEFAULT_ANCHOR, help="bench-anchor dir")
    parser.add_argument("--incr-tasks", type=int, default=10000, help="tasks of the INCR row")
    parser.add_argument("--make-anchor", action="store_true", help="make the 1.1.0 venv")
    parser.add_argument("--redis-url", help="use this server instead of a private one")
    args = parser.parse_args()
    if args.make_anchor:
        make_anchor()
    only = set(args.only.split(",")) if args.only else None
    rows = targets(args.anchor, only, args.incr_tasks)
    started = time.perf_counter()
    if args.redis_url:
        measure(rows, args.redis_url, args.pairs)
    else:
        with harness.private_redis() as url:
            measure(rows, url, args.pairs)
    load = os.getloadavg()[0]
    print(f"{time.perf_counter() - started:.0f} s, load average {load:.2f}", file=sys.stderr)
    print(render(rows))


if __name__ == "__main__":
    main()
