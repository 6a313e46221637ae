"""Fast mode's pops (``broker/redis/popping.py``) on a real server: a reply that arrived
while the event loop could not run is read, not dropped; a connection that never answers
still ends the read, and is closed rather than reused.

The pause is the event loop blocked in the test's own thread (as a SIGSTOP or a long GC
pause blocks a worker's), for longer than the whole deadline; the dead connection is a
half-open one through the fault proxy. ``REPLY_WAIT`` and ``socket_timeout`` are shortened
so the deadline is about a second.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis
from redis.exceptions import TimeoutError as RedisTimeoutError

from blitzq.broker.redis import popping
from blitzq.broker.redis.client import make_client
from blitzq.broker.redis.popping import Popper
from tests.chaos.proxy import FaultProxy

pytestmark = pytest.mark.timeout(60)

BLOCK = 0.3


def with_params(url: str, **params: object) -> str:
    """``url`` with query parameters added."""
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return url + ("&" if "?" in url else "?") + query


@pytest.fixture(autouse=True)
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pop waits its block plus 0.5 s (instead of 30 s) for its reply."""
    monkeypatch.setattr(popping, "REPLY_WAIT", 0.5)


@pytest.fixture
def key(namespace: str) -> str:
    """A list of the test's namespace."""
    return "{" + namespace + "}:l:" + uuid.uuid4().hex[:8]


@pytest.fixture
async def client(server_url: str) -> AsyncIterator[Any]:
    """A blitzq client with a 0.5 s socket timeout."""
    made = make_client(with_params(server_url, socket_timeout="0.5"))
    yield made
    await made.aclose()


async def test_a_reply_that_came_while_the_loop_was_blocked_is_read(
    client: Any, server_url: str, key: str
) -> None:
    popper = Popper(client)
    await client.ping()  # the pool's connection is open: the pop below is sent at once
    pop = asyncio.ensure_future(
        popper.execute_command("BLMPOP", BLOCK, 1, key, "LEFT", "COUNT", 1, block=BLOCK)
    )
    await asyncio.sleep(0.05)  # the pop is written and blocked on the server
    with redis.Redis.from_url(server_url) as other:
        # The loop is blocked from here on (a paused worker), for over the whole deadline
        # (block + REPLY_WAIT: 0.8 s) and over socket_timeout (0.5 s).
        other.rpush(key, b"m")
        time.sleep(2.0)
        assert other.llen(key) == 0  # popped: the reply waits in this process's socket
    assert await pop == [key.encode(), [b"m"]]
    # The connection goes on serving (the reply was read, nothing left unread on it).
    assert await popper.execute_command("LPOP", key, 5) is None


async def test_a_pop_without_a_reply_ends_and_its_connection_is_not_reused(
    server_url: str, key: str
) -> None:
    url = urlsplit(server_url)
    if url.scheme != "redis" or url.hostname is None or url.port is None:
        pytest.skip("the fault proxy forwards TCP only")
    proxy = FaultProxy(url.hostname, url.port)
    proxy.start()
    client = make_client(with_params(proxy.url, socket_timeout="0.5", max_connections="1"))
    try:
        popper = Popper(client)
        await client.ping()
        assert proxy.half_open() == 1  # the pool's only connection: open, and silent
        with pytest.raises(RedisTimeoutError, match="no reply to BLMPOP"):
            await popper.execute_command("BLMPOP", BLOCK, 1, key, "LEFT", "COUNT", 1, block=BLOCK)
        with redis.Redis.from_url(server_url) as other:
            other.rpush(key, b"after")
        # The silent connection was closed (the pool holds one): the next pop opens a new
        # one and gets the message, where the frozen one would have timed out again.
        assert await popper.execute_command("LPOP", key, 5) == [b"after"]
    finally:
        await client.aclose()
        proxy.stop()


async def test_pops_in_flight_share_the_watch_and_each_ends_at_its_own_deadline(
    server_url: str, client: Any, key: str
) -> None:
    """One timer checks every pop in flight (``popping._Watch``): the one whose reply never
    comes ends at its deadline, while a longer one beside it still gets its message, and the
    watch is idle once none is in flight."""
    url = urlsplit(server_url)
    if url.scheme != "redis" or url.hostname is None or url.port is None:
        pytest.skip("the fault proxy forwards TCP only")
    proxy = FaultProxy(url.hostname, url.port)
    proxy.start()
    silent = make_client(with_params(proxy.url, socket_timeout="0.5", max_connections="1"))
    try:
        await silent.ping()
        await client.ping()
        assert proxy.half_open() == 1
        long_block = 1.5  # its deadline: 2.0 s; the silent pop's: 0.8 s
        lost = asyncio.ensure_future(
            Popper(silent).execute_command("BLMPOP", BLOCK, 1, key, "LEFT", "COUNT", 1, block=BLOCK)
        )
        kept = asyncio.ensure_future(
            Popper(client).execute_command(
                "BLMPOP", long_block, 1, key, "LEFT", "COUNT", 1, block=long_block
            )
        )
        with pytest.raises(RedisTimeoutError, match="no reply to BLMPOP"):
            await lost
        assert not kept.done()  # the silent pop's end ended nothing else
        await client.rpush(key, b"m")
        assert await kept == [key.encode(), [b"m"]]
        watch = popping._watch(asyncio.get_running_loop())
        assert not watch._reads  # nothing watched once no pop is in flight
    finally:
        await silent.aclose()
        proxy.stop()
