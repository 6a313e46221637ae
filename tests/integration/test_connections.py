"""Connections: a bounded blocking pool, bounded fan-out, timeouts on a silent network.

Issue 8 §2 and §3, against a real server (and a small asyncio TCP server that accepts and
never answers). Load alone is never an error: many concurrent callers queue for a connection
of a small pool; result and workflow waits keep their timeout whatever the network does; a
blocking fetch longer than the socket timeout is cut below it instead of failing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from blitzq import BrokerError, ConfigurationError, Queue, current_task, group
from blitzq.broker.redis import client as redis_client

from ..conftest import free_port
from .proc_tasks import make_worker, running


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


def with_params(url: str, **params: object) -> str:
    """``url`` with query parameters added."""
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return url + ("&" if "?" in url else "?") + query


def register(queue: Queue) -> None:
    """The tasks of these tests, on ``queue`` (producer and worker Queues alike)."""

    @queue.task(name="conn.echo")
    async def echo(value: int) -> int:
        return value

    @queue.task(name="conn.stepped")
    async def stepped(steps: int) -> int:
        ctx = current_task()
        assert ctx is not None
        for i in range(steps):
            ctx.update_progress(i + 1, steps)
            await asyncio.sleep(0.05)
        return steps


@pytest.fixture
def small_pool_queue(
    make_queue: Callable[..., Queue], redis_url: str, mode: str
) -> Callable[[int], Queue]:
    """A producer Queue whose pool holds ``n`` connections (``max_connections`` in the URL)."""

    def make(n: int) -> Queue:
        queue = make_queue(redis_url=with_params(redis_url, max_connections=n), mode=mode)
        register(queue)
        return queue

    return make


@pytest.fixture
def worker_queue(make_queue: Callable[..., Queue], mode: str) -> Queue:
    """A Queue of its own (default pool) for the worker of a test."""
    queue = make_queue(mode=mode)
    register(queue)
    return queue


# ------------------------------------------------------------------ pool
def test_pool_defaults_are_a_bounded_blocking_pool_and_the_url_overrides_them(
    make_queue: Callable[..., Queue], redis_url: str
) -> None:
    queue = make_queue()
    client = queue._make_broker().state.client  # type: ignore[attr-defined]
    pool = client.connection_pool
    assert isinstance(pool, aioredis.BlockingConnectionPool)
    assert pool.max_connections == redis_client.DEFAULT_MAX_CONNECTIONS == 50
    assert pool.timeout == redis_client.DEFAULT_POOL_TIMEOUT == 20.0
    kwargs = pool.connection_kwargs
    assert kwargs["socket_timeout"] == redis_client.DEFAULT_SOCKET_TIMEOUT == 5.0
    assert kwargs["socket_connect_timeout"] == redis_client.DEFAULT_CONNECT_TIMEOUT == 5.0
    assert kwargs["health_check_interval"] == redis_client.DEFAULT_HEALTH_CHECK_INTERVAL == 30
    if redis_url.startswith("redis"):
        assert kwargs["socket_keepalive"] is True

    url = with_params(
        redis_url,
        max_connections=7,
        timeout=3,
        socket_timeout=9,
        socket_connect_timeout=2,
        health_check_interval=11,
    )
    pool = make_queue(redis_url=url)._make_broker().state.client.connection_pool  # type: ignore[attr-defined]
    assert (pool.max_connections, pool.timeout) == (7, 3.0)
    kwargs = pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (9.0, 2.0)
    assert kwargs["health_check_interval"] == 11

    with pytest.raises(ConfigurationError, match="max_connections"):
        make_queue(redis_url=with_params(redis_url, max_connections="many"))._make_broker()
    with pytest.raises(ConfigurationError, match="socket_keepalive"):
        make_queue(redis_url="unix:///tmp/x.sock?socket_keepalive=true")._make_broker()


@pytest.mark.parametrize(
    ("params", "needle"),
    [
        # Issue inputs: unknown names used to raise redis-py's TypeError on first use, the
        # out-of-range values were accepted and failed every command (or never limited).
        ({"max_connection": "5"}, "max_connection"),
        ({"bogus_param": "1"}, "bogus_param"),
        ({"max_connections": "0"}, "max_connections"),
        ({"max_connections": "-5"}, "max_connections"),
        ({"timeout": "-1"}, "timeout"),
        ({"timeout": "0"}, "timeout"),
        ({"socket_keepalive": "maybe"}, "socket_keepalive"),
        ({"socket_timeout": "0"}, "socket_timeout"),
        ({"socket_timeout": "-3"}, "socket_timeout"),
        ({"socket_timeout": "nan"}, "socket_timeout"),
        ({"socket_connect_timeout": "inf"}, "socket_connect_timeout"),
        ({"health_check_interval": "-1"}, "health_check_interval"),
        ({"retry_on_timeout": "perhaps"}, "retry_on_timeout"),
    ],
)
def test_bad_url_options_are_configuration_errors_when_the_broker_is_made(
    make_queue: Callable[..., Queue], redis_url: str, params: dict[str, str], needle: str
) -> None:
    if not redis_url.startswith("redis") and "socket_keepalive" in params:
        pytest.skip("socket_keepalive is refused on unix:// sockets for another reason")
    with pytest.raises(ConfigurationError, match=needle):
        make_queue(redis_url=with_params(redis_url, **params))._make_broker()


@pytest.mark.parametrize("size", [1, 2])
async def test_a_worker_refuses_a_pool_it_cannot_run_on(
    make_queue: Callable[..., Queue], redis_url: str, size: int
) -> None:
    """Issue input: a worker with max_connections=1 or 2 started, warned, then never fetched
    ("No connection available" every 20 s). It refuses to start, naming the minimum."""
    queue = make_queue(redis_url=with_params(redis_url, max_connections=size))
    register(queue)
    try:
        with pytest.raises(ConfigurationError, match="needs at least 3") as caught:
            await asyncio.wait_for(make_worker(queue, handle_signals=False).run(), 30)
        assert "max_connections" in str(caught.value)
    finally:
        await queue.close()


@pytest.mark.timeout(120)
async def test_a_worker_on_a_tight_pool_warns_and_works(
    make_queue: Callable[..., Queue], redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """3 connections is tight for a worker (a warning) but it runs its tasks (the producer
    and its result wait on their own Queue, as in a deployment)."""
    queue = make_queue(redis_url=with_params(redis_url, max_connections=3))
    producer = make_queue()
    register(queue)
    register(producer)
    caplog.set_level(logging.WARNING, logger="blitzq.worker")
    try:
        async with running(make_worker(queue)):
            handle = await producer.tasks["conn.echo"].enqueue(7)
            assert await handle.result(timeout=60) == 7
        assert any("raise max_connections" in r.getMessage() for r in caplog.records)
    finally:
        await queue.close()
        await producer.close()


def test_good_url_options_still_accepted(make_queue: Callable[..., Queue], redis_url: str) -> None:
    """The checks refuse only bad values: these edge values are fine."""
    url = with_params(redis_url, max_connections="1", timeout="0.001", socket_timeout="0.5")
    make_queue(redis_url=url)._make_broker()
    if redis_url.startswith("redis"):
        make_queue(redis_url=with_params(redis_url, socket_keepalive="false"))._make_broker()
    make_queue(redis_url=with_params(redis_url, health_check_interval="0"))._make_broker()


async def test_200_concurrent_enqueues_from_one_queue_all_succeed(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    """Issue input: asyncio.gather of 200 enqueue() calls from one Queue (100 used to fail
    with "Too many connections")."""
    queue = make_queue(mode=mode)
    register(queue)
    echo = queue.tasks["conn.echo"]
    try:
        handles = await asyncio.gather(*(echo.enqueue(i) for i in range(200)))
        assert len({h.id for h in handles}) == 200
        stats = await queue.stats([queue.name])
        assert stats["queues"][queue.name]["waiting"] == 200
    finally:
        await queue.close()


async def test_200_concurrent_enqueues_queue_for_a_pool_of_4(
    small_pool_queue: Callable[[int], Queue],
) -> None:
    queue = small_pool_queue(4)
    echo = queue.tasks["conn.echo"]
    try:
        handles = await asyncio.gather(*(echo.enqueue(i) for i in range(200)))
        assert len(handles) == 200
        stats = await queue.stats([queue.name])
        assert stats["queues"][queue.name]["waiting"] == 200
        assert queue.broker.state.client.connection_pool.max_connections == 4  # type: ignore[attr-defined]
    finally:
        await queue.close()


@pytest.mark.timeout(120)
def test_200_threads_calling_the_sync_api_queue_for_a_pool_of_4(
    small_pool_queue: Callable[[int], Queue],
) -> None:
    """A threaded web app: every ``*_sync`` call runs on the Queue's one background loop and
    its pool; 200 threads at once wait for a connection instead of failing."""
    from concurrent.futures import ThreadPoolExecutor

    queue = small_pool_queue(4)
    echo = queue.tasks["conn.echo"]
    try:
        with ThreadPoolExecutor(max_workers=200) as pool:
            ids = list(pool.map(lambda i: echo.enqueue_sync(i).id, range(200)))
        assert len(set(ids)) == 200
        stats = queue.stats_sync([queue.name])
        assert stats["queues"][queue.name]["waiting"] == 200
    finally:
        queue.close_sync()


@pytest.mark.timeout(120)
async def test_group_of_100_waited_with_no_worker_for_3_s_then_completes(
    small_pool_queue: Callable[[int], Queue], worker_queue: Queue
) -> None:
    """Issue input: apply a group of 100, no worker for 3 s, then get(timeout=...): the
    liveness check used to read 100 records at once (MaxConnectionsError after 2 s). The
    producer's pool here has 4 connections."""
    queue = small_pool_queue(4)
    echo = queue.tasks["conn.echo"]
    try:
        handle = await queue.apply(group(echo.si(i) for i in range(100)))
        waiting = asyncio.ensure_future(handle.get(timeout=60))
        await asyncio.sleep(3)  # the scenario: nobody runs the steps for 3 s
        assert not waiting.done(), waiting
        async with running(make_worker(worker_queue)):
            assert await waiting == list(range(100))
    finally:
        await queue.close()
        await worker_queue.close()


