"""How late is a periodic task after every scheduler was frozen and resumed?

Method
------
Starts ``--schedulers`` ``blitzq scheduler`` processes (2) on a Redis (``--redis-url``,
default 127.0.0.1:6379, a fresh namespace) for an application with ``--entries`` (400)
``Every(1)`` entries of each policy, ``missed="skip"`` and ``missed="run_once"``. Once every
entry has run twice, all schedulers are stopped with SIGSTOP (half-way through a tick when
the periodic hash shows one within 10 s) for ``--frozen`` (4.5) seconds
of server time, then resumed with SIGCONT. Nothing consumes the queue, so the stream keeps
every dispatched message; its stream id is the server time (ms) of the claim.

Reported per policy, over the dispatches claimed after the resume:

* ``late > 2 s``: dispatches claimed more than 2 s after their occurrence;
* ``missed dispatched``: dispatched occurrences that came due during the freeze, per entry
  (skip: at most the one due at the resume; run_once: one catch-up);
* ``first``: how long after the resume (server clock) each entry's first dispatch was
  claimed, seconds: median / max.

Run: ``.venv/bin/python bench/scheduler_freeze.py [--entries 400] [--schedulers 2]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import redis

from blitzq.serialization import decode_envelope

APP = """
import blitzq
from blitzq.schedules import Every

queue = blitzq.Queue()


@queue.task(name="freeze.tick")
async def tick() -> None:
    return None


for i in range({entries}):
    queue.add_periodic(tick, Every(1), name=f"skip-{{i:04d}}", missed="skip")
    queue.add_periodic(tick, Every(1), name=f"once-{{i:04d}}", missed="run_once")
"""


def server_now(client: redis.Redis) -> float:
    """The server's clock (Unix seconds)."""
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


class Dispatches:
    """Each entry's (occurrence, claim ms) pairs, in claim order, read from the stream
    incrementally (only what was added since the previous read)."""

    def __init__(self, client: redis.Redis, stream: str) -> None:
        self.client, self.stream = client, stream
        self.found: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self._after = "-"

    def read(self) -> dict[str, list[tuple[int, int]]]:
        """Read the new entries; return every entry's dispatches so far."""
        while True:
            rows = self.client.xrange(self.stream, min=self._after, count=10_000)
            if self._after != "-":
                rows = rows[1:]  # the last one read before
            if not rows:
                return self.found
            for entry_id, fields in rows:
                _, name, stamp = decode_envelope(fields[b"m"]).id.split(":")
                self.found[name].append((int(stamp), int(entry_id.split(b"-")[0])))
            self._after = rows[-1][0].decode()


def wait_for(predicate: Callable[[], bool], timeout: float) -> None:
    """Poll ``predicate`` until it is true or ``timeout`` seconds passed."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.2)


def main() -> None:
    """Run the measurement once and print a small table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--entries", type=int, default=400)
    parser.add_argument("--schedulers", type=int, default=2)
    parser.add_argument("--frozen", type=float, default=4.5)
    opts = parser.parse_args()
    namespace = "bench-freeze-" + uuid.uuid4().hex[:8]
    workdir = Path(tempfile.mkdtemp(prefix="blitzq-freeze-"))
    module = "freeze_bench_app"
    (workdir / f"{module}.py").write_text(APP.format(entries=opts.entries))
    script = Path(sys.executable).with_name("blitzq")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "blitzq"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(workdir), *sys.path]))
    args = ["scheduler", f"{module}:queue", "--redis-url", opts.redis_url]
    args += ["--namespace", namespace]
    procs = [
        subprocess.Popen([*command, *args], cwd=workdir, env=env, stderr=subprocess.DEVNULL)
        for _ in range(opts.schedulers)
    ]
    client = redis.Redis.from_url(opts.redis_url)
    seen = Dispatches(client, "{" + namespace + "}:s:default")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the finally stops the schedulers
    names = [f"{p}-{i:04d}" for i in range(opts.entries) for p in ("skip", "once")]
    try:
        wait_for(lambda: all(len(seen.read()[n]) >= 2 for n in names), 120)
        periodic = "{" + namespace + "}:periodic"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # freeze them half-way through a tick if we can
            if len({int(float(v)) for v in client.hvals(periodic)}) > 1:
                break
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        stopped = server_now(client)
        wait_for(lambda: server_now(client) >= stopped + opts.frozen, 60)
        resumed = server_now(client)
        for p in procs:
            p.send_signal(signal.SIGCONT)

        def again() -> bool:
            found = seen.read()
            return all(any(o > resumed + 2 for o, _ in found[n]) for n in names)

        wait_for(again, 120)
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    found = seen.read()
    keys = list(client.scan_iter(match="{" + namespace + "}:*"))
    if keys:
        client.delete(*keys)
    client.close()
    header = "| policy | entries | late > 2 s | missed dispatched (max/entry) | first (s) |"
    print(header)
    print("|---|---|---|---|---|")
    for policy in ("skip", "once"):
        late = missed = worst = 0
        firsts = []
        for name in (n for n in names if n.startswith(policy)):
            after = [(o, c) for o, c in found[name] if c >= int(resumed * 1000)]
            late += sum(1 for o, c in after if c - o * 1000 > 2000)
            count = sum(1 for o, _ in after if o <= resumed)
            missed += count
            worst = max(worst, count)
            firsts.append(min(c for _, c in after) / 1000 - resumed)
        print(
            f"| {policy} | {len(firsts)} | {late} | {missed} ({worst}) | "
            f"{statistics.median(firsts):.2f} / {max(firsts):.2f} |"
        )


if __name__ == "__main__":
    main()
