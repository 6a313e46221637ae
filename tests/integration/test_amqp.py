"""The RabbitMQ transport end to end: a Queue with ``amqp_url`` and a Worker, on the shared
RabbitMQ (skipped when it does not answer) with the state on the test Redis.

Covers publisher confirms, priority order, redelivery when a holder's connection dies before
its ack, RabbitMQ's delivery limit ending in blitzq's dead letters, reconnection after the
server closed an idle worker's connection, and a task longer than ``consumer_timeout`` (on a
private node configured with a short one) running once.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from blitzq import ConfigurationError, Queue, records
from blitzq.broker import Broker, Completion
from blitzq.broker.amqp import AmqpBroker
from blitzq.broker.amqp.channels import AmqpLink
from blitzq.cli import cli
from blitzq.serialization import Envelope, decode_envelope, encode_envelope
from tests.amqp_server import (
    PrivateNode,
    amqp_brokers,
    amqp_or_skip,
    close_connection_named,
    delete_amqp_queues,
)
from tests.broker_kinds import is_amqp
from tests.conftest import free_port
from tests.polling import wait_until

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)


def message(task_id: str, queue: str = "q") -> bytes:
    """An encoded message of a task nobody runs (transport-level tests)."""
    return encode_envelope(Envelope(task_id, "tests.amqp.noop", queue, []), 1 << 20)


@pytest.fixture
async def amqp(server_url: str, namespace: str) -> AsyncIterator[Callable[..., Broker]]:
    """Factory of AmqpBrokers on the shared RabbitMQ and the test Redis namespace; their
    RabbitMQ queues are deleted afterwards."""
    async with amqp_brokers(server_url, namespace) as factory:
        yield factory


@pytest.fixture
async def queue(amqp: Callable[..., Broker]) -> AsyncIterator[Queue]:
    """A Queue ``aq`` whose broker is an AmqpBroker (visibility timeout 2 s)."""
    broker = amqp()
    q = Queue("aq", broker=broker, visibility_timeout=2.0)
    yield q
    await q.close()


async def test_enqueue_runs_on_a_worker_and_stores_the_result(queue: Queue) -> None:
    @queue.task(name="amqp.add")
    async def add(a: int, b: int) -> int:
        return a + b

    handles = [await add.enqueue(i, i) for i in range(5)]
    async with running(make_worker(queue, concurrency=4)):
        results = [await h.result(timeout=30) for h in handles]
    assert results == [0, 2, 4, 6, 8]
    stats = (await queue.broker.queue_stats(["aq"]))["aq"]
    assert stats == {"waiting": 0, "in_flight": 0}


async def test_queue_amqp_url_builds_the_pairing(server_url: str, namespace: str) -> None:
    url = amqp_or_skip()
    q = Queue("aq", redis_url=server_url, namespace=namespace, amqp_url=url, max_deliveries=3)
    try:
        broker = q.broker
        assert is_amqp(broker)
        assert broker.transport.link.max_deliveries == 3
        await broker.ping()
    finally:
        await q.close()


async def test_publish_returns_once_confirmed_and_a_deleted_queue_is_declared_again(
    amqp: Callable[..., Broker],
) -> None:
    broker = amqp()
    await broker.publish("conf", [message(f"c{i}") for i in range(20)])
    assert (await broker.queue_stats(["conf"]))["conf"]["waiting"] == 20
    # The queue disappears under the publisher: RabbitMQ returns the message (mandatory), so
    # it was certainly not queued; the publisher declares the queue again and publishes it.
    other = AmqpLink(broker.transport.link.url, broker.transport.link.namespace, 5)
    try:
        await other.delete([broker.transport.link.name("conf")])
    finally:
        await other.close()
    await broker.publish("conf", [message("again")])
    assert (await broker.queue_stats(["conf"]))["conf"]["waiting"] == 1


async def test_priorities_run_high_then_normal_then_low(queue: Queue) -> None:
    order: list[str] = []

    @queue.task(name="amqp.step")
    async def step(label: str) -> None:
        order.append(label)

    await step.options(priority="low").enqueue("low")
    await step.enqueue("normal")
    await step.options(priority="high").enqueue("high")
    async with running(make_worker(queue, concurrency=1)):
        await eventually(lambda: asyncio.sleep(0, len(order)), lambda n: n == 3)
    assert order == ["high", "normal", "low"]


@pytest.mark.parametrize("count", [1, 2, 5])
async def test_a_consumers_first_fetches_take_every_higher_level_first(
    amqp: Callable[..., Broker], count: int
) -> None:
    """Twenty messages per level wait when a fresh consumer (a worker's start, a queue's
    resume) fetches ``count`` at a time: every high one comes before any normal one, every
    normal one before any low one. A first fetch asked each level with one ``basic.get``
    and took the answers together, so a normal (and a low) message came second while
    RabbitMQ was still pushing the high level's prefetch (tester finding: "1 high 1 norm 19
    high 19 norm 20 low" after a resume)."""
    broker = amqp()
    levels = ["pq:high", "pq", "pq:low"]
    for level in reversed(levels):  # the low ones published first
        await broker.publish(level, [message(f"{level}-{i}") for i in range(20)])
    taken: list[str] = []
    while len(taken) < 60:
        got = await broker.fetch_first(levels, count, 5)
        assert got, taken
        taken += [d.queue for d in got]
        for d in got:  # as a worker's completions do
            await broker.transport.ack(d.queue, [d.token])
    assert taken == ["pq:high"] * 20 + ["pq"] * 20 + ["pq:low"] * 20