@pytest.mark.timeout(120)
async def test_get_results_of_300_tasks_through_a_pool_of_4(
    small_pool_queue: Callable[[int], Queue], worker_queue: Queue
) -> None:
    queue = small_pool_queue(4)
    echo = queue.tasks["conn.echo"]
    try:
        first = await echo.enqueue_many([((i,), {}) for i in range(150)])
        async with running(make_worker(worker_queue)):
            await queue.get_results(first, timeout=60)  # final before the next call: read at once
            rest = await echo.enqueue_many([((i,), {}) for i in range(150, 300)])
            results = await queue.get_results([*first, *rest], timeout=60)
        assert results == list(range(300))
    finally:
        await queue.close()
        await worker_queue.close()


@pytest.mark.timeout(120)
async def test_many_progress_watchers_share_the_pool_of_4(
    small_pool_queue: Callable[[int], Queue], worker_queue: Queue
) -> None:
    """A watcher used to hold a pub/sub connection of its own: 12 watchers on a pool of 4
    would wait for a connection until the pool timeout."""
    queue = small_pool_queue(4)
    stepped = queue.tasks["conn.stepped"]
    try:
        handles = [await stepped.enqueue(3) for _ in range(12)]

        async def watch(task_id: str) -> list[int]:
            return [p.current async for p in queue.watch_progress(task_id, timeout=60)]

        watchers = [asyncio.ensure_future(watch(h.id)) for h in handles]
        async with running(make_worker(worker_queue)):
            seen = await asyncio.gather(*watchers)
        for currents in seen:
            assert currents
            assert currents[-1] == 3
    finally:
        await queue.close()
        await worker_queue.close()


