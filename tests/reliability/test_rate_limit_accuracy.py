"""Acceptance check of rate limits across processes: 1,000 tasks at "50/s" over 3 workers.

The bucket lives in Redis and takes time from the server, so however many worker processes
share it, the starts follow the limit: a burst of 50, then 50 per second, so the last of 1,000
starts (1000 - 50) / 50 = 19 s after the first, and no one-second window holds more than
burst + rate = 100 starts, as the bucket grants them; the starts themselves can only come later
than their tokens (a busy machine delays them), never earlier.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from .rate_limit_app import TICK, build_queue, obs_key

APP = Path(__file__).resolve().parent / "rate_limit_app.py"
TASKS = 1000
EXPECTED = (TASKS - 50) / 50  # seconds from the first start to the last


def max_window(starts: list[float], width: float = 1.0) -> int:
    """Most start times inside any half-open window ``[t, t + width)``.

    A fullest window can always be slid right until it starts at a start time, so only
    those windows are counted.
    """
    ordered = sorted(starts)
    best, k = 0, 0
    for i, t in enumerate(ordered):
        k = max(k, i)
        while k + 1 < len(ordered) and ordered[k + 1] < t + width:
            k += 1
        best = max(best, k - i + 1)
    return best


def ahead_of_the_limit(starts: list[float], burst: int, rate: float, slack: int) -> list[int]:
    """Indexes ``k`` (in start order) of starts earlier than a token bucket of ``burst``
    and ``rate`` per second allows from the first start: the ``k``-th start (0-based) may
    come at ``first + (k + 1 - burst - slack) / rate`` at the earliest."""
    ordered = sorted(starts)
    first = ordered[0]
    return [k for k, t in enumerate(ordered) if t < first + (k + 1 - burst - slack) / rate - 1e-6]


def test_ahead_of_the_limit_finds_early_starts() -> None:
    steady = [i / 10 for i in range(20)]  # 10 per second, no burst
    assert ahead_of_the_limit(steady, burst=1, rate=10.0, slack=0) == []
    assert ahead_of_the_limit([*steady, 0.5], burst=1, rate=10.0, slack=0) != []
    late = [0.0, *(5.0 + i / 100 for i in range(10))]  # delayed starts bunched: not early
    assert ahead_of_the_limit(late, burst=1, rate=10.0, slack=0) == []


def test_max_window_counts_half_open_windows() -> None:
    assert max_window([0.0, 0.5, 0.99, 1.0, 1.5]) == 3
    assert max_window([0.0] * 5 + [2.0]) == 5
    assert max_window([]) == 0


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_thousand_tasks_at_50_per_second_over_three_processes(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    client = redis.Redis.from_url(redis_url)
    procs: list[subprocess.Popen[bytes]] = []
    logs = []
    queue = build_queue(redis_url, namespace, "reliable")
    try:
        for n in range(3):
            log = open(tmp_path / f"worker-{n}.log", "wb")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(APP), redis_url, namespace, "reliable", "50"],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        deadline = time.monotonic() + 30
        while client.scard(obs_key(namespace, "ready")) < 3:
            assert all(p.poll() is None for p in procs), "a worker exited at start"
            assert time.monotonic() < deadline, "workers did not start within 30 s"
            time.sleep(0.05)
        time.sleep(0.3)  # let every fetch loop reach its blocking read

        handles = queue.tasks[TICK].enqueue_many_sync([(i,) for i in range(TASKS)])
        starts_key = obs_key(namespace, "starts")
        deadline = time.monotonic() + 45
        while client.llen(starts_key) < TASKS:
            assert time.monotonic() < deadline, (
                f"only {client.llen(starts_key)} of {TASKS} tasks started within 45 s"
            )
            time.sleep(0.2)
        rows = [row.decode().split() for row in client.lrange(starts_key, 0, -1)]
        starts = [float(t) for t, _ in rows]
        pids = {pid for _, pid in rows}
        duration = max(starts) - min(starts)
        window = max_window(starts)
        print(
            f"\n{TASKS} tasks at 50/s over 3 worker processes: first to last start "
            f"{duration:.3f} s (expected {EXPECTED:.1f} s); max starts in any 1 s window "
            f"{window}; processes that ran tasks: {len(pids)}"
        )
        assert len(starts) == TASKS
        # Never faster than the limit; the upper bound is generous (a busy machine).
        assert EXPECTED * 0.95 <= duration <= EXPECTED * 1.25, duration
        # Never ahead of the bucket: by any time t, at most burst + rate x (t - first start)
        # tasks have started. Starts are stamped when the body runs, after the token was
        # taken on the server, so a busy machine only delays them: a worker or promoter that
        # falls behind starts the reservations it missed together, and a one-second window
        # in the middle may then hold more than burst + rate (146 seen on a loaded CI
        # machine; docs/flow-control.md says so), but no start ever comes early. The slack
        # of 10 covers the first start's own delay after its token.
        assert ahead_of_the_limit(starts, burst=50, rate=50.0, slack=10) == []
        assert len(pids) >= 2, "the tasks should have been shared by the worker processes"
        # Each task ran exactly once, as its first attempt (rate limiting is not a retry).
        records = [queue.inspect_sync(h.id) for h in handles[:: TASKS // 20]]
        assert all(r is not None and r.attempts == 1 for r in records)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for log in logs:
            log.close()
        queue.close_sync()
        client.close()
