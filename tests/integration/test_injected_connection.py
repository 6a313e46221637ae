"""``Queue(redis=...)``: a producer over the application's own redis.asyncio client or pool,
never closed by blitzq, refused where it cannot serve (a worker, another event loop, a
client that decodes replies), on a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from blitzq import ConfigurationError, Queue, Worker

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def app_client(server_url: str) -> AsyncIterator[aioredis.Redis]:
    """The application's own client (as a web app holds one), closed by the test."""
    client = aioredis.Redis.from_url(server_url)
    try:
        yield client
    finally:
        await client.aclose()


def _producer(connection: Any, namespace: str, **kwargs: Any) -> Queue:
    producer = Queue("inj", namespace=namespace, redis=connection, **kwargs)

    @producer.task(name="inj.add")
    async def add(a: int, b: int) -> int:
        return a + b

    return producer


async def _run_one(server_url: str, namespace: str, **kwargs: Any) -> None:
    """A worker with its own URL runs what is waiting, then stops."""
    consumer = Queue("inj", redis_url=server_url, namespace=namespace, **kwargs)

    @consumer.task(name="inj.add")
    async def add(a: int, b: int) -> int:
        return a + b

    worker = Worker(consumer, burst=True, handle_signals=False)
    await asyncio.wait_for(worker.run(), 30)
    await consumer.close()


@pytest.mark.parametrize("mode", ["reliable", "fast"])
@pytest.mark.parametrize("given", ["client", "pool"])
async def test_a_producer_enqueues_and_reads_results_over_the_apps_connection(
    app_client: aioredis.Redis, server_url: str, namespace: str, given: str, mode: str
) -> None:
    connection = app_client if given == "client" else app_client.connection_pool
    producer = _producer(connection, namespace, mode=mode)
    assert producer.connection_injected
    assert producer.url.startswith(("redis://", "unix://"))
    assert "@" not in producer.url  # no credentials
    handle = await producer.send("inj.add", [2, 3])
    await _run_one(server_url, namespace, mode=mode)
    assert await handle.result(timeout=10) == 5
    await producer.close()
    # The application's client and pool are untouched: open, with their own callbacks.
    assert await app_client.ping()
    callbacks = aioredis.Redis.from_url(server_url).response_callbacks
    assert app_client.response_callbacks.get("XREADGROUP") is callbacks.get("XREADGROUP")


async def test_a_worker_refuses_an_injected_connection(
    app_client: aioredis.Redis, namespace: str
) -> None:
    producer = _producer(app_client, namespace)
    with pytest.raises(ConfigurationError, match="connections of its own"):
        Worker(producer, handle_signals=False)


async def test_the_cli_url_wins_over_an_injected_connection(
    app_client: aioredis.Redis, server_url: str, namespace: str
) -> None:
    producer = _producer(app_client, namespace)
    producer._connect_to(server_url)  # what `blitzq --redis-url ... worker app:queue` does
    assert not producer.connection_injected
    Worker(producer, handle_signals=False)  # accepted now


async def test_another_event_loop_is_refused_with_the_reason(
    app_client: aioredis.Redis, namespace: str
) -> None:
    producer = _producer(app_client, namespace)
    await producer.send("inj.add", [1, 1])  # first used in this loop
    with pytest.raises(ConfigurationError, match="another loop"):  # from a thread, as a user
        await asyncio.to_thread(producer.send_sync, "inj.add", [1, 2])
    await asyncio.to_thread(producer.close_sync)
    await producer.close()


@pytest.mark.parametrize(
    ("connection", "message"),
    [
        (lambda url: aioredis.Redis.from_url(url, decode_responses=True), "decode_responses"),
        (lambda url: redis.Redis.from_url(url), "asyncio client"),
        (lambda url: "redis://localhost", "asyncio client"),
    ],
)
def test_unusable_connections_are_refused_at_construction(
    server_url: str, connection: Any, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Queue(redis=connection(server_url))


@pytest.mark.parametrize(
    "other", [{"redis_url": "redis://localhost"}, {"amqp_url": "amqp://guest:guest@localhost/"}]
)
def test_redis_goes_with_no_other_connection_setting(server_url: str, other: Any) -> None:
    with pytest.raises(ConfigurationError, match="one of redis="):
        Queue(redis=aioredis.Redis.from_url(server_url), **other)