@pytest.mark.timeout(60)
async def test_a_block_longer_than_the_socket_timeout_is_cut_below_it(
    make_queue: Callable[..., Queue], redis_url: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """socket_timeout=1 and block_timeout=3: the blocking XREADGROUP / BLMPOP must not end
    in a read timeout (the fetch would fail and back off); it blocks under 1 s and repeats."""
    queue = make_queue(redis_url=with_params(redis_url, socket_timeout=1), mode=mode)
    register(queue)
    echo = queue.tasks["conn.echo"]
    caplog.set_level(logging.WARNING, logger="blitzq")
    try:
        worker = make_worker(queue, block_timeout=3.0)
        async with running(worker):
            started = time.monotonic()
            while time.monotonic() - started < 2.5:  # idle: several blocks of the fetch loop
                await asyncio.sleep(0.1)
            handle = await echo.enqueue(7)
            assert await handle.result(timeout=30) == 7
        failures = [r for r in caplog.records if "fetch from" in r.getMessage()]
        assert failures == []
    finally:
        await queue.close()


# -------------------------------------------------------- silent network
@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[str]:
    """A TCP server that accepts connections and never answers; yields its redis:// URL."""
    held: list[asyncio.StreamWriter] = []

    async def hold(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        for writer in held:
            writer.close()
        server.close()


async def _timed(call: Any) -> tuple[float, BaseException | None, Any]:
    started = time.monotonic()
    try:
        value = await call
    except BaseException as exc:
        return time.monotonic() - started, exc, None
    return time.monotonic() - started, None, value


@pytest.mark.timeout(90)
async def test_nothing_hangs_on_a_server_that_never_answers() -> None:
    """Issue input: enqueue() and get_result(id, timeout=2) used to be blocked after 15 s."""
    async with silent_server() as url:
        queue = Queue(redis_url=url, namespace="silent")
        register(queue)
        echo = queue.tasks["conn.echo"]
        try:
            elapsed, exc, _ = await _timed(echo.enqueue(1))
            assert isinstance(exc, BrokerError), exc
            assert elapsed < 15  # the socket timeout (5 s by default), not a hang

            elapsed, exc, _ = await _timed(queue.get_result("some-id", timeout=2))
            assert isinstance(exc, BrokerError), exc
            assert elapsed < 2 + 3  # the timeout plus a small bound

            elapsed, exc, _ = await _timed(queue.workflow("some-workflow").get(timeout=2))
            assert isinstance(exc, BrokerError), exc
            assert elapsed < 2 + 3

            elapsed, exc, _ = await _timed(queue.get_results(["a", "b"], timeout=2))
            assert isinstance(exc, BrokerError), exc
            assert elapsed < 2 + 3  # the first read of the records keeps the deadline too

            # Issue input: get_results(timeout=2) took the socket timeout (5 s, 15 s with
            # socket_timeout=15) because its first read of the records had no deadline.
            slow = Queue(redis_url=url + "?socket_timeout=15", namespace="silent")
            try:
                elapsed, exc, _ = await _timed(slow.get_results(["a", "b"], timeout=2))
                assert isinstance(exc, BrokerError), exc
                assert elapsed < 2 + 3
                elapsed, exc, _ = await _timed(slow.get_results(["a"] * 300, timeout=0.5))
                assert isinstance(exc, BrokerError), exc
                assert elapsed < 0.5 + 3
            finally:
                await slow.close()

            # The waits that gave up left no waiter behind on the shared pub/sub listener.
            listener = queue.broker.state.conn._results  # type: ignore[attr-defined]
            deadline = time.monotonic() + 10
            while (listener._waiters or listener._pattern_waiters) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert listener._waiters == {}
            assert listener._pattern_waiters == {}
        finally:
            await queue.close()


@pytest.mark.timeout(60)
def test_result_sync_keeps_its_timeout_on_a_server_that_never_answers() -> None:
    """The sync twin (the Queue's background loop) keeps the timeout too. The server is a
    listening socket that never accepts: the kernel completes the handshake, nobody reads."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        queue = Queue(redis_url=f"redis://127.0.0.1:{port}/0", namespace="silent")
        try:
            started = time.monotonic()
            with pytest.raises(BrokerError):
                queue.get_result_sync("some-id", timeout=2)
            assert time.monotonic() - started < 2 + 3
            started = time.monotonic()
            with pytest.raises(BrokerError):  # issue input: took the socket timeout
                queue.get_results_sync(["a", "b", "c"], timeout=0.5)
            assert time.monotonic() - started < 0.5 + 3
        finally:
            queue.close_sync()


async def test_a_dead_port_fails_fast() -> None:
    """Connection refused is retried briefly (3 times, backoff up to 0.5 s), then raised."""
    queue = Queue(redis_url=f"redis://127.0.0.1:{free_port()}/0", namespace="dead")
    register(queue)
    try:
        elapsed, exc, _ = await _timed(queue.tasks["conn.echo"].enqueue(1))
        assert isinstance(exc, BrokerError)
        assert exc.transient
        assert elapsed < 15
    finally:
        await queue.close()
