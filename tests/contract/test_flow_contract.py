"""Broker contract of the flow-control operations, on every backend.

fetch_first (priority levels), acquire_rate (token buckets), cancel / revoked, and the event
channel. Runs against ReliableRedisBroker and FastRedisBroker (the ``memory://`` code) through the
``broker`` fixture of ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import pytest

from blitzq.broker import Broker, Completion, Delivery, Scheduled
from blitzq.broker.amqp.transport import AmqpTransport
from blitzq.records import TaskRecord, TaskState
from blitzq.serialization import Envelope, decode_envelope, dumps, encode_envelope

LEVELS = ["flow:high", "flow", "flow:low"]
CONSUMER = "flow-consumer"


def message(task_id: str, queue: str = "flow") -> bytes:
    """A well-formed encoded envelope."""
    return encode_envelope(Envelope(task_id, "tests.flow.task", queue), 1 << 20)


def ids(deliveries: list[Delivery]) -> list[str]:
    """Task ids of deliveries, in order."""
    return [decode_envelope(d.payload).id for d in deliveries]


def cancelled_record(task_id: str) -> bytes:
    """The record ``Queue.cancel`` stores."""
    return dumps({"id": task_id, "task": "", "queue": "", "state": "cancelled"})


def state_record(task_id: str, state: str) -> bytes:
    """A record in ``state``."""
    return dumps({"id": task_id, "task": "tests.flow.task", "queue": "flow", "state": state})


async def ready(broker: Broker) -> Broker:
    """Prepare ``broker`` to fetch from the three levels."""
    await broker.prepare_consumer(LEVELS, CONSUMER)
    return broker


async def pushed(broker: Broker, queue: str, count: int) -> None:
    """On RabbitMQ, wait (up to 10 s) until its consumer of ``queue`` was pushed ``count``
    messages: a fetch takes what was pushed and reads the queue only when nothing is
    buffered (a ``basic.get`` is a log write on a quorum queue), so the order of levels holds
    among pushed messages (docs/architecture.md, ``broker/amqp/transport.py``). On a loaded
    machine a push can trail the publish's confirm; elsewhere there is nothing to wait for."""
    transport = broker.transport
    if not isinstance(transport, AmqpTransport):
        return
    async with asyncio.timeout(10):
        while True:
            consumer = transport.consumers.get(queue)
            if consumer is not None and len(consumer.buffer) >= count:
                return
            await asyncio.sleep(0.01)


# ----------------------------------------------------------------------------- fetch_first
async def test_fetch_first_drains_levels_in_the_order_given(broker: Broker) -> None:
    await ready(broker)
    await broker.publish("flow:low", [message("l1"), message("l2")])
    await broker.publish("flow", [message("n1"), message("n2"), message("n3")])
    await broker.publish("flow:high", [message("h1")])
    first = await broker.fetch_first(LEVELS, 3, 0)
    assert ids(first) == ["h1", "n1", "n2"]
    assert [d.queue for d in first] == ["flow:high", "flow", "flow"]
    second = await broker.fetch_first(LEVELS, 10, 0)
    assert ids(second) == ["n3", "l1", "l2"]
    assert [d.queue for d in second] == ["flow", "flow:low", "flow:low"]
    assert all(d.deliveries == 1 for d in first + second)
    assert await broker.fetch_first(LEVELS, 10, 0) == []
    # A new high message overtakes waiting normal ones.
    await broker.publish("flow", [message("n4")])
    await broker.publish("flow:high", [message("h2")])
    await pushed(broker, "flow:high", 1)
    assert ids(await broker.fetch_first(LEVELS, 1, 0)) == ["h2"]
    assert ids(await broker.fetch_first(LEVELS, 1, 0)) == ["n4"]