async def test_a_delivery_whose_connection_died_before_its_ack_is_delivered_again(
    amqp: Callable[..., Broker],
) -> None:
    first, second = amqp(), amqp()
    await first.publish("redo", [message("r1")])
    (d,) = await first.fetch("redo", 1, 5)
    assert d.deliveries == 1
    await first.transport.link.close()  # the holder is gone without an ack
    (again,) = await second.fetch("redo", 1, 10)
    assert again.payload == d.payload
    assert again.deliveries == 2


async def test_two_processes_never_name_a_delivery_alike(amqp: Callable[..., Broker]) -> None:
    """A delivery's token names its custody entry in the state store, which every worker
    shares: two workers' first deliveries (both tag 1 on channel 1 of their first
    connection) once had one token, so one worker's custody overwrote the other's and a
    killed worker's long tasks were never run again (a user-style test)."""
    first, second = amqp(), amqp()
    await first.publish("twins", [message("t1")])
    (a,) = await first.fetch("twins", 1, 5)
    await first.close()  # its delivery goes back to the queue, for the second process
    (b,) = await second.fetch("twins", 1, 10)
    assert b.payload == a.payload
    assert a.token != b.token


async def test_a_task_redelivered_after_its_connection_was_closed_runs_again(
    amqp: Callable[..., Broker],
) -> None:
    # A visibility timeout long enough that the delivery is still RabbitMQ's (not yet
    # handed to the state store's custody) when its connection is closed.
    queue = Queue("aq", broker=amqp(), visibility_timeout=60.0)
    runs: list[int] = []
    release = asyncio.Event()

    @queue.task(name="amqp.slow")
    async def slow() -> str:
        runs.append(1)
        await release.wait()
        return "done"

    handle = await slow.enqueue()
    async with running(make_worker(queue, concurrency=2)):
        await eventually(lambda: asyncio.sleep(0, len(runs)), lambda n: n == 1)
        link = queue.broker.transport.link  # type: ignore[attr-defined]
        assert await asyncio.to_thread(close_connection_named, link.connection_name) >= 1
        # The worker reconnects, RabbitMQ redelivers the unacked message: it runs again.
        await eventually(lambda: asyncio.sleep(0, len(runs)), lambda n: n == 2)
        release.set()
        assert await handle.result(timeout=30) == "done"


async def test_queue_stats_count_in_flight_the_tasks_workers_hold(
    amqp: Callable[..., Broker],
) -> None:
    """RabbitMQ tells only the ready count: ``in_flight`` (the tasks a worker's fetches took
    and did not ack: here the 4 running) comes from the workers' registrations, seen from
    another process's broker as from the worker's own (counted once there); what a worker's
    consumer prefetched counts as waiting, as before a fetch on Redis."""
    queue = Queue("aq", broker=amqp(), visibility_timeout=3.0)
    observer = amqp()  # another process: `blitzq queue stats`
    runs: list[int] = []
    release = asyncio.Event()

    @queue.task(name="amqp.held")
    async def held() -> None:
        runs.append(1)
        await release.wait()

    await held.enqueue_many([((), {}) for _ in range(8)])
    async with running(make_worker(queue, concurrency=4)):
        await eventually(lambda: asyncio.sleep(0, len(runs)), lambda n: n == 4)
        want = {"aq": {"waiting": 4, "in_flight": 4}}
        for broker in (observer, queue.broker):
            await eventually(lambda b=broker: b.queue_stats(["aq"]), lambda s: s == want, 30)
        release.set()
        await eventually(lambda: asyncio.sleep(0, len(runs)), lambda n: n == 8)


