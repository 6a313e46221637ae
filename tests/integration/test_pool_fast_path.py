"""The pool's fast path (``broker/redis/client.py``, ``BoundedPool``): a connection taken
without redis-py's full checks is still one that is open and holds nothing unread.

Against a real server: a connection handed back with a reply nobody read, or closed, is
never reused as it is; the next command on the pool gets its own reply.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from blitzq.broker.redis import client as redis_client
from blitzq.broker.redis import pool as redis_pool

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def client(server_url: str) -> AsyncIterator[Any]:
    """A client on blitzq's bounded pool (the fast path on), closed after the test."""
    made = redis_client.make_client(server_url)
    assert made.connection_pool._lean, "these tests are about the fast path"
    try:
        yield made
    finally:
        await made.aclose()


async def _until_readable(connection: Any) -> None:
    """Wait until the reply sent to ``connection`` has arrived unread in its buffer."""
    async with asyncio.timeout(10):
        while not await connection.can_read():
            await asyncio.sleep(0.001)


async def test_a_connection_returned_with_an_unread_reply_is_not_reused_as_is(
    client: Any,
) -> None:
    key = f"pool-fast-{os.urandom(4).hex()}"
    await client.set(key, b"value")
    pool = client.connection_pool
    connection = await pool.get_connection()
    await connection.send_command("PING")  # its PONG is never read
    await _until_readable(connection)
    await pool.release(connection)
    try:
        for _ in range(3):  # every command gets its own reply, not the PONG left behind
            assert await client.get(key) == b"value"
    finally:
        await client.delete(key)


async def test_a_closed_connection_is_opened_again_before_use(client: Any) -> None:
    pool = client.connection_pool
    await client.ping()
    connection = await pool.get_connection()
    await connection.disconnect()
    await pool.release(connection)
    assert await client.echo(b"still here") == b"still here"
    assert not await connection.can_read()


async def test_the_fast_path_keeps_the_pool_counts(client: Any) -> None:
    pool = client.connection_pool
    await asyncio.gather(*(client.ping() for _ in range(20)))
    opened = len(pool._available_connections)
    assert opened >= 1
    assert not pool._in_use_connections
    for _ in range(50):
        await client.ping()
    assert len(pool._available_connections) == opened
    assert not pool._in_use_connections


def test_redis_py_full_path_where_connections_need_it() -> None:
    # A credential provider may re-authenticate connections as they are released.
    assert not redis_pool._lean_path_allowed({"credential_provider": object()})
    assert redis_pool._lean_path_allowed({"host": "127.0.0.1"})


async def test_a_command_larger_than_the_socket_buffer_is_written_whole(client: Any) -> None:
    # 24 MB: far more than the kernel takes at once, so the write waits for the rest.
    key = f"pool-big-{os.urandom(4).hex()}"
    value = os.urandom(1024) * (24 * 1024)
    try:
        await client.set(key, value)
        assert await client.strlen(key) == len(value)
        assert await client.get(key) == value
        assert await client.ping()
    finally:
        await client.delete(key)


async def test_a_connection_the_server_closed_is_replaced_and_the_command_runs(
    client: Any, raw_redis: Any
) -> None:
    key = f"pool-killed-{os.urandom(4).hex()}"
    own_id = await client.client_id()  # the pool's one connection
    await raw_redis.client_kill_filter(_id=own_id)
    try:
        assert await client.set(key, b"after") is True
        assert await client.get(key) == b"after"
        assert await client.client_id() != own_id
    finally:
        await client.delete(key)


async def test_a_write_on_a_lost_connection_opens_it_again_without_asyncio_warnings(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    pool = client.connection_pool
    await client.ping()
    connection = await pool.get_connection()
    try:
        connection._writer.transport.abort()  # lost: asyncio drops writes to it (and logs)
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            for _ in range(6):
                await connection.send_command("PING")
                assert await connection.read_response() == b"PONG"
        assert not [r for r in caplog.records if r.name == "asyncio"]
    finally:
        await pool.release(connection)


async def test_a_write_on_a_closed_connection_opens_it_first(client: Any) -> None:
    pool = client.connection_pool
    await client.ping()
    connection = await pool.get_connection()
    try:
        await connection.disconnect()
        await connection.send_command("ECHO", b"reopened")
        assert await connection.read_response() == b"reopened"
    finally:
        await pool.release(connection)


async def test_a_pubsub_connection_reset_meanwhile_is_a_connection_error(client: Any) -> None:
    async def reset_by_the_reader() -> None:
        raise AttributeError("'NoneType' object has no attribute 'writelines'")

    with pytest.raises(RedisConnectionError):
        await redis_client.pubsub_send(reset_by_the_reader())
    pubsub = redis_client.subscriber(client)
    try:
        await redis_client.pubsub_send(pubsub.subscribe("pool-fast-channel"))  # passes through
        assert await pubsub.get_message(timeout=5) is not None  # the confirmation
    finally:
        await pubsub.aclose()
