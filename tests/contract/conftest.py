"""Fixtures of the broker contract suite: one parametrized broker, four backends.

``broker`` is a ReliableRedisBroker or a FastRedisBroker on the test Redis in the test's
namespace, or (``ephemeral``) a ReliableRedisBroker on this process's private ephemeral Valkey
(:mod:`blitzq.broker.redis.ephemeral`) in a namespace of its own: the server and code behind
``memory://``; or (``foreign``) a foreign pairing (``tests/foreign.py``): the Redis state
store in the test's namespace and a streams transport on another connection and namespace,
joined by the outbox relay as a RabbitMQ transport would be. ``cluster-reliable`` and
``cluster-fast`` are the Redis brokers on the session's local 3-primary Redis Cluster
(``redis_cluster`` in tests/conftest.py), reached through a node that does not own the
namespace's slot. Every contract test runs unchanged against each of them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from blitzq.broker import Broker
from blitzq.broker.redis import FastRedisBroker, ReliableRedisBroker, ephemeral
from tests.foreign import TRANSPORT_SUFFIX, ForeignPairing, delete_namespace

BROKER_KINDS = ["reliable", "fast", "ephemeral", "foreign", "cluster-reliable", "cluster-fast"]


@pytest.fixture(params=BROKER_KINDS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    """Which backend this run of a contract test uses."""
    return str(request.param)


@pytest.fixture
async def location(
    broker_kind: str, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[str, str]]:
    """``(url, namespace)`` of the store this run uses: the test Redis in the test's namespace,
    or (``ephemeral``) the ephemeral Valkey in a namespace of its own, deleted afterwards.

    The test-Redis fixtures are only requested for the ``reliable`` and ``fast`` backends.
    """
    if broker_kind.startswith("cluster-"):
        cluster = request.getfixturevalue("redis_cluster")
        namespace = "contract-" + uuid.uuid4().hex[:12]
        owner = cluster.owner("{" + namespace + "}:")
        yield cluster.url(next(p for p in cluster.ports if p != owner)), namespace
        async with RedisCluster.from_url(cluster.url()) as client:
            for pattern in ("{" + namespace + "}:*", "{" + namespace + "-t}:*"):
                keys = [key async for key in client.scan_iter(match=pattern)]
                for key in keys:
                    await client.delete(key)
        return
    if broker_kind != "ephemeral":
        yield request.getfixturevalue("redis_url"), request.getfixturevalue("namespace")
        return
    url = ephemeral.ensure_server()
    namespace = "contract-" + uuid.uuid4().hex[:12]
    yield url, namespace
    async with aioredis.Redis.from_url(url) as client:
        keys = [key async for key in client.scan_iter(match="{" + namespace + "}:*")]
        if keys:
            await client.delete(*keys)


@pytest.fixture
async def make_broker(
    broker_kind: str, location: tuple[str, str]
) -> AsyncIterator[Callable[[], Broker]]:
    """Factory of broker instances sharing one store (one Redis namespace).

    Each call returns a new instance (a second "process"); all are closed after the test.
    """
    made: list[Broker] = []
    url, namespace = location
    cls: Any = (
        ForeignPairing
        if broker_kind == "foreign"
        else (FastRedisBroker if broker_kind.endswith("fast") else ReliableRedisBroker)
    )

    def factory() -> Broker:
        broker: Broker = cls(url, namespace)
        made.append(broker)
        return broker

    yield factory
    for broker in made:
        await broker.close()
    if broker_kind == "foreign":
        await delete_namespace(url, namespace + TRANSPORT_SUFFIX)


@pytest.fixture
def broker(make_broker: Callable[[], Broker]) -> Broker:
    """The broker under test."""
    return make_broker()
