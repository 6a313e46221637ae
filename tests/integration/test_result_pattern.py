"""Result waits served by the completion pattern (``broker/redis/result_listener.py``, issue 13).

A producer waiting for results keeps one ``PSUBSCRIBE {ns}:done:*``; a handle from the fast
enqueue path carries a mark that lets its wait skip the first read. What a user relies on:
every wait gets its task's result, whether it starts before or after the completion, twice on
the same handle, while other tasks' completions flood the pattern (it is then paused), and
across a reconnect of the listener's connection. No timing is asserted.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from blitzq import BrokerError, Queue
from blitzq.broker.redis import result_listener as listener_module
from blitzq.broker.redis.keys import glob_escape
from blitzq.broker.redis.result_listener import ResultListener

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(params=["reliable", "fast"])
async def queues(
    request: pytest.FixtureRequest, make_queue: Callable[..., Queue]
) -> AsyncIterator[tuple[Queue, Queue]]:
    """A producer Queue and a worker Queue (two brokers, two listeners) on one namespace."""
    producer = make_queue(mode=request.param)
    consumer = make_queue(mode=request.param)
    yield producer, consumer
    await producer.close()
    await consumer.close()


async def _tick() -> None:
    """A probe for :func:`eventually` that only lets the loop run."""
    await asyncio.sleep(0)


def listener_of(queue: Queue) -> ResultListener:
    """The Queue's result listener (of this loop's broker)."""
    found: ResultListener = queue.broker.state.conn._results  # type: ignore[attr-defined]
    return found


def register(producer: Queue, consumer: Queue) -> tuple[Any, Any, asyncio.Event]:
    """The same two tasks on both Queues: ``double`` and ``gated`` (waits for the event)."""
    gate = asyncio.Event()
    tasks = []
    for q in (producer, consumer):

        @q.task(name="pattern.double")
        async def double(x: int) -> int:
            return 2 * x

        @q.task(name="pattern.gated")
        async def gated(x: int) -> int:
            await gate.wait()
            return x

        tasks.append((double, gated))
    return tasks[0][0], tasks[0][1], gate


def test_glob_escape_matches_the_namespace_literally() -> None:
    assert glob_escape("{a*b?[c]\\d}:done:") == "{a\\*b\\?\\[c\\]\\\\d}:done:"
    assert glob_escape("{plain}:done:") == "{plain}:done:"


def test_a_mark_of_one_listener_never_vouches_in_another() -> None:
    """Two brokers (two event loops) of one Queue: their marks' epochs never meet."""
    first, second = ResultListener(None, "{a}:done:"), ResultListener(None, "{a}:done:")  # type: ignore[arg-type]
    assert first._epoch != second._epoch
    epoch = first._epoch
    first._forget()
    assert first._epoch not in (epoch, second._epoch)


async def test_sequential_round_trips_use_the_pattern_and_answer_each_task(
    queues: tuple[Queue, Queue],
) -> None:
    producer, consumer = queues
    double, _, _ = register(producer, consumer)
    async with running(make_worker(consumer, concurrency=4)):
        for i in range(40):
            handle = await double.enqueue(i)
            assert await handle.result(timeout=20) == 2 * i
        listener = listener_of(producer)
        assert listener._pattern_on is not None
        assert listener._pattern_on.done()
        assert handle._since is not None  # the fast path marked it: its wait read nothing
        assert listener._waiters == {}  # no channel of its own was subscribed
        assert listener._pattern_waiters == {}


async def test_a_wait_that_starts_after_the_completion_still_gets_the_result(
    queues: tuple[Queue, Queue], raw_redis: Any
) -> None:
    producer, consumer = queues
    double, _, _ = register(producer, consumer)
    async with running(make_worker(consumer, concurrency=4)):
        assert await (await double.enqueue(0)).result(timeout=20) == 0  # the pattern is on
        handle = await double.enqueue(21)
        record = producer.broker.state.keys.record(handle.id)  # type: ignore[attr-defined]
        await eventually(lambda: raw_redis.exists(record), lambda n: n == 1)
        assert await handle.result(timeout=20) == 42
        assert await handle.result(timeout=20) == 42  # twice on the same handle
        # The recent completions forgotten (as after a reconnect): the wait reads instead.
        listener_of(producer)._forget()
        assert await handle.result(timeout=20) == 42
        assert await producer.get_result(handle.id, timeout=20) == 42


async def test_a_flood_of_other_completions_pauses_the_pattern_and_waits_still_answer(
    queues: tuple[Queue, Queue], raw_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listener_module, "FLOOD_LIMIT", 5)
    producer, consumer = queues
    double, gated, gate = register(producer, consumer)
    async with running(make_worker(consumer, concurrency=4)):
        assert await (await double.enqueue(1)).result(timeout=20) == 2
        pending = await gated.enqueue(7)
        waiting = asyncio.create_task(pending.result(timeout=30))
        listener = listener_of(producer)
        await eventually(_tick, lambda _: bool(listener._pattern_waiters))
        keys = producer.broker.state.keys  # type: ignore[attr-defined]
        for _ in range(20):  # completions nobody here waits for
            await raw_redis.publish(keys.done_channel(uuid.uuid4().hex), b"1")
        await eventually(_tick, lambda _: listener.token() is None)  # paused
        gate.set()
        assert await waiting == 7
        for i in range(5):  # now one channel per wait
            assert await (await double.enqueue(i)).result(timeout=20) == 2 * i