async def test_an_idle_worker_consumes_again_after_the_server_closed_its_connection(
    queue: Queue,
) -> None:
    @queue.task(name="amqp.echo")
    async def echo(x: int) -> int:
        return x

    async with running(make_worker(queue, concurrency=2)):
        assert await (await echo.enqueue(1)).result(timeout=30) == 1
        link = queue.broker.transport.link  # type: ignore[attr-defined]
        epoch = link.epoch
        assert await asyncio.to_thread(close_connection_named, link.connection_name) >= 1
        # The worker sees the close and connects again (an enqueue sent while the close is
        # still on its way has an unknown outcome: OutcomeUnknown, as under a loaded CI run).
        await eventually(lambda: asyncio.sleep(0, link.epoch), lambda e: e > epoch, 30.0)
        assert await (await echo.enqueue(2)).result(timeout=30) == 2


async def test_a_completion_whose_channel_closed_is_committed_without_an_ack(
    amqp: Callable[..., Broker],
) -> None:
    # RabbitMQ going away between a delivery and its completion: the ack cannot be sent
    # (RabbitMQ redelivers), which is no reason to refuse the completion committed in Redis.
    first, second = amqp(), amqp()
    await first.publish("gone", [message("g1")])
    (d,) = await first.fetch("gone", 1, 5)
    assert d.token is not None
    await first.transport.link.close()
    assert await first.complete([Completion("gone", d.token, "g1")]) == []
    (again,) = await second.fetch("gone", 1, 10)
    assert again.deliveries == 2


async def test_a_redelivery_whose_completion_was_committed_is_acked_without_running(
    amqp: Callable[..., Broker],
) -> None:
    first, second = amqp(), amqp()
    await first.publish("redo", [message("r0"), message("r1"), message("r2")])
    got: list[Any] = []
    while len(got) < 3:
        got += await first.fetch("redo", 3 - len(got), 10)
    # The worker committed r0's success and r1's retry in Redis, then lost its connection
    # before RabbitMQ read the acks (a crash, a cut): all three come back.
    done = records.succeeded("r0", "tests.amqp.noop", "redo", 1, 0.0, 0.0, "w")
    retrying = records.retrying("r1", "tests.amqp.noop", "redo", 1, 0.0, 0.0, "w", "E", "e")
    await first.state.complete(
        [
            Completion("redo", None, "r0", record=done, record_ttl=600),
            Completion("redo", None, "r1", record=retrying, record_ttl=600),
        ]
    )
    await first.transport.link.close()
    again: list[Any] = []
    while not again:  # r0 and r1 are acked at their redelivery, not handed to a worker
        again = await second.fetch("redo", 3, 10)
    assert [(envelope_id(d.payload), d.deliveries) for d in again] == [("r2", 2)]
    assert (await second.queue_stats(["redo"]))["redo"] == {"waiting": 0, "in_flight": 1}


def envelope_id(payload: bytes) -> str:
    """The task id of an encoded message."""
    return decode_envelope(payload).id


async def test_past_the_delivery_limit_a_message_becomes_a_blitzq_dead_letter(
    amqp: Callable[..., Broker],
) -> None:
    # The queue's limit is the backstop of deliveries (worker/solo.py counts a crashing
    # task's runs alone); with max_deliveries=1 it is the first return, as it always was.
    broker = amqp(max_deliveries=1)
    await broker.publish("poison", [message("p1")])
    holder = amqp(max_deliveries=1)
    (d,) = await holder.fetch("poison", 1, 10)
    assert d.deliveries == 1
    await holder.transport.link.close()  # the holder dies before its ack
    # RabbitMQ dead-letters it into <ns>.dead-letter; maintenance moves it to blitzq's.
    await eventually(
        lambda: broker.recover("poison", 60, 10, 1, 60), lambda r: r[1] == 1, timeout=30
    )
    fields = await broker.get_dead_letter("p1")
    assert fields is not None
    assert fields.reason == "max deliveries exceeded"
    assert fields.queue == "poison"
    assert fields.kind == "s"  # DeadLetter.mode "reliable": RabbitMQ is at-least-once
    assert fields.task == "tests.amqp.noop"
    assert await broker.fetch("poison", 1, 0) == []


async def test_a_hand_back_publishes_again_without_spending_a_delivery(
    amqp: Callable[..., Broker],
) -> None:
    broker = amqp()
    await broker.publish("back", [message("b1")])
    (d,) = await broker.fetch("back", 1, 10)
    assert d.token is not None
    # What a worker does with a message it did not start (shutdown, no free slot).
    assert await broker.complete([Completion("back", d.token, "b1", requeue=d.payload)]) == []
    (again,) = await broker.fetch("back", 1, 10)
    assert again.payload == d.payload
    assert again.deliveries == 1
    assert (await broker.queue_stats(["back"]))["back"] == {"waiting": 0, "in_flight": 1}