async def test_large_fetches_keep_the_order_of_levels(broker: Broker) -> None:
    # Batches of 32 messages or more from levels that had a backlog: the streams transport
    # then reads the levels one plain XREADGROUP each instead of its script.
    await ready(broker)
    await broker.publish("flow", [message(f"n{i}") for i in range(150)])
    first = await broker.fetch_first(LEVELS, 40, 0)  # a backlog: the next one reads plainly
    assert ids(first) == [f"n{i}" for i in range(40)]
    await broker.publish("flow:low", [message(f"l{i}") for i in range(50)])
    await broker.publish("flow:high", [message(f"h{i}") for i in range(30)])
    await pushed(broker, "flow:high", 30)
    second = await broker.fetch_first(LEVELS, 40, 0)
    assert ids(second) == [f"h{i}" for i in range(30)] + [f"n{i}" for i in range(40, 50)]
    assert [d.queue for d in second] == ["flow:high"] * 30 + ["flow"] * 10
    third = await broker.fetch_first(LEVELS, 120, 0)
    assert ids(third) == [f"n{i}" for i in range(50, 150)] + [f"l{i}" for i in range(20)]
    fourth = await broker.fetch_first(LEVELS, 40, 0)
    assert ids(fourth) == [f"l{i}" for i in range(20, 50)]
    assert await broker.fetch_first(LEVELS, 40, 0) == []
    got = first + second + third + fourth
    assert all(d.deliveries == 1 for d in got)
    assert len(got) == 230
    leases = [(d.queue, d.token) for d in got if d.token is not None]  # fast mode has none
    assert len(set(leases)) == len(leases)


async def test_fetch_first_deliveries_complete_like_fetch(broker: Broker) -> None:
    await ready(broker)
    await broker.publish("flow:high", [message("h")])
    await broker.publish("flow:low", [message("l")])
    got = await broker.fetch_first(LEVELS, 10, 0)
    await broker.complete(
        [Completion(d.queue, d.token, i, state_record(i, "succeeded"), 60) for d, i in
         zip(got, ids(got), strict=True)]
    )  # fmt: skip
    stats = await broker.queue_stats(LEVELS)
    assert all(s == {"waiting": 0, "in_flight": 0} for s in stats.values()), stats
    record = await broker.get_record("h")
    assert record is not None
    assert TaskRecord.from_bytes(record).state is TaskState.SUCCEEDED


@pytest.mark.parametrize("level", LEVELS)
async def test_fetch_first_blocks_on_every_level_at_once(broker: Broker, level: str) -> None:
    await ready(broker)
    fetch = asyncio.ensure_future(broker.fetch_first(LEVELS, 5, 5.0))
    await asyncio.sleep(0.1)
    assert not fetch.done()
    sent = time.monotonic()
    await broker.publish(level, [message("wake")])
    got = await asyncio.wait_for(fetch, 5.0)
    latency = time.monotonic() - sent
    assert ids(got) == ["wake"]
    assert got[0].queue == level
    assert latency < 3.0, latency  # woken, not timed out after its 5 s


async def test_fetch_first_without_a_look_keeps_the_level_order(broker: Broker) -> None:
    # The idle worker's blocking fetch skips its look (look_first=False): what arrived since
    # its last look is returned at once, the most urgent level first, at most one per level.
    await ready(broker)
    await broker.publish("flow:low", [message("l")])
    await broker.publish("flow", [message("n")])
    await broker.publish("flow:high", [message("h")])
    got = await asyncio.wait_for(broker.fetch_first(LEVELS, 1, 5.0, look_first=False), 5.0)
    assert ids(got)[0] == "h"
    queues = [d.queue for d in got]
    assert queues == sorted(set(queues), key=LEVELS.index), queues
    rest = await broker.fetch_first(LEVELS, 10, 0)
    assert sorted(ids(got) + ids(rest)) == ["h", "l", "n"]


@pytest.mark.parametrize("level", LEVELS)
async def test_fetch_first_without_a_look_blocks_on_every_level(broker: Broker, level: str) -> None:
    await ready(broker)
    fetch = asyncio.ensure_future(broker.fetch_first(LEVELS, 1, 5.0, look_first=False))
    await asyncio.sleep(0.1)
    assert not fetch.done()
    await broker.publish(level, [message("wake")])
    got = await asyncio.wait_for(fetch, 5.0)
    assert ids(got) == ["wake"]
    assert got[0].queue == level


async def test_fetch_first_times_out_empty(broker: Broker) -> None:
    await ready(broker)
    started = time.monotonic()
    assert await broker.fetch_first(LEVELS, 5, 0.2) == []
    assert 0.15 <= time.monotonic() - started < 2.0


# ---------------------------------------------------------------------------- acquire_rate
# The bucket runs on the server's clock, so time that passes between two calls (a busy
# machine may take a few hundred ms) refills it: the rates are slow enough that it cannot
# change what is checked, and each wait's lower bound allows for the time measured since the
# bucket was first used.


