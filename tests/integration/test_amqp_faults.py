"""Every kind of lost RabbitMQ connection, seen by a worker and a producer alike, through TCP
proxies the test owns (``tests/chaos/proxy.py``): the connection closed (FIN), reset (RST),
silent (a blackhole: open sockets, nothing passes; found by the AMQP heartbeat), refused for a
while, and a consumer cancelled by the server (its queue deleted) or a queue deleted under a
producer. After each, the worker consumes again and the producer publishes again.

The shared RabbitMQ is never touched beyond this test's own queues (deleted afterwards); the
heartbeat is 2 s (``?heartbeat=2``), so a silent connection is given up after some 9 s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

import pytest

from blitzq import Queue
from blitzq.broker.amqp import AmqpTransport
from blitzq.broker.amqp.channels import AmqpLink
from tests.amqp_server import amqp_or_skip, delete_amqp_queues
from tests.chaos.proxy import FaultProxy

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(180)

QUEUE = "faults"
T = TypeVar("T")


@dataclass
class Side:
    """One Queue through one proxy of its own."""

    queue: Queue
    proxy: FaultProxy

    @property
    def transport(self) -> AmqpTransport:
        transport = self.queue.broker.transport
        assert isinstance(transport, AmqpTransport)
        return transport

    @property
    def link(self) -> AmqpLink:
        return self.transport.link


@pytest.fixture
def proxies() -> Iterator[tuple[FaultProxy, FaultProxy]]:
    """Two proxies to the shared RabbitMQ: the worker's and the producer's."""
    parts = urlsplit(amqp_or_skip())
    made = (
        FaultProxy(parts.hostname or "127.0.0.1", parts.port or 5672),
        FaultProxy(parts.hostname or "127.0.0.1", parts.port or 5672),
    )
    for proxy in made:
        proxy.start()
    yield made
    for proxy in made:
        proxy.stop()


@pytest.fixture
async def sides(
    proxies: tuple[FaultProxy, FaultProxy], server_url: str, namespace: str
) -> AsyncIterator[tuple[Side, Side]]:
    """The worker's Queue and the producer's, each through its proxy (heartbeat 2 s)."""
    url = amqp_or_skip().split("?")[0] + "?heartbeat=2"
    made = tuple(
        Side(
            Queue(
                QUEUE,
                redis_url=server_url,
                namespace=namespace,
                amqp_url=p.url_for(url),
            ),
            p,
        )
        for p in proxies
    )
    yield made[0], made[1]
    for side in made:
        side.proxy.heal()
        await side.queue.close()
    cleanup = Queue(QUEUE, redis_url=server_url, namespace=namespace, amqp_url=url)
    await cleanup.broker.prepare_consumer([QUEUE], "cleanup")
    await delete_amqp_queues(url, [side.queue.broker for side in made] + [cleanup.broker])
    await cleanup.close()


async def _enqueue_and_run(producer: Queue, ran: list[int], values: range) -> None:
    note = producer.task(name="faults.note")(_note)
    handles = [await note.enqueue(i) for i in values]
    for handle in handles:
        assert await handle.result(timeout=60) == handle_value(handle)
    assert set(values) <= set(ran)


def handle_value(_handle: object) -> None:
    return None


async def _note(i: int) -> None:  # the producer's stand-in (never runs there)
    return None


async def _lost(side: Side, epoch: int) -> None:
    """Wait until ``side``'s link saw its connection (of ``epoch``) go: it is down, or
    already up again on a new connection (a worker waiting for deliveries reconnects at
    once, faster than a poll may see it down)."""
    await eventually(
        lambda: _connected(side),
        lambda up: not up or side.link.epoch > epoch,
        timeout=60,
    )


async def _connected(side: Side) -> bool:
    return side.link.connected


@pytest.mark.parametrize("kind", ["close", "reset", "silent", "refused"])
async def test_worker_and_producer_recover_from_a_lost_connection(
    sides: tuple[Side, Side], kind: str
) -> None:
    worker_side, producer_side = sides
    ran: list[int] = []

    @worker_side.queue.task(name="faults.note")
    async def note(i: int) -> None:
        ran.append(i)

    async with running(make_worker(worker_side.queue, concurrency=4)):
        await _enqueue_and_run(producer_side.queue, ran, range(1))  # both connected
        epochs = [side.link.epoch for side in sides]
        for side in sides:
            if kind == "close":
                assert side.proxy.close_all() >= 1
            elif kind == "reset":
                assert side.proxy.cut() >= 1
            elif kind == "silent":
                assert side.proxy.blackhole() >= 1
            else:
                side.proxy.refuse()
                assert side.proxy.cut() >= 1
        for side, epoch in zip(sides, epochs, strict=True):
            await _lost(side, epoch)  # each side notices: the heartbeat finds a silent one
        if kind == "refused":
            refused_at = worker_side.proxy.connections
            await asyncio.sleep(0)  # the worker keeps retrying meanwhile
            assert worker_side.proxy.connections == refused_at  # none got through
        for side in sides:
            side.proxy.heal()
        await _enqueue_and_run(producer_side.queue, ran, range(1, 6))
    assert sorted(ran) == list(range(6))


async def test_a_consumer_cancelled_by_the_server_and_a_queue_deleted_under_a_producer(
    sides: tuple[Side, Side],
) -> None:
    worker_side, producer_side = sides
    url = amqp_or_skip()
    ran: list[int] = []

    @worker_side.queue.task(name="faults.note")
    async def note(i: int) -> None:
        ran.append(i)

    async with running(make_worker(worker_side.queue, concurrency=4)):
        await _enqueue_and_run(producer_side.queue, ran, range(1))
        consumers = worker_side.transport.consumers
        consumer = consumers[QUEUE]
        link = AmqpLink(url, "cleanup", 1)
        try:  # this test's own queue: RabbitMQ cancels the worker's consumer (basic.cancel)
            await link.delete([worker_side.link.name(QUEUE)])
        finally:
            await link.close()
        await eventually(  # the worker declared the queue again and consumes on a new channel
            _async(lambda: consumers.get(QUEUE)),
            lambda c: c is not None and c is not consumer and bool(c.tag),
        )
        # The producer declared the queue before: its next publish is returned (no queue),
        # declares it again and publishes again; the worker consumes from the new queue.
        await _enqueue_and_run(producer_side.queue, ran, range(1, 6))
    assert sorted(ran) == list(range(6))


async def test_a_producer_declares_a_deleted_queue_again_on_its_next_publish(
    sides: tuple[Side, Side],
) -> None:
    _, producer_side = sides
    url = amqp_or_skip()
    note = producer_side.queue.task(name="faults.note")(_note)
    await note.enqueue(0)
    link = AmqpLink(url, "cleanup", 1)
    try:
        await link.delete([producer_side.link.name(QUEUE)])
        await note.enqueue(1)  # returned, declared again, published again: no error
        link.namespace = producer_side.link.namespace
        assert await link.message_count(QUEUE) == 1
    finally:
        await link.close()


def _async(value: Callable[[], T]) -> Callable[[], Awaitable[T]]:
    async def probe() -> T:
        return value()

    return probe


async def test_an_amqp_url_with_several_hosts_fails_over_between_them(
    proxies: tuple[FaultProxy, FaultProxy], server_url: str, namespace: str
) -> None:
    first, second = proxies
    parts = urlsplit(amqp_or_skip())
    hosts = f"127.0.0.1:{first.port},127.0.0.1:{second.port}"
    url = f"amqp://{parts.username}:{parts.password}@{hosts}{parts.path or '/'}?heartbeat=2"
    worker_queue = Queue(QUEUE, redis_url=server_url, namespace=namespace, amqp_url=url)
    producer = Queue(QUEUE, redis_url=server_url, namespace=namespace, amqp_url=url)
    ran: list[int] = []

    @worker_queue.task(name="faults.note")
    async def note(i: int) -> None:
        ran.append(i)

    try:
        async with running(make_worker(worker_queue, concurrency=4)):
            await _enqueue_and_run(producer, ran, range(2))
            assert (first.connections, second.connections) == (2, 0)  # the first host
            first.refuse()  # the first node goes down: both move to the second
            epoch = Side(producer, first).link.epoch
            assert first.cut() == 2
            await _lost(Side(producer, first), epoch)  # it publishes once it saw the reset
            await _enqueue_and_run(producer, ran, range(2, 4))
            assert second.connections == 2
            first.heal()  # and back when the second one goes down
            second.refuse()
            epoch = Side(producer, second).link.epoch
            assert second.cut() == 2
            await _lost(Side(producer, second), epoch)
            await _enqueue_and_run(producer, ran, range(4, 6))
            assert first.connections == 4
    finally:
        await producer.close()
        await worker_queue.close()
        cleanup = Queue(QUEUE, redis_url=server_url, namespace=namespace, amqp_url=amqp_or_skip())
        await cleanup.broker.prepare_consumer([QUEUE], "cleanup")
        await delete_amqp_queues(amqp_or_skip(), [cleanup.broker])
        await cleanup.close()
    assert sorted(ran) == list(range(6))


@pytest.mark.parametrize("kind", ["close", "reset", "silent"])
async def test_a_lost_connection_logs_one_line_and_no_traceback(
    sides: tuple[Side, Side], kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An expected loss (the server or the network dropped the connection, or its
    heartbeats stopped: what a SIGSTOPped worker meets) reads as one WARNING saying what
    happened and what the worker does next; no traceback (aiormq's records of it are
    filtered: ``closing.py``), and the calls the loss broke are logged at DEBUG."""
    caplog.set_level(logging.DEBUG, logger="blitzq")
    worker_side, producer_side = sides
    ran: list[int] = []

    @worker_side.queue.task(name="faults.note")
    async def note(i: int) -> None:
        ran.append(i)

    async with running(make_worker(worker_side.queue, concurrency=4)):
        await _enqueue_and_run(producer_side.queue, ran, range(1))
        epoch = worker_side.link.epoch
        caplog.clear()
        proxy = worker_side.proxy
        if kind == "close":
            assert proxy.close_all() >= 1
        elif kind == "reset":
            assert proxy.cut() >= 1
        else:
            assert proxy.blackhole() >= 1
        await _lost(worker_side, epoch)
        proxy.heal()
        await _enqueue_and_run(producer_side.queue, ran, range(1, 3))  # it recovered
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    assert not [r for r in warnings if r.name.startswith("aiormq")]
    name = worker_side.link.connection_name
    (line,) = [r.getMessage() for r in warnings if name in r.getMessage()]
    assert "connecting again" in line
    assert ("gave up" if kind == "silent" else "lost connection") in line
    if kind != "silent":  # reconnected at once (a blackhole may hold the next connect)
        assert [r.getMessage() for r in warnings] == [line]
