"""``SystemExit`` / ``KeyboardInterrupt`` raised by task code do not end a CLI worker.

Issue 7, section 3: ``raise SystemExit`` after an ``await`` inside an async task used to end
the ``blitzq worker`` process (asyncio re-raises those two out of the event loop); the
redelivered message then killed the next workers in turn until the delivery limit. Now it is
a failed attempt with a record, and the same process runs the next task.

The worker is a real ``python -m blitzq worker tests.reliability.test_task_exits:queue``
subprocess on the test server; this module is also the application it imports.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from blitzq import Queue, TaskFailed, TaskState

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.reliability.test_task_exits:queue"
QUEUE_NAME = "exits"

# ------------------------------------------------------------- the application
#: The Queue the worker imports; the command line sets URL and namespace.
queue = Queue(QUEUE_NAME, visibility_timeout=2.0, max_deliveries=3)


@queue.task(retries=2)
async def exit_after_await(code: int) -> None:
    """Raise ``SystemExit(code)`` after the first ``await``."""
    await asyncio.sleep(0.01)
    raise SystemExit(code)


@queue.task(retries=2)
async def interrupt_after_await() -> None:
    """Raise ``KeyboardInterrupt`` after the first ``await``."""
    await asyncio.sleep(0.01)
    raise KeyboardInterrupt


@queue.task(retries=2)
def exit_in_thread(code: int) -> None:
    """Raise ``SystemExit(code)`` in a worker thread."""
    raise SystemExit(code)


@queue.task
async def whoami() -> int:
    """The worker's pid."""
    await asyncio.sleep(0)
    return os.getpid()


# ------------------------------------------------------------------ fixtures
@pytest.fixture
def worker(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A ``blitzq worker`` subprocess (one slot) on the test namespace; killed at the end."""
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONUNBUFFERED"] = "1"
    cmd = [sys.executable, "-m", "blitzq", "worker", APP, "--redis-url", redis_url]
    cmd += ["--namespace", namespace, "-c", "1", "--shutdown-timeout", "2"]
    cmd += ["--no-supervise"]  # the tests ask this process's own exit code and pid
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if proc.returncode not in (0, -9):
            sys.stderr.write(log.read_text(errors="replace")[-4000:])


@pytest.fixture
def producer(make_queue: Callable[..., Queue]) -> Iterator[Queue]:
    """A Queue on the test namespace that sends the app's tasks by name."""
    q = make_queue(name=QUEUE_NAME)
    yield q
    q.close_sync()


def name(task: Any) -> str:
    """The registered name of one of this module's tasks."""
    return str(task.name)


# --------------------------------------------------------------------- tests
@pytest.mark.timeout(180)
def test_system_exit_in_task_code_is_a_failed_attempt_and_the_worker_lives_on(
    worker: subprocess.Popen[bytes], producer: Queue
) -> None:
    # The worker is up when it answers.
    pid = producer.send_sync(name(whoami)).result_sync(timeout=60)
    assert pid == worker.pid
    cases = [
        (name(exit_after_await), (3,), "SystemExit", "3"),
        (name(interrupt_after_await), (), "KeyboardInterrupt", ""),
        (name(exit_in_thread), (4,), "SystemExit", "4"),
    ]
    for task, args, error_type, error in cases:
        handle = producer.send_sync(task, args)
        with pytest.raises(TaskFailed) as info:
            handle.result_sync(timeout=60)
        assert (info.value.error_type, info.value.error) == (error_type, error)
        record = producer.inspect_sync(handle.id)
        assert record is not None
        # One attempt: not retried (not an Exception), not redelivered (acknowledged).
        assert record.state in (TaskState.FAILED, TaskState.DEAD_LETTERED)
        assert record.attempts == 1
        assert worker.poll() is None, "the worker process exited"
        # The same process runs the next task.
        assert producer.send_sync(name(whoami)).result_sync(timeout=60) == worker.pid
    deadline = time.monotonic() + 10
    while producer.stats_sync([QUEUE_NAME])["queues"][QUEUE_NAME]["in_flight"]:
        assert time.monotonic() < deadline, "a message stayed in flight"
        time.sleep(0.05)
    assert worker.poll() is None
