"""Fixtures of the broker contract suite: one parametrized broker, three backends.

``broker`` is a ReliableRedisBroker or a FastRedisBroker on the test Redis in the test's
namespace, or (``ephemeral``) a ReliableRedisBroker on this process's private ephemeral Valkey
(:mod:`blitzq.broker.redis.ephemeral`) in a namespace of its own: the server and code behind
``memory://``. Every contract test runs unchanged against each of them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from blitzq.broker import Broker
from blitzq.broker.redis import FastRedisBroker, ReliableRedisBroker, ephemeral

BROKER_KINDS = ["reliable", "fast", "ephemeral"]


@pytest.fixture(params=BROKER_KINDS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    """Which backend this run of a contract test uses."""
    return str(request.param)


@pytest.fixture
async def make_broker(
    broker_kind: str, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[[], Broker]]:
    """Factory of broker instances sharing one store (one Redis namespace).

    Each call returns a new instance (a second "process"); all are closed after the test.
    The test-Redis fixtures are only requested for the ``reliable`` and ``fast`` backends;
    the ``ephemeral`` one deletes its namespace's keys afterwards.
    """
    made: list[Broker] = []
    cleanup: tuple[str, str] | None = None
    if broker_kind == "ephemeral":
        url = ephemeral.ensure_server()
        namespace = "contract-" + uuid.uuid4().hex[:12]
        cleanup = (url, namespace)
    else:
        url = request.getfixturevalue("redis_url")
        namespace = request.getfixturevalue("namespace")
    cls: Any = FastRedisBroker if broker_kind == "fast" else ReliableRedisBroker

    def factory() -> Broker:
        broker: Broker = cls(url, namespace)
        made.append(broker)
        return broker

    yield factory
    for broker in made:
        await broker.close()
    if cleanup is not None:
        url, namespace = cleanup
        async with aioredis.Redis.from_url(url) as client:
            keys = [key async for key in client.scan_iter(match="{" + namespace + "}:*")]
            if keys:
                await client.delete(*keys)


@pytest.fixture
def broker(make_broker: Callable[[], Broker]) -> Broker:
    """The broker under test."""
    return make_broker()