async def test_closing_hands_back_prefetched_messages_without_spending_deliveries(
    amqp: Callable[..., Broker],
) -> None:
    first, second = amqp(prefetch=10), amqp()
    await first.publish("pre", [message(f"m{i}") for i in range(5)])
    (d,) = await first.fetch("pre", 1, 10)
    assert d.token is not None
    await first.complete([Completion("pre", d.token, "m0")])
    await first.close()  # its consumer may hold the other four, prefetched
    rest: list[Any] = []
    while len(rest) < 4:
        rest += await second.fetch("pre", 4 - len(rest), 10)
    assert sorted(r.deliveries for r in rest) == [1, 1, 1, 1]


async def test_tasks_longer_than_consumer_timeout_run_once(server_url: str, namespace: str) -> None:
    # consumer_timeout 3 s, checked every 0.5 s: a delivery left unacked 3.5 s closes its
    # channel. Two 5 s tasks on one slot: the first is handed to the state store's custody
    # while it runs, the second waits prefetched in the consumer (handed back each round).
    node = PrivateNode("consumer_timeout = 3000", "[{rabbit, [{channel_tick_interval, 500}]}].\n")
    url = await asyncio.to_thread(node.start)
    broker = AmqpBroker(url, server_url, namespace)
    q = Queue("long", broker=broker, visibility_timeout=1.0)
    runs: list[str] = []
    try:

        @q.task(name="amqp.long")
        async def long_task(label: str) -> str:
            runs.append(label)
            await asyncio.sleep(5)
            return label

        first, second = await long_task.enqueue("a"), await long_task.enqueue("b")
        async with running(make_worker(q, concurrency=1)):
            assert await first.result(timeout=60) == "a"
            assert await second.result(timeout=60) == "b"
            assert (await broker.queue_stats(["long"]))["long"]["waiting"] == 0
        assert runs == ["a", "b"]
        for handle in (first, second):
            record = await handle.status()
            assert record is not None
            assert record.attempts == 1  # no delivery was spent by a closed channel
    finally:
        await q.close()
        await asyncio.to_thread(node.stop)


class _Redis:
    """A ``redis-server`` of this test on one port, stopped and started again at will."""

    def __init__(self, tmp: str) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("no redis-server to stop and restart")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_until(lambda: _pings(self.url), 20, "the test's redis-server answers")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def _pings(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


async def test_with_the_state_store_down_a_delivery_waits_without_spending_deliveries(
    tmp_path: Any,
) -> None:
    url = amqp_or_skip()
    server = _Redis(str(tmp_path))
    server.start()
    broker = AmqpBroker(url, server.url, "redis-down-" + uuid.uuid4().hex[:8])
    q = Queue("rd", broker=broker, visibility_timeout=1.0)
    runs: list[int] = []

    @q.task(name="amqp.once")
    async def once(x: int) -> int:
        runs.append(x)
        return x

    try:
        first = await once.enqueue(0)
        async with running(make_worker(q, concurrency=2)):
            assert await first.result(timeout=30) == 0
            server.stop()
            handle = await once.enqueue(1)  # RabbitMQ only: the queue is known already
            await eventually(lambda: asyncio.sleep(0, list(runs)), lambda r: r == [0, 1])
            # Its completion cannot be committed: the delivery stays unacked while the
            # worker's maintenance rounds (every 1/3 s) fail on Redis, well past the
            # visibility timeout, and is neither handed back nor handed over.
            held = broker.transport.held
            await eventually(
                lambda: asyncio.sleep(0, [time.monotonic() - h.since for h in held.values()]),
                lambda ages: bool(ages) and min(ages) > 3.0,
            )
            server.start()
            assert await handle.result(timeout=30) == 1
            record = await handle.status()
            assert record is not None
            assert record.attempts == 1
        assert runs == [0, 1]
        assert (await broker.queue_stats(["rd"]))["rd"] == {"waiting": 0, "in_flight": 0}
    finally:
        await q.close()
        await delete_amqp_queues(url, [broker])
        server.stop()


async def test_amqp_url_from_the_environment_and_bad_schemes(
    server_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match="amqp://"):
        Queue(redis_url=server_url, amqp_url="http://127.0.0.1:5672/")
    monkeypatch.setenv("BLITZQ_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
    q = Queue(redis_url=server_url, namespace=namespace)
    try:
        assert is_amqp(q.broker)  # made lazily: nothing connects here
    finally:
        await q.close()
    monkeypatch.setenv("BLITZQ_AMQP_URL", "ftp://nowhere/")
    result = CliRunner().invoke(
        cli, ["--redis-url", server_url, "--namespace", namespace, "task", "inspect", "x"]
    )
    assert result.exit_code == 78, result.output  # from the environment: EX_CONFIG
    assert "amqp://" in result.output
    result = CliRunner().invoke(cli, ["--help"])
    assert "--amqp-url" in result.output