async def test_acquire_rate_grants_the_burst_then_reserves_with_a_wait(broker: Broker) -> None:
    bucket = [("contract-bucket", 0.5, 5.0)]
    started = time.monotonic()
    for _ in range(5):
        assert await broker.acquire_rate(bucket) == (True, 0.0)
    waits = []
    for expected in (2.0, 4.0, 6.0):  # the 6th, 7th, 8th tokens (0.5/s, the bucket full at 0)
        reserved, wait = await broker.acquire_rate(bucket)
        elapsed = time.monotonic() - started
        assert reserved
        assert expected - elapsed - 0.05 <= wait <= expected + 0.001, (expected, wait, elapsed)
        waits.append(wait)
    assert waits == sorted(waits)
    # Another bucket is independent.
    assert await broker.acquire_rate([("other-bucket", 0.5, 5.0)]) == (True, 0.0)


async def test_acquire_rate_refills_over_time(broker: Broker) -> None:
    bucket = [("refill", 4.0, 2.0)]
    started = time.monotonic()
    assert (await broker.acquire_rate(bucket))[1] == 0.0
    assert (await broker.acquire_rate(bucket))[1] == 0.0
    _, wait = await broker.acquire_rate(bucket)  # the 3rd token: 0.25 s after the first call
    assert wait >= 0.25 - (time.monotonic() - started) - 0.05, wait
    await asyncio.sleep(0.75)  # 3 tokens' worth of time refills the debt and one more
    assert await broker.acquire_rate(bucket) == (True, 0.0)


async def test_acquire_rate_takes_from_every_bucket_and_waits_for_the_slowest(
    broker: Broker,
) -> None:
    quick, slow = ("multi-quick", 2.0, 1.0), ("multi-slow", 0.4, 1.0)
    started = time.monotonic()
    assert await broker.acquire_rate([quick, slow]) == (True, 0.0)
    reserved, wait = await broker.acquire_rate([quick, slow])
    elapsed = time.monotonic() - started
    assert reserved
    # The slow bucket's 2.5 s, not the quick one's 0.5 s.
    assert 2.5 - elapsed - 0.05 <= wait <= 2.5 + 0.001, (wait, elapsed)
    # The quick bucket's token was taken too: two tokens owed now, 1 s (not 0.5 s).
    reserved, wait = await broker.acquire_rate([quick])
    elapsed = time.monotonic() - started
    assert reserved
    assert 1.0 - elapsed - 0.05 <= wait <= 1.0 + 0.001, (wait, elapsed)


# ---------------------------------------------------------------------- cancel and revoked
async def test_cancel_answers_what_the_task_was(broker: Broker) -> None:
    await ready(broker)
    await broker.schedule([Scheduled("later", "flow", message("later"), delay=60.0)])
    assert await broker.cancel("later", cancelled_record("later"), 60) == "scheduled"
    assert await broker.scheduled_count() == 0
    assert (await broker.promote_due(10))[:2] == (0, None)

    await broker.publish("flow", [message("waiting")])
    assert await broker.cancel("waiting", cancelled_record("waiting"), 60) == "pending"

    await broker.set_record("tracked", state_record("tracked", "queued"), 60)
    assert await broker.cancel("tracked", cancelled_record("tracked"), 60) == "queued"
    await broker.set_record("busy", state_record("busy", "running"), 60)
    assert await broker.cancel("busy", cancelled_record("busy"), 60) == "running"

    done = state_record("done", "succeeded")
    await broker.set_record("done", done, 60)
    assert await broker.cancel("done", cancelled_record("done"), 60) == "finished"
    assert await broker.get_record("done") == done
    # Cancelling twice: the second time it is already final.
    assert await broker.cancel("waiting", cancelled_record("waiting"), 60) == "finished"
    assert await broker.cancel("later", cancelled_record("later"), 60) == "finished"

    for task_id in ("later", "waiting", "tracked"):
        raw = await broker.get_record(task_id)
        assert raw is not None
        assert TaskRecord.from_bytes(raw).state is TaskState.CANCELLED
    # A running task keeps its record (and when it started) until its run really ends: the
    # worker writes "cancelled" then; meanwhile the mark below makes it read "cancelling".
    raw = await broker.get_record("busy")
    assert raw is not None
    assert TaskRecord.from_bytes(raw).state is TaskState.RUNNING
    revoked = await broker.revoked()
    # Only what may still reach a worker is marked: not the unscheduled or finished ones.
    assert set(revoked) == {"waiting", "tracked", "busy"}
    now = time.time()
    assert all(now + 50 < expiry <= now + 61 for expiry in revoked.values()), revoked


