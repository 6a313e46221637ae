"""The pool's fast path (``broker/redis/client.py``, ``BoundedPool``): a connection taken
without redis-py's full checks is still one that is open and holds nothing unread.

Against a real server: a connection handed back with a reply nobody read, or closed, is
never reused as it is; the next command on the pool gets its own reply.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, NoScriptError, ResponseError

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


#: The connection class of blitzq's pools, and the redis-py class under it.
PACKING = redis_pool.direct_write(aioredis.connection.Connection)
REDIS_PY = aioredis.connection.Connection


def _both(*command: Any, **options: Any) -> tuple[bytes, bytes]:
    """``command`` packed by blitzq's connection class and by redis-py's own."""
    ours, theirs = PACKING(**options), REDIS_PY(**options)
    return b"".join(ours.pack_command(*command)), b"".join(theirs.pack_command(*command))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.text(), st.binary(), st.integers(), st.floats()), max_size=12))
def test_commands_are_packed_to_the_bytes_redis_py_makes(args: list[Any]) -> None:
    """hiredis packs exactly as redis-py's Python path: text as UTF-8, numbers by ``repr``,
    bytes as they are."""
    ours, theirs = _both("EVALSHA", *args)
    assert ours == theirs


def test_what_hiredis_refuses_is_packed_or_refused_as_by_redis_py() -> None:
    for command in (
        ("SET", memoryview(b"k"), bytearray(b"v")),  # hiredis takes neither type
        ("CLIENT SETNAME", "blitzq"),  # a name redis-py splits in two arguments
        (b"CONFIG GET", b"maxmemory"),
    ):
        ours, theirs = _both(*command)
        assert ours == theirs
    for bad in (True, None, object()):
        with pytest.raises(DataError):
            PACKING().pack_command("SET", "k", bad)
    ours, theirs = _both("SET", b"k", b"v", encoding="no-such-codec")  # redis-py's path
    assert ours == theirs
    ours, theirs = _both("SET", "k", "\u00e9", encoding="latin-1")
    assert ours == theirs == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n\xe9\r\n"


async def test_a_packed_command_round_trips_through_the_server(client: Any) -> None:
    key = f"pool-pack-{os.urandom(4).hex()}"
    try:
        await client.set(key, "na\u00efve \u2713")
        assert (await client.get(key)).decode() == "na\u00efve \u2713"
        await client.zadd(key + ":z", {"a": 0.1, "b": 1e100, "c": -3})
        assert await client.zrange(key + ":z", 0, -1, withscores=True) == [
            (b"c", -3.0), (b"a", 0.1), (b"b", 1e100),
        ]  # fmt: skip
    finally:
        await client.delete(key, key + ":z")


# ------------------------------------------- scripts run on the pool directly (run_direct)
async def test_direct_commands_only_on_a_plain_client_of_the_bounded_pool(
    client: Any, server_url: str
) -> None:
    assert redis_pool.direct_pool(client, "EVALSHA") is client.connection_pool
    # A command with a response callback keeps redis-py's path (its reply is parsed there).
    assert redis_pool.direct_pool(client, "SET") is None

    class Subclass(aioredis.Redis):  # Sentinel's client adds a WAIT to its commands
        pass

    other = Subclass(connection_pool=client.connection_pool)
    assert redis_pool.direct_pool(other, "EVALSHA") is None
    plain = aioredis.Redis.from_url(server_url)  # redis-py's own pool
    single = aioredis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
    try:
        assert redis_pool.direct_pool(plain, "EVALSHA") is None
        assert redis_pool.direct_pool(single, "EVALSHA") is None
    finally:
        await plain.aclose()
        await single.aclose(close_connection_pool=False)


async def test_a_direct_command_gets_its_reply_raises_error_replies_and_keeps_the_pool(
    client: Any,
) -> None:
    pool = client.connection_pool
    sha = await client.script_load("return {ARGV[1], #KEYS}")
    assert await redis_pool.run_direct(pool, ("EVALSHA", sha, 1, "k", b"\xff")) == [b"\xff", 1]
    with pytest.raises(NoScriptError):
        await redis_pool.run_direct(pool, ("EVALSHA", "0" * 40, 0))
    with pytest.raises(ResponseError, match="boom"):
        await redis_pool.run_direct(pool, ("EVAL", "return redis.error_reply('boom')", 0))
    # Every connection went back, none holds a reply: the next commands get their own.
    assert not pool._in_use_connections
    assert await client.echo(b"mine") == b"mine"


async def test_a_direct_command_on_a_connection_the_server_closed_is_sent_again(
    client: Any, raw_redis: Any
) -> None:
    sha = await client.script_load("return 'ran'")
    own_id = await client.client_id()  # the pool's one connection
    await raw_redis.client_kill_filter(_id=own_id)
    # The direct command writes on a connection the server closed: sent again on a new one.
    assert await redis_pool.run_direct(client.connection_pool, ("EVALSHA", sha, 0)) == b"ran"
    assert not client.connection_pool._in_use_connections
    assert await client.client_id() != own_id


async def test_a_wrapped_execute_command_sees_every_script_call(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Scripts skip ``execute_command`` only while it is redis-py's own: an instance's
    replacement (a test's injected fault, an application's hook) or a class-level wrapper
    (tracing instrumentation, which sets ``__wrapped__``) sees each call, even one made
    after the scripts' runner was."""
    from blitzq.broker.redis.scripts import Scripts

    scripts = Scripts(client)
    assert redis_pool.plain_execute(client)
    seen: list[Any] = []
    real = client.execute_command

    async def hook(*args: Any, **options: Any) -> Any:
        seen.append(args[0])
        return await real(*args, **options)

    client.execute_command = hook
    assert not redis_pool.plain_execute(client)
    assert await scripts.call("publish", ["blitzq-test:absent"], []) == 0
    assert seen == ["EVALSHA"]
    del client.execute_command

    original = aioredis.Redis.execute_command

    @functools.wraps(original)
    async def traced(self: Any, *args: Any, **options: Any) -> Any:
        seen.append(("traced", args[0]))
        return await original(self, *args, **options)

    monkeypatch.setattr(aioredis.Redis, "execute_command", traced)
    assert not redis_pool.plain_execute(client)
    assert await scripts.call("publish", ["blitzq-test:absent"], []) == 0
    assert seen[-1] == ("traced", "EVALSHA")
    monkeypatch.undo()
    assert redis_pool.plain_execute(client)