async def test_a_reconnect_of_the_listener_loses_no_result(
    queues: tuple[Queue, Queue], raw_redis: Any
) -> None:
    producer, consumer = queues
    double, gated, gate = register(producer, consumer)
    async with running(make_worker(consumer, concurrency=4)):
        assert await (await double.enqueue(1)).result(timeout=20) == 2
        pending = await gated.enqueue(9)
        waiting = asyncio.create_task(pending.result(timeout=30))
        listener = listener_of(producer)
        await eventually(_tick, lambda _: bool(listener._pattern_waiters))
        epoch = listener._epoch
        writer = listener._pubsub.connection._writer
        sockname = writer.get_extra_info("sockname")
        if isinstance(sockname, tuple):  # TCP: the server drops the connection
            addr = f"{sockname[0]}:{sockname[1]}"
            killed = await raw_redis.execute_command("CLIENT", "KILL", "ADDR", addr)
            assert killed in (b"OK", "OK", 1)
        else:  # a Unix socket (the embedded server): every client has the same address
            writer.transport.abort()
        gate.set()
        assert await waiting == 9
        # The listener saw the pattern subscribed again: marks taken before no longer vouch.
        await eventually(_tick, lambda _: listener._epoch > epoch)
        for i in range(5):
            assert await (await double.enqueue(i)).result(timeout=20) == 2 * i


async def test_a_result_too_big_to_push_is_read(
    queues: tuple[Queue, Queue], raw_redis: Any
) -> None:
    """A record over 4096 bytes is announced with ``1``, not pushed: the wait reads it."""
    producer, consumer = queues
    for q in (producer, consumer):

        @q.task(name="pattern.big")
        async def big(n: int) -> str:
            return "x" * n

    async with running(make_worker(consumer, concurrency=4)):
        assert await (await big.enqueue(10)).result(timeout=20) == "x" * 10
        assert await (await big.enqueue(10_000)).result(timeout=20) == "x" * 10_000
        handle = await big.enqueue(20_000)
        record = producer.broker.state.keys.record(handle.id)  # type: ignore[attr-defined]
        await eventually(lambda: raw_redis.exists(record), lambda n: n == 1)
        assert await handle.result(timeout=20) == "x" * 20_000


