"""Acceptance check of rate limits across processes: 1,000 tasks at "50/s" over 3 workers.

The bucket lives in Redis and takes time from the server, so however many worker processes
share it, the starts follow the limit: a burst of 50, then 50 per second, so the last of 1,000
starts (1000 - 50) / 50 = 19 s after the first, and no one-second window holds more than
burst + rate = 100 starts.
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
        # Starts are stamped when the body runs, after its token was taken on the server: a
        # start delayed by a busy machine lands in a later window, so starts over burst +
        # rate in one window are scheduling delay, not extra tokens (the bucket's grants are
        # exact: tests/contract/test_flow_contract.py, and the duration above shows no token
        # more than the limit over the whole run). Allowed: half a second of the rate (on a
        # loaded 2-core CI machine, 3 test processes beside these 3 workers and Redis, up to
        # 116 were seen); a bucket that let a second burst through would show 150.
        assert window <= 100 + 25, window
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
