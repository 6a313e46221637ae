"""A paused server neither duplicates fast-mode work nor fails a wait that has time left.

A private ``redis-server`` is stopped (SIGSTOP) and resumed (SIGCONT); clients use a 0.5 s
``socket_timeout`` so a call times out while it is stopped.

1. A completion whose write timed out while the server was stopped was still applied: the
   server read the script from its socket when it resumed. The worker writes it again, and
   in fast mode (nothing fences a list completion) its effects were applied twice: a chain's
   next step pushed twice ran twice (same task id, attempt 1). Each try is now guarded:
   whichever reaches the server first applies, the others apply nothing.
2. ``WorkflowHandle.get(timeout=...)`` raised ``BrokerError: TimeoutError`` when the server
   stopped during its check for a stalled step, with the workflow still running and most of
   the timeout left; ``get_results`` did the same in its first read of the records. A wait
   now rides out transient errors until its deadline.

Counts and exception types are asserted, never timings.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from blitzq import BrokerError, Queue, ResultTimeout
from blitzq.broker import Completion
from blitzq.broker.effects import Publish, WorkflowStep
from blitzq.broker.redis.fast import FastRedisBroker
from blitzq.workflow import handle as workflow_handle
from tests.polling import wait_until

from .conftest import PrivateRedis

pytestmark = pytest.mark.timeout(120)

#: Seconds the server stays stopped once a test stopped it from inside a wait.
PAUSE = 2.0


def short_timeouts(url: str) -> str:
    """``url`` with a 0.5 s socket timeout (a call times out while the server is stopped)."""
    return url + "?socket_timeout=0.5"


@pytest.fixture
def observer(private_redis: PrivateRedis) -> Iterator[redis.Redis]:
    """A sync client of the private server (the test's own connection)."""
    client = redis.Redis.from_url(private_redis.url, socket_timeout=30)
    yield client
    client.close()


def others(client: redis.Redis) -> int:
    """Connections to the server other than ``client``'s."""
    return len(client.client_list()) - 1


def stop(server: PrivateRedis) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)


def resume(server: PrivateRedis) -> None:
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGCONT)


async def test_a_completion_retried_after_a_timeout_pushes_its_effects_once(
    private_redis: PrivateRedis, observer: redis.Redis
) -> None:
    ns = "fd-" + uuid.uuid4().hex[:8]
    broker = FastRedisBroker(short_timeouts(private_redis.url), ns)

    def key(suffix: str) -> str:
        return "{" + ns + "}:" + suffix

    def completion() -> Completion:
        return Completion(
            "default",
            None,
            "step-1",
            record=b"\x81\xa5state\xa9succeeded",
            record_ttl=600,
            requeue=b"handed back",
            reschedule=b"retry",
            delay=3600.0,
            ops=(Publish("next", b"published"), WorkflowStep("wf-1", "chain", b"step 2")),
        )

    try:
        # Warm: the script is loaded and a connection is open, so the first try below is
        # written to the server's socket at once (and read by it when it resumes).
        await broker.complete([Completion("default", None, "warm", b"\x80", 60)])
        pending = completion()
        stop(private_redis)
        try:
            for _ in range(2):  # the worker's flusher tries again after a timeout
                with pytest.raises(BrokerError) as failed:
                    await broker.complete([pending])
                assert failed.value.transient
        finally:
            resume(private_redis)
        while True:  # the first try after the resume may still meet the stopped connection
            try:
                await broker.complete([pending])
                break
            except BrokerError as exc:
                if not exc.transient:
                    raise
    finally:
        await broker.close()
    # Every connection the broker had is closed: the server has read (and run) whatever
    # was buffered on them before it saw them close.
    wait_until(lambda: others(observer) == 0, 30.0, "the broker's connections to close")
    assert observer.llen(key("l:default")) == 1  # the requeue
    assert observer.llen(key("l:next")) == 1  # a published message
    assert observer.llen(key("l:chain")) == 1  # a workflow's next step
    assert observer.zcard(key("sched")) == 1  # the retry
    assert observer.lrange(key("l:chain"), 0, -1) == [b"step 2"]