async def test_revoked_marks_expire(broker: Broker) -> None:
    await broker.publish("flow", [message("short")])
    assert await broker.cancel("short", cancelled_record("short"), 1) == "pending"
    assert "short" in await broker.revoked()

    async def marks() -> dict[str, float]:
        return await broker.revoked()

    deadline = time.monotonic() + 5
    while "short" in await marks():
        assert time.monotonic() < deadline, "the revoked mark did not expire"
        await asyncio.sleep(0.1)


# --------------------------------------------------------------------------------- events
@contextlib.asynccontextmanager
async def listening(broker: Broker) -> AsyncIterator[list[tuple[str, str]]]:
    """Collect ``broker.events()`` in the background; yields the growing list."""
    seen: list[tuple[str, str]] = []

    async def collect() -> None:
        async for event in broker.events():
            seen.append(event)

    task = asyncio.ensure_future(collect())
    try:
        # The subscription is in place once a probe event comes through.
        deadline = time.monotonic() + 5
        n = 0
        while not seen:
            assert time.monotonic() < deadline, "no event arrived within 5 s"
            assert not task.done(), task
            n += 1
            await broker.schedule(
                [Scheduled(f"probe-{n}", "flow", message(f"probe-{n}"), eta=1e10 + n)]
            )
            await asyncio.sleep(0.05)
        seen.clear()
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_for_event(
    seen: list[tuple[str, str]], accept: Callable[[tuple[str, str]], bool]
) -> tuple[str, str]:
    """Return the first event in ``seen`` that ``accept`` takes, waiting up to 5 s."""
    deadline = time.monotonic() + 5
    while True:
        for event in seen:
            if accept(event):
                return event
        assert time.monotonic() < deadline, f"event not seen within 5 s; saw {seen}"
        await asyncio.sleep(0.01)


async def test_events_announce_revocations_and_schedules(
    make_broker: Callable[[], Broker],
) -> None:
    listener, producer = make_broker(), make_broker()
    async with listening(listener) as seen:
        await producer.publish("flow", [message("victim")])
        assert await producer.cancel("victim", cancelled_record("victim"), 60) == "pending"
        assert await wait_for_event(seen, lambda e: e[0] == "revoke") == ("revoke", "victim")

        eta = time.time() + 30.5  # an absolute eta is announced as given
        await producer.schedule([Scheduled("soon", "flow", message("soon"), eta=eta)])
        kind, value = await wait_for_event(seen, lambda e: e[0] == "schedule")
        assert kind == "schedule"
        assert float(value) == pytest.approx(eta, abs=1e-6)

        # A retry (a completion that reschedules) is announced the same way.
        seen.clear()
        await ready(producer)
        await producer.publish("flow", [message("retry-me")])
        got = await producer.fetch_first(LEVELS, 1, 0)
        _, _, before = await producer.promote_due(0)  # the broker's clock
        await producer.complete(
            [Completion(got[0].queue, got[0].token, "retry-me", reschedule=message("retry-me"),
                        delay=7.25)]
        )  # fmt: skip
        _, _, after = await producer.promote_due(0)
        kind, value = await wait_for_event(seen, lambda e: e[0] == "schedule")
        # Announced as a due time on the broker's clock: its now when applied + the delay.
        assert before + 7.25 - 1e-5 <= float(value) <= after + 7.25 + 1e-5

        # Cancelling a scheduled or finished task sends no revocation.
        seen.clear()
        assert await producer.cancel("soon", cancelled_record("soon"), 60) == "scheduled"
        assert await producer.cancel("victim", cancelled_record("victim"), 60) == "finished"
        await producer.publish("flow", [message("marker")])
        await producer.cancel("marker", cancelled_record("marker"), 60)
        await wait_for_event(seen, lambda e: e == ("revoke", "marker"))
        assert [e for e in seen if e[0] == "revoke"] == [("revoke", "marker")]


async def test_events_reach_every_listener(make_broker: Callable[[], Broker]) -> None:
    first, second, producer = make_broker(), make_broker(), make_broker()
    async with listening(first) as seen1, listening(second) as seen2:
        await producer.cancel("everyone", cancelled_record("everyone"), 60)
        for seen in (seen1, seen2):
            assert await wait_for_event(seen, lambda e: e[0] == "revoke") == (
                "revoke",
                "everyone",
            )
