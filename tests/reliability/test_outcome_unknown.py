"""A producer write whose reply is lost raises ``OutcomeUnknown``, not a plain transient error.

The test's own ``redis-server`` is frozen with SIGSTOP: the command is sent, the read times out
(``socket_timeout=1``), and after SIGCONT the server applies it. The error must say so (and
carry the ids), since a blind retry would duplicate the write; a server that cannot be reached
at all (nothing sent) still raises a plain ``BrokerError``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from blitzq import BrokerError, OutcomeUnknown, Queue, Worker, chain

from ..conftest import free_port
from .conftest import PrivateRedis


async def _frozen(private_redis: PrivateRedis, write: Awaitable[Any]) -> OutcomeUnknown:
    assert private_redis.proc is not None
    pid = private_redis.proc.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(OutcomeUnknown) as caught:
            await write
    finally:
        os.kill(pid, signal.SIGCONT)
    err = caught.value
    assert err.outcome_unknown is True
    assert err.transient is True
    assert isinstance(err, BrokerError)
    assert "outcome unknown" in str(err)
    return err


@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "kind", ["enqueue", "enqueue_delayed", "enqueue_many", "workflow", "cancel"]
)
async def test_a_write_whose_reply_is_lost_raises_outcome_unknown_and_may_apply(
    private_redis: PrivateRedis, namespace: str, kind: str
) -> None:
    queue = Queue(redis_url=f"{private_redis.url}?socket_timeout=1", namespace=namespace)

    @queue.task(name="ou.add")
    async def add(a: int, b: int) -> int:
        return a + b

    await add.enqueue(0, 0)  # connections open, the queue is registered: the fast path
    writes: dict[str, Callable[[], Awaitable[Any]]] = {
        "enqueue": lambda: add.enqueue(1, 2),
        "enqueue_delayed": lambda: add.options(delay=0.5).enqueue(1, 2),
        "enqueue_many": lambda: add.enqueue_many([(1, 2), (3, 4)]),
        "workflow": lambda: queue.apply(chain(add.s(1, 2), add.s(3))),
        "cancel": lambda: queue.cancel("ou-cancelled"),
    }
    # Once unfrozen, the server applies what it had read: the same write done once first
    # (its script loaded: a first EVALSHA would meet NOSCRIPT and apply nothing).
    await writes[kind]()
    err = await _frozen(private_redis, writes[kind]())
    assert err.task_ids
    assert err.task_id == err.task_ids[0]
    if kind == "enqueue_many":
        assert len(err.task_ids) == 2
    if kind == "cancel":
        assert err.task_ids == ("ou-cancelled",)
        record = await queue.inspect("ou-cancelled")  # the cancel was applied after all
        assert record is not None
        assert record.state.value == "cancelled"
        await queue.close()
        return
    worker = Worker(queue, concurrency=2, block_timeout=0.5)
    running = asyncio.create_task(worker.run())
    try:
        if kind == "workflow":
            assert await queue.workflow(err.task_ids[0]).get(timeout=30) == 6
        else:
            for task_id in err.task_ids:
                assert await queue.get_result(task_id, timeout=30) in (3, 7)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await queue.close()


@pytest.mark.timeout(60)
async def test_an_unreachable_server_is_a_plain_broker_error(namespace: str) -> None:
    queue = Queue(redis_url=f"redis://127.0.0.1:{free_port()}/0", namespace=namespace)

    @queue.task(name="ou.noop")
    async def noop() -> None:
        return None

    with pytest.raises(BrokerError) as caught:
        await noop.enqueue()
    assert not isinstance(caught.value, OutcomeUnknown)
    assert caught.value.outcome_unknown is False
    await queue.close()


@pytest.mark.timeout(60)
async def test_a_failure_before_the_send_is_a_plain_broker_error(
    private_redis: PrivateRedis, namespace: str
) -> None:
    """Under an explicit ``task_id`` the first write resets what an earlier task of that id
    left; when that write gets no reply nothing was sent yet: a plain transient error, and
    the task never runs (a retry under the same id is exact)."""
    queue = Queue(redis_url=f"{private_redis.url}?socket_timeout=1", namespace=namespace)

    @queue.task(name="ou.add")
    async def add(a: int, b: int) -> int:
        return a + b

    await add.enqueue(0, 0)
    assert private_redis.proc is not None
    os.kill(private_redis.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(BrokerError) as caught:
            await add.options(task_id="ou-fixed").enqueue(1, 2)
    finally:
        os.kill(private_redis.proc.pid, signal.SIGCONT)
    assert not isinstance(caught.value, OutcomeUnknown)
    assert caught.value.transient
    handle = await add.options(task_id="ou-fixed").enqueue(1, 2)  # the retry
    worker = Worker(queue, concurrency=1, block_timeout=0.5)
    running = asyncio.create_task(worker.run())
    try:
        assert await handle.result(timeout=30) == 3
    finally:
        worker.stop()
        await asyncio.wait_for(running, 30)
        await queue.close()
