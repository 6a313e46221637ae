"""Print how many test ids pytest collects: the test-count net of the issue-9 restructuring.

Tests may move and be renamed, but no step may lose any; compare the count before and after a
change (docs/architecture.md, "Tests", records the baseline). Usage, from the repository root:

    python tests/count_tests.py                 # the whole suite
    python tests/count_tests.py tests/contract  # a part of it
    python tests/count_tests.py --min 829       # exit 1 when fewer are collected

It runs ``pytest --collect-only -q`` (nothing is executed, no server is needed) with ``src`` on
``PYTHONPATH``, and exits 2 when collection fails (an import error loses tests silently
otherwise). Not a test itself: pytest does not collect this file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def collect(paths: list[str]) -> list[str]:
    """The test ids ``pytest --collect-only -q`` lists for ``paths`` (all of ``tests`` when
    empty).

    Raises:
        SystemExit: collection failed (code 2), with pytest's output on stderr.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT / "src"), env.get("PYTHONPATH", "")) if p
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *paths],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(2)
    return [line for line in done.stdout.splitlines() if "::" in line]


def main() -> None:
    """Parse the arguments, print the count, and check ``--min``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="test files or folders (default: all)")
    parser.add_argument("--min", type=int, default=None, help="fail when fewer are collected")
    args = parser.parse_args()
    count = len(collect(args.paths))
    print(count)
    if args.min is not None and count < args.min:
        sys.exit(f"only {count} test ids collected, expected at least {args.min}")


if __name__ == "__main__":
    main()