async def test_tries_of_a_batch_in_any_order_and_split_apply_each_completion_once(
    private_redis: PrivateRedis, observer: redis.Redis
) -> None:
    # The tries of the test above, in the orders a server can read them: a retry of part of
    # a batch before its late first try, then the whole batch again.
    ns = "fd-" + uuid.uuid4().hex[:8]
    broker = FastRedisBroker(private_redis.url, ns)

    def step(n: int) -> Completion:
        return Completion(
            "default", None, f"s{n}", ops=(WorkflowStep(f"wf{n}", "chain", b"%d" % n),)
        )

    try:
        one, two, three = step(1), step(2), step(3)
        one.guard, two.guard = ("batch-a", 0, 2), ("batch-a", 1, 2)  # a first try lost
        await broker.complete([two])  # retried apart, read first
        await broker.complete([one, two])  # the late first try: only `one` is new
        await broker.complete([one, two, three])  # both again, and a first try of three
        await broker.complete([three])  # three's retry, its first try answered
        await broker.complete([step(4)])  # a later batch deletes three's mark
    finally:
        await broker.close()
    assert sorted(observer.lrange("{" + ns + "}:l:chain", 0, -1)) == [b"1", b"2", b"3", b"4"]
    marks = sorted(k.decode() for k in observer.scan_iter(match="{" + ns + "}:cg:*"))
    assert len(marks) == 2  # batch-a's (its first try was never answered) and step 4's
    assert "{" + ns + "}:cg:batch-a" in marks


def fast_queue(server: PrivateRedis) -> Queue:
    """A fast-mode Queue on the private server with short socket timeouts."""
    return Queue(
        "fd",
        redis_url=short_timeouts(server.url),
        namespace="fd-" + uuid.uuid4().hex[:8],
        mode="fast",
    )


def resume_later(server: PrivateRedis) -> threading.Timer:
    """Resume the stopped server in :data:`PAUSE` seconds (a thread: the loop may block)."""
    timer = threading.Timer(PAUSE, resume, (server,))
    timer.start()
    return timer


async def test_a_workflow_wait_rides_out_a_pause_during_its_stalled_step_check(
    private_redis: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = fast_queue(private_redis)

    @queue.task
    async def first(i: int) -> int:
        return i

    @queue.task
    async def second(i: int) -> int:
        return i

    stopped = asyncio.Event()
    timers: list[threading.Timer] = []
    check = workflow_handle.WorkflowHandle._stalled_step

    async def check_while_stopped(self: Any) -> Any:
        # The server stops just as the wait checks its steps (the window the tester's
        # pauses hit), and is resumed a while later.
        if not stopped.is_set():
            stopped.set()
            stop(private_redis)
            timers.append(resume_later(private_redis))
        return await check(self)

    monkeypatch.setattr(workflow_handle, "LIVENESS_INTERVAL", 0.2)
    monkeypatch.setattr(workflow_handle.WorkflowHandle, "_stalled_step", check_while_stopped)
    try:
        handle = await queue.apply(first.s(1) | second.s())  # no worker: it stays running
        with pytest.raises(ResultTimeout):
            await handle.get(timeout=PAUSE + 4.0)
        assert stopped.is_set()
    finally:
        for timer in timers:
            timer.join()
        resume(private_redis)
        await queue.close()


async def test_get_results_rides_out_a_pause_during_its_first_read(
    private_redis: PrivateRedis,
) -> None:
    queue = fast_queue(private_redis)
    await queue.broker.ping()
    stop(private_redis)
    timer = resume_later(private_redis)
    try:
        got = await queue.get_results(["a", "b"], timeout=PAUSE + 3.0, return_exceptions=True)
        assert [type(r) for r in got] == [ResultTimeout, ResultTimeout]
    finally:
        timer.join()
        resume(private_redis)
        await queue.close()
