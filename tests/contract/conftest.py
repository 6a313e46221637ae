"""Fixtures of the broker contract suite: one parametrized broker, three backends.

``broker`` is a MemoryBroker (a unique ``MemoryBroker.named(...)`` per test), a
ReliableRedisBroker or a FastRedisBroker on the test Redis in the test's namespace. Every test
of ``test_broker_contract.py`` runs unchanged against each of them.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from blitzq.broker.base import Broker
from blitzq.broker.memory import MemoryBroker
from blitzq.broker.redis import FastRedisBroker, ReliableRedisBroker

BROKER_KINDS = ["memory", "reliable", "fast"]


@pytest.fixture(params=BROKER_KINDS)
def broker_kind(request: pytest.FixtureRequest) -> str:
    """Which backend this run of a contract test uses."""
    return str(request.param)


@pytest.fixture
async def make_broker(
    broker_kind: str, request: pytest.FixtureRequest
) -> AsyncIterator[Callable[[], Broker]]:
    """Factory of broker instances sharing one store (same memory name / Redis namespace).

    Each call returns a new instance (a second "process" for Redis); all are closed after the
    test. The Redis fixtures are only requested for the Redis backends.
    """
    made: list[Broker] = []
    if broker_kind == "memory":
        name = "contract-" + uuid.uuid4().hex

        def factory() -> Broker:
            broker = MemoryBroker.named(name)
            made.append(broker)
            return broker
    else:
        url: str = request.getfixturevalue("redis_url")
        namespace: str = request.getfixturevalue("namespace")
        cls: Any = ReliableRedisBroker if broker_kind == "reliable" else FastRedisBroker

        def factory() -> Broker:
            broker: Broker = cls(url, namespace)
            made.append(broker)
            return broker

    yield factory
    for broker in made:
        await broker.close()


@pytest.fixture
def broker(make_broker: Callable[[], Broker]) -> Broker:
    """The broker under test."""
    return make_broker()