async def test_the_pattern_goes_after_the_linger_and_comes_back_for_the_next_wait(
    queues: tuple[Queue, Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(listener_module, "PATTERN_LINGER", 0.05)
    producer, consumer = queues
    double, _, _ = register(producer, consumer)
    async with running(make_worker(consumer, concurrency=4)):
        old = await double.enqueue(1)
        assert await old.result(timeout=20) == 2
        listener = listener_of(producer)
        await eventually(_tick, lambda _: listener._pattern_on is None)  # PUNSUBSCRIBEd
        assert listener.token() is None
        assert await old.result(timeout=20) == 2  # its mark no longer vouches: read
        for i in range(3):
            assert await (await double.enqueue(i)).result(timeout=20) == 2 * i
        assert listener._pattern_on is not None


async def test_a_pool_with_no_free_connection_still_subscribes_and_gets_the_push(
    make_queue: Callable[..., Queue], server_url: str, raw_redis: Any
) -> None:
    """Every connection of the producer's pool busy (as when hundreds of waits poll at once,
    the stdlib demo's case): the completion pattern's subscriber has a connection of its own,
    so its PSUBSCRIBE is confirmed and the push arrives without waiting for the pool (it
    used to wait the pool's whole timeout, and every wait in the meantime fell back to
    re-reading, each logging that the pattern was not confirmed)."""
    sep = "&" if "?" in server_url else "?"
    producer = make_queue(redis_url=f"{server_url}{sep}max_connections=1&timeout=60")
    try:
        listener = listener_of(producer)
        pool = listener._client.connection_pool
        held = await pool.get_connection()  # the pool's only connection
        try:
            channel = producer.broker.state.keys.done_channel(uuid.uuid4().hex)  # type: ignore[attr-defined]
            fut = await asyncio.wait_for(listener.subscribe(channel), timeout=15)
            assert listener._pattern_on is not None
            assert listener._pattern_on.done()
            await raw_redis.publish(channel, b"pushed")
            assert await asyncio.wait_for(fut, timeout=15) == b"pushed"
            listener.release(channel, fut)
        finally:
            await pool.release(held)
    finally:
        await producer.close()


@pytest.mark.parametrize("served_by", ["pattern", "channel"])
async def test_a_wait_outliving_its_one_second_rereads_keeps_its_subscription(
    queues: tuple[Queue, Queue], served_by: str
) -> None:
    """Each second a wait reads its record again; its waiter is replaced in place (no new
    SUBSCRIBE, no waiter left behind) and the push still ends the wait."""
    producer, consumer = queues
    double, gated, gate = register(producer, consumer)
    listener = listener_of(producer)
    if served_by == "channel":
        listener._prefix = None  # as when the server refuses the pattern: a channel per wait
    renewed = []
    renew = listener.renew
    listener.renew = lambda channel, fut: renewed.append(channel) or renew(channel, fut)  # type: ignore[method-assign]
    async with running(make_worker(consumer, concurrency=4)):
        assert await (await double.enqueue(1)).result(timeout=20) == 2
        pending = await gated.enqueue(5)
        waiting = asyncio.create_task(pending.result(timeout=60))
        await eventually(_tick, lambda _: len(renewed) >= 2)  # two re-reads went by
        waiters = listener._pattern_waiters if served_by == "pattern" else listener._waiters
        assert [len(w) for w in waiters.values()] == [1]
        if served_by == "channel":
            assert len(listener._confirmed) == 1  # still the one subscription
        gate.set()
        assert await waiting == 5
        await eventually(_tick, lambda _: not waiters)


async def test_closing_ends_a_subscribe_left_running_by_a_wait_that_read_its_record(
    queues: tuple[Queue, Queue], raw_redis: Any
) -> None:
    """A wait whose first read finds the record leaves its subscribe running; the Queue's
    close ends it (a task left pending died with its event loop, a warning in users' tests)."""
    producer, consumer = queues
    double, _, _ = register(producer, consumer)
    async with running(make_worker(consumer, concurrency=4)):
        handle = await double.enqueue(21)  # the producer's first wait: no pattern yet
        record = producer.broker.state.keys.record(handle.id)  # type: ignore[attr-defined]
        await eventually(lambda: raw_redis.exists(record), lambda n: n == 1)
        assert await handle.result(timeout=20) == 42
        await producer.close()
    left = [
        t
        for t in asyncio.all_tasks()
        if "ResultListener" in getattr(t.get_coro(), "__qualname__", "")
    ]
    assert left == []
    assert listener_of(producer)._background == set()


def _registered(listener: ResultListener) -> int:
    """Waiters the listener holds (by pattern or by channel)."""
    by_channel = (*listener._pattern_waiters.values(), *listener._waiters.values())
    return sum(len(waiters) for waiters in by_channel)


async def test_closing_the_queue_ends_the_result_waits_in_flight_with_a_broker_error(
    queues: tuple[Queue, Queue],
) -> None:
    """Waits blocked on a task nobody runs, and waits only starting, end with a BrokerError
    (not transient) when the Queue is closed: never a CancelledError nobody asked for (it
    escaped ``except Exception``), never a wait that went on to its own timeout on
    connections it opened again."""
    producer, consumer = queues
    double, _, _ = register(producer, consumer)
    handle = await double.enqueue(1)  # no worker runs it
    broker = producer.broker
    listener: ResultListener = broker.state.conn._results  # type: ignore[attr-defined]
    blocked = [asyncio.create_task(handle.result(timeout=60)) for _ in range(5)]
    blocked.append(asyncio.create_task(producer.get_result(handle.id, timeout=60)))
    await eventually(_tick, lambda _: _registered(listener) == 6)
    starting = [asyncio.create_task(producer.get_result(f"no-{i}", timeout=60)) for i in range(5)]
    await asyncio.sleep(0)  # started: in their first read or subscribe
    async with asyncio.timeout(20):
        await producer.close()
        ended = await asyncio.gather(*blocked, *starting, return_exceptions=True)
    assert [type(e) for e in ended] == [BrokerError] * 11, ended
    assert not any(e.transient for e in ended)  # type: ignore[union-attr]
    assert listener.waits._active == 0
    assert listener._background == set()
    assert listener._pubsub is None  # no pub/sub connection opened again after the close
    pool = broker.state.client.connection_pool  # type: ignore[attr-defined]
    assert not any(
        c.is_connected for c in (*pool._available_connections, *pool._in_use_connections)
    )


def test_closing_a_queue_ends_sync_result_waits_in_other_threads(
    make_queue: Callable[..., Queue],
) -> None:
    """``close_sync()`` while threads block in ``result_sync()``: each gets a BrokerError
    (they got a ``concurrent.futures.CancelledError``)."""
    queue = make_queue()

    @queue.task(name="pattern.sync_never")
    def never() -> None: ...

    handle = never.enqueue_sync()  # no worker runs it
    outcomes: list[BaseException | None] = []

    def wait() -> None:
        try:
            handle.result_sync(timeout=60)
            outcomes.append(None)
        except BaseException as exc:  # what reaches the user's thread
            outcomes.append(exc)

    threads = [threading.Thread(target=wait) for _ in range(3)]
    for t in threads:
        t.start()
    queue.stats_sync()  # one more call on the same loop: the waits have started by now
    queue.close_sync()
    for t in threads:
        t.join(30)
    assert [type(e) for e in outcomes] == [BrokerError] * 3, outcomes
