"""``Queue(amqp_connection=...)``: a producer publishing over the application's own aio-pika
connection or pool, on the shared RabbitMQ (skipped when it does not answer) with the state
on the test Redis; blitzq never closes it, and a worker refuses such a Queue.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest
import redis.asyncio as aioredis
from aio_pika.abc import AbstractConnection
from aio_pika.pool import Pool

from blitzq import ConfigurationError, Queue, Worker
from blitzq.broker.amqp.transport import AmqpTransport
from tests.amqp_server import amqp_or_skip, delete_amqp_queues

from .proc_tasks import make_worker, running

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
async def app_connection() -> AsyncIterator[AbstractConnection]:
    """The application's own robust connection, closed by the test."""
    conn = await aio_pika.connect_robust(amqp_or_skip())
    try:
        yield conn
    finally:
        await conn.close()


def _register(queue: Queue) -> None:
    @queue.task(name="ainj.add")
    async def add(a: int, b: int) -> int:
        return a + b


async def _usable(conn: AbstractConnection) -> None:
    """The connection still opens channels and publishes (to the default exchange)."""
    channel = await conn.channel()
    declared = await channel.declare_queue("", exclusive=True, auto_delete=True)
    await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key=declared.name)
    assert (await declared.get(timeout=5)).body == b"x"
    await channel.close()


@pytest.mark.parametrize("given", ["connection", "pool", "with redis="])
async def test_a_producer_publishes_over_the_apps_connection_and_leaves_it_open(
    app_connection: AbstractConnection,
    server_url: str,
    namespace: str,
    given: str,
) -> None:
    url = amqp_or_skip()
    source: Any = app_connection
    pool: Pool[AbstractConnection] | None = None
    extra: dict[str, Any] = {"redis_url": server_url}
    app_redis: aioredis.Redis | None = None
    if given == "pool":
        pool = Pool(lambda: aio_pika.connect_robust(url), max_size=2)
        source = pool
    elif given == "with redis=":
        app_redis = aioredis.Redis.from_url(server_url)
        extra = {"redis": app_redis}
    producer = Queue("ainj", namespace=namespace, amqp_connection=source, **extra)
    _register(producer)
    consumer = Queue("ainj", namespace=namespace, redis_url=server_url, amqp_url=url)
    _register(consumer)
    brokers: list[Any] = []
    try:
        assert producer.connection_injected
        with pytest.raises(ConfigurationError, match="amqp_connection="):
            Worker(producer, handle_signals=False)
        handle = await producer.send("ainj.add", [2, 3])
        broker = producer.broker
        transport = broker.transport
        assert isinstance(transport, AmqpTransport)
        brokers += [broker, consumer.broker]
        if given != "pool":  # published on the application's connection itself
            assert transport.link._conn is app_connection
        else:  # on one taken from the application's pool
            assert transport.link._conn is not None
            assert transport.link._conn is not app_connection
        async with running(make_worker(consumer, concurrency=2)):
            assert await handle.result(timeout=30) == 5
        await producer.close()
        # The application's connection (or pool) is open and usable after the Queue closed.
        if pool is not None:
            assert not pool.is_closed
            async with pool.acquire() as conn:
                await _usable(conn)
        else:
            assert not app_connection.is_closed
            await _usable(app_connection)
        if app_redis is not None:
            assert await app_redis.ping()
    finally:
        await producer.close()
        await consumer.close()
        await delete_amqp_queues(url, brokers)
        if pool is not None:
            await pool.close()
        if app_redis is not None:
            await app_redis.aclose()


async def test_the_cli_amqp_url_wins_over_an_injected_connection(
    app_connection: AbstractConnection, server_url: str, namespace: str
) -> None:
    producer = Queue(
        "ainj", namespace=namespace, redis_url=server_url, amqp_connection=app_connection
    )
    producer._amqp_url = amqp_or_skip()  # what `blitzq --amqp-url ... worker` sets
    producer._amqp_injected = None
    Worker(producer, handle_signals=False)  # accepted now
    await producer.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"amqp_connection": "amqp://guest:guest@localhost/"}, "a URL goes in amqp_url="),
        ({"amqp_connection": object()}, "takes an aio-pika connection"),
        (
            {"amqp_connection": "conn", "amqp_url": "amqp://guest:guest@localhost/"},
            "give one of amqp_connection=",
        ),
    ],
)
async def test_unusable_amqp_connections_are_refused_at_construction(
    app_connection: AbstractConnection, kwargs: dict[str, Any], message: str
) -> None:
    if kwargs["amqp_connection"] == "conn":
        kwargs = {**kwargs, "amqp_connection": app_connection}
    with pytest.raises(ConfigurationError, match=message):
        Queue(**kwargs)
