"""Locks and unique keys when the worker holding them is SIGKILLed.

A lock place held by a killed worker is freed when its lease (``lock_ttl``) expires, so the
next task of the key runs (in reliable mode the killed task itself is recovered and runs
again first). A unique key held by a task whose worker was killed expires after
``unique_ttl``, after which the same call is accepted again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.integration.control_app import build_queue, obs

from .conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
VT = 1.5
UNIQUE_TTL = 2.0


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the run."""
    return str(request.param)


@pytest.fixture
def spawn(
    redis_url: str, namespace: str, mode: str, tmp_path: Path
) -> Iterator[Callable[[], subprocess.Popen[bytes]]]:
    """Start control_app worker subprocesses (concurrency 4); all are killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    client = redis.Redis.from_url(redis_url)

    def start() -> subprocess.Popen[bytes]:
        log = open(tmp_path / f"worker-{len(started)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.control_app", "worker", redis_url,
             namespace, mode, "4", str(VT), str(UNIQUE_TTL)],
            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        started.append(proc)
        wait_until(
            lambda: proc.poll() is not None or client.sismember(obs(namespace, "ready"), proc.pid),
            20,
            "worker ready",
        )
        assert proc.poll() is None, (tmp_path / f"worker-{len(started) - 1}.log").read_text()
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    client.close()


def test_a_killed_holders_lock_is_freed_when_its_lease_expires(
    redis_url: str, namespace: str, mode: str, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = build_queue(redis_url, namespace, mode, VT, UNIQUE_TTL)
    locked = queue.tasks["ctl.locked"]
    first = spawn()
    holder = locked.enqueue_sync("r1", "holder", 30.0)
    started = obs(namespace, "started")
    wait_until(lambda: client.lrange(started, 0, -1) == [b"holder"], 30.0, "holder started")
    waiter = locked.enqueue_sync("r1", "waiter", 0.05)

    def parked() -> bool:
        """The waiter was fetched, locked out and put back on the schedule, not due for a
        while: a worker killed now holds nothing of it (fast mode loses what it holds)."""
        record = queue.inspect_sync(waiter.id)
        return (
            record is not None and record.due_at is not None and record.due_at - time.time() > 0.15
        )

    wait_until(parked, 30.0, "the waiter locked out and on the schedule", interval=0.02)
    assert client.lrange(started, 0, -1) == [b"holder"]
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    killed_at = time.monotonic()
    spawn()
    assert queue.get_result_sync(waiter.id, timeout=15) == "waiter"
    waited = time.monotonic() - killed_at
    assert waited < 20  # freed by the lease, not by the holder's 30 s run (generous)
    if mode == "reliable":  # the killed task was recovered and ran again (briefly)
        assert queue.get_result_sync(holder.id, timeout=15) == "holder"
    order = [s.decode() for s in client.lrange(started, 0, -1)]
    assert order[0] == "holder"
    assert order.count("waiter") == 1
    assert order.count("holder") == (2 if mode == "reliable" else 1)
    record = queue.inspect_sync(waiter.id)
    assert record is not None
    assert record.attempts == 1  # lock waits spent no attempt
    queue.close_sync()
    client.close()


def test_a_unique_key_of_a_killed_run_expires_after_its_ttl(
    redis_url: str, namespace: str, mode: str, spawn: Callable[[], subprocess.Popen[bytes]]
) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = build_queue(redis_url, namespace, mode, VT, UNIQUE_TTL)
    job = queue.tasks["ctl.unique_job"]
    worker = spawn()
    first = job.enqueue_sync("u", 30.0)
    enqueued_at = time.monotonic()
    wait_until(lambda: client.hget(obs(namespace, "runs"), "u") == b"1", 30.0, "task started")
    duplicate = job.enqueue_sync("u", 30.0)
    assert duplicate.duplicate
    assert duplicate.id == first.id
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    fresh = wait_until(
        lambda: (h := job.enqueue_sync("u", 30.0)) and not h.duplicate and h,
        UNIQUE_TTL + 5,
        "the unique key to expire",
        interval=0.1,
    )
    assert fresh.id != first.id
    assert time.monotonic() - enqueued_at >= UNIQUE_TTL - 0.2  # held until the TTL ran out
    queue.close_sync()
    client.close()
