"""A unique enqueue whose reply is lost, then retried, runs its task exactly once.

The fault: the Redis server applies a command and its reply never reaches the client (a
connection reset, a client timeout after the server's write). It is injected on the
producer's real Redis client, deterministically: the command matched is sent and applied,
then the client raises ``ConnectionError`` in place of the reply. Nothing of the broker is
replaced; Redis (and RabbitMQ) are real.

Before the fix a unique enqueue was two steps, the claim of the key then the publish: a lost
claim reply left the key held by a task that was never published, and every retry was a
"duplicate" of it until ``unique_ttl``; a lost publish reply retried under the same
``task_id`` published a second message (the key held by its own id counted as claimed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio
import redis.exceptions

from blitzq import BrokerError, Queue
from blitzq.broker.amqp import AmqpBroker
from tests.amqp_server import amqp_or_skip, delete_amqp_queues

from .proc_tasks import make_worker


class LostReply:
    """Loses the reply of the first command ``match`` accepts on a Redis client: the
    command is sent and applied, then ``ConnectionError`` is raised instead of its reply.

    Args:
        client: the producer's ``redis.asyncio`` client (its ``execute_command`` is wrapped
            on the instance until :meth:`remove`).
        match: called with the command's arguments (name first).
    """

    def __init__(self, client: Any, match: Callable[[tuple[Any, ...]], bool]) -> None:
        self.client = client
        self.match = match
        self.lost: list[Any] = []
        self._real = client.execute_command
        client.execute_command = self

    async def __call__(self, *args: Any, **options: Any) -> Any:
        """Run the command; lose its reply when it is the first one matched."""
        reply = await self._real(*args, **options)
        if not self.lost and self.match(args):
            self.lost.append(args[0])
            raise redis.exceptions.ConnectionError("Connection reset by peer (reply lost)")
        return reply

    def remove(self) -> None:
        """Unwrap the client."""
        del self.client.execute_command


def producer_client(queue: Queue) -> Any:
    """The Redis client the Queue's state store (claims, scripts) sends on."""
    client = queue.broker.state.control.scripts._client
    assert isinstance(client, redis.asyncio.Redis)
    return client


def claims(queue: Queue) -> Callable[[tuple[Any, ...]], bool]:
    """Matches a script call that claims a unique key (its keys name ``{ns}:u:...``)."""
    prefix = queue.broker.state.keys.unique("")
    return lambda args: (
        args[0] == "EVALSHA" and any(isinstance(a, str) and a.startswith(prefix) for a in args)
    )


def carries(task_id: str) -> Callable[[tuple[Any, ...]], bool]:
    """Matches the command that writes the message of ``task_id`` (its encoded bytes)."""
    mark = task_id.encode()
    return lambda args: any(isinstance(a, bytes) and mark in a for a in args)


@pytest.fixture(params=["reliable", "fast", "amqp"])
async def queue(
    request: pytest.FixtureRequest,
    make_queue: Callable[..., Queue],
    server_url: str,
    namespace: str,
) -> AsyncIterator[Queue]:
    """A Queue ``ul`` in reliable mode, fast mode, or on RabbitMQ (state on Redis)."""
    if request.param == "amqp":
        url = amqp_or_skip()
        broker = AmqpBroker(url, server_url, namespace)
        q = Queue("ul", broker=broker, visibility_timeout=2.0)
        try:
            yield q
        finally:
            await q.close()
            await delete_amqp_queues(url, [broker])
        return
    q = make_queue(name="ul", mode=request.param)
    yield q
    await q.close()


async def drain(queue: Queue) -> None:
    """Run a burst worker until the queue is empty and nothing runs."""
    await asyncio.wait_for(make_worker(queue, concurrency=4, burst=True).run(), 60)


async def runs_of(queue: Queue, name: str) -> int:
    """How many times the task body of ``name`` ran (a counter in this test's namespace)."""
    client = producer_client(queue)
    return int(await client.hget(f"{queue.broker.state.keys.prefix}test-runs", name) or 0)


def counted(queue: Queue, name: str) -> Any:
    """A unique task ``name`` that counts its runs in Redis and returns twice its argument."""

    @queue.task(name=name, unique=True)
    async def once(x: int) -> int:
        await producer_client(queue).hincrby(f"{queue.broker.state.keys.prefix}test-runs", name)
        return 2 * x

    return once


async def test_a_lost_claim_reply_then_a_retry_runs_the_task_once(queue: Queue) -> None:
    once = counted(queue, "ul.claim")
    await queue.broker.remember_queues(["ul"])  # what the first enqueue writes before
    lost = LostReply(producer_client(queue), claims(queue))
    try:
        with pytest.raises(BrokerError):
            await once.enqueue(21)
    finally:
        lost.remove()
    assert lost.lost == ["EVALSHA"]
    retry = await once.enqueue(21)  # what the caller does after an error: the same call
    await drain(queue)
    assert await retry.result(timeout=10) == 42
    assert await runs_of(queue, "ul.claim") == 1


async def test_a_lost_reply_retried_under_the_same_task_id_runs_the_task_once(
    queue: Queue,
) -> None:
    once = counted(queue, "ul.same_id")
    fixed = once.options(task_id="ul-fixed-1")
    await queue.broker.remember_queues(["ul"])
    lost = LostReply(producer_client(queue), carries("ul-fixed-1"))
    try:
        with pytest.raises(BrokerError) as caught:
            await fixed.enqueue(5)
    finally:
        lost.remove()
    assert lost.lost, caught.value  # a Redis command carried the message (and its claim)
    retry = await fixed.enqueue(5)
    assert retry.id == "ul-fixed-1"
    assert retry.duplicate is False
    await drain(queue)
    assert await retry.result(timeout=10) == 10
    assert await runs_of(queue, "ul.same_id") == 1


async def test_a_lost_reply_of_a_delayed_unique_enqueue_schedules_it_once(queue: Queue) -> None:
    once = counted(queue, "ul.delayed")
    await queue.broker.remember_queues(["ul"])
    lost = LostReply(producer_client(queue), claims(queue))
    try:
        with pytest.raises(BrokerError):
            await once.options(delay=0.2).enqueue(4)
    finally:
        lost.remove()
    retry = await once.options(delay=0.2).enqueue(4)
    assert retry.duplicate is True  # the first attempt's task, which is on the schedule
    assert await queue.broker.scheduled_count() == 1
    await drain(queue)
    assert await retry.result(timeout=10) == 8
    assert await runs_of(queue, "ul.delayed") == 1


async def test_enqueue_many_claims_and_writes_each_unique_message_together(
    queue: Queue,
) -> None:
    once = counted(queue, "ul.many")
    await queue.broker.remember_queues(["ul"])
    lost = LostReply(producer_client(queue), claims(queue))
    try:
        with pytest.raises(BrokerError):
            await once.enqueue_many([(1,), (2,)])
    finally:
        lost.remove()
    retry = await once.enqueue_many([(1,), (2,), (3,)])
    assert [h.duplicate for h in retry] == [True, True, False]
    await drain(queue)
    assert [await h.result(timeout=10) for h in retry] == [2, 4, 6]
    assert await runs_of(queue, "ul.many") == 3
