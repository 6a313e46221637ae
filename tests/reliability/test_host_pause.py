"""A whole-host pause: the supervisor, its guard and every worker stopped at once (SIGSTOP, as
a VM freeze or a laptop asleep) for longer than the heartbeat timeout, the visibility timeout
and the registrations' lifetime, then continued.

No one was silent alone, so no one may be judged: the supervisor kills no worker (it logs
that it was paused), no worker recovers another's running tasks or reports another's
registration lapsed, and every task runs once. The Redis server is a private one of the test
(not paused: the broker lives on another host). This module is also the application the
workers import; each run counts itself in the private server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from blitzq import Queue
from tests.polling import wait_until
from tests.reliability.conftest import PrivateRedis
from tests.reliability.test_supervisor import ROOT, Supervised, alive, children

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
    pytest.mark.timeout(240),
]

APP = "tests.reliability.test_host_pause:queue"
QUEUE_NAME = "hostpause"
#: Seconds: the workers' visibility timeout (renewals every second).
VISIBILITY = 3.0
#: Seconds: the supervisor's heartbeat timeout (beats every 0.4 s).
HEARTBEAT = "2"
#: Seconds of lease idleness the pause must reach: past the visibility timeout and the
#: registrations' lifetime (about ``VISIBILITY + 5``), so every judgement would fire.
PAUSED_IDLE = VISIBILITY + 6.0
WORKERS = 3
TASKS = 120

# ------------------------------------------------------------- the application
#: The Queue the supervised workers import; the command line sets URL and namespace.
queue = Queue(QUEUE_NAME, visibility_timeout=VISIBILITY)


@queue.task
def nap(key: str, seconds: float) -> str:
    """Count this start of ``key`` in the test's server, then sleep ``seconds`` (a thread)."""
    with redis.Redis.from_url(os.environ["HOST_PAUSE_URL"]) as client:
        client.hincrby(os.environ["HOST_PAUSE_RUNS"], key, 1)
    time.sleep(seconds)
    return key


# ------------------------------------------------------------------ fixtures
@pytest.fixture
def supervisor(private_redis: PrivateRedis, namespace: str, tmp_path: Path) -> Iterator[Supervised]:
    """``blitzq worker APP --workers 3 --heartbeat-timeout 2`` on the private server; what is
    left at the end is continued and SIGKILLed."""
    log = tmp_path / "supervisor.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env["HOST_PAUSE_URL"] = private_redis.url
    env["HOST_PAUSE_RUNS"] = f"{namespace}:runs"
    cmd = [sys.executable, "-m", "blitzq", "worker", APP, "--workers", str(WORKERS)]
    cmd += ["--redis-url", private_redis.url, "--namespace", namespace, "-c", "4"]
    cmd += ["--shutdown-timeout", "2", "--heartbeat-timeout", HEARTBEAT]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    sup = Supervised(proc, log)
    yield sup
    pids = set(sup.seen) | set(children(proc.pid))
    for pid in [proc.pid, *pids]:
        if alive(pid):
            os.kill(pid, signal.SIGCONT)
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def pending_idle(client: redis.Redis, stream: str) -> tuple[int, int]:
    """``(pending deliveries, those idle PAUSED_IDLE s or more)`` over the stream's groups."""
    total = idle = 0
    for group in client.xinfo_groups(stream):
        name = group["name"]
        total += int(group["pending"])
        idle += len(
            client.xpending_range(stream, name, "-", "+", 10_000, idle=int(PAUSED_IDLE * 1000))
        )
    return total, idle


# --------------------------------------------------------------------- tests
def test_whole_host_pause_kills_no_worker_and_runs_each_task_once(
    supervisor: Supervised, private_redis: PrivateRedis, namespace: str
) -> None:
    sup = supervisor
    client = redis.Redis.from_url(private_redis.url)
    runs = f"{namespace}:runs"
    producer = Queue(QUEUE_NAME, redis_url=private_redis.url, namespace=namespace)

    def all_started() -> list[int] | None:
        assert sup.proc.poll() is None, sup.output()
        pids = sup.workers()
        return (
            pids if len(pids) == WORKERS and sup.output().count("started: pid") == WORKERS else None
        )

    workers = sorted(wait_until(all_started, 90, f"{WORKERS} workers"))
    guard = wait_until(sup.guard, 30, "the guard process")
    handles = [producer.send_sync(f"{__name__}.nap", (f"t{i}", 0.5)) for i in range(TASKS)]
    # Every worker holds tasks when the host freezes (each runs 4 at a time).
    wait_until(lambda: client.hlen(runs) >= 2 * WORKERS * 4, 120, "tasks running everywhere")

    host = [sup.proc.pid, guard, *workers]
    for pid in host:
        os.kill(pid, signal.SIGSTOP)
    try:
        stream = "{" + namespace + "}:s:" + QUEUE_NAME

        def lapsed() -> bool:
            total, idle = pending_idle(client, stream)
            return total > 0 and idle == total

        # The pause lasts until every running task's lease looks long lapsed on the server.
        wait_until(lapsed, 60, "every lease idle past the visibility timeout", interval=0.5)
    finally:
        for pid in host:
            os.kill(pid, signal.SIGCONT)

    for handle in handles:
        handle.result_sync(timeout=120)
    out = sup.log.read_text(errors="replace")
    counts = {k.decode(): int(v) for k, v in client.hgetall(runs).items()}
    assert len(counts) == TASKS, out[-4000:]
    twice = {k: v for k, v in counts.items() if v != 1}
    assert not twice, f"tasks run more than once: {twice}\n{out[-4000:]}"
    assert "supervisor was paused for" in out, out[-4000:]
    assert "sent no heartbeat" not in out, out[-4000:]
    assert "abandoned message" not in out, out[-4000:]
    assert "stopped renewing their registration" not in out, out[-4000:]
    assert sorted(sup.workers()) == workers, out[-4000:]
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(60) == 0, sup.output()
    client.close()
