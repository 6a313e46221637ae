"""Bad input at both ends, against a real Redis in both modes.

At enqueue, anything that is not plain data (or too large) is refused with an error and nothing
is published. At the worker, messages planted by hand in the queue's stream or list (garbage,
wrong shapes, foreign fields, unknown tasks, oversized) are dead-lettered with a reason while the
worker keeps going (invariant 8).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from blitzq import MessageTooLarge, Queue, SerializationError, TaskFailed, TaskState
from blitzq.broker.redis.keys import MESSAGE_FIELD, Keys
from blitzq.serialization import EXT_DECIMAL, Envelope, encode_envelope

from .proc_tasks import eventually, make_worker, running


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@dataclasses.dataclass
class Point:
    """A dataclass: not plain data."""

    x: int
    y: int


class Custom:
    """An arbitrary object: not plain data."""


NOT_PLAIN: list[Any] = [
    object(),
    Custom(),
    {1, 2},
    frozenset({1}),
    Point(1, 2),
    {1: "int key"},
    {("a",): "tuple key"},
    {"nested": {"deeper": [1, {2, 3}]}},
    [1, object()],
    2**64,
    -(2**63) - 1,
    [2**70],
    dt.timedelta(seconds=1),
    complex(1, 2),
    bytearray(b"x"),
]


async def published_nothing(queue: Queue, raw_redis: Any, namespace: str) -> None:
    """Assert that no message reached the queue's stream/list or the schedule."""
    keys = Keys(namespace)
    key = keys.stream(queue.name) if queue.mode == "reliable" else keys.list(queue.name)
    assert await raw_redis.exists(key) == 0
    stats = await queue.stats([queue.name])
    assert stats["queues"][queue.name]["waiting"] == 0
    assert stats["scheduled"] == 0


# ------------------------------------------------------------------------------- enqueue
@pytest.mark.parametrize("value", NOT_PLAIN, ids=lambda v: type(v).__name__)
async def test_non_plain_argument_is_refused_at_enqueue(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str, value: Any
) -> None:
    queue = make_queue(mode=mode)

    @queue.task(name="bad.take")
    async def take(x: Any = None) -> None:
        return None

    try:
        with pytest.raises(SerializationError):
            await take.enqueue(value)
        with pytest.raises(SerializationError):
            await take.enqueue(x=value)
        with pytest.raises(SerializationError):
            await take.options(delay=30).enqueue(value)
        with pytest.raises(SerializationError):
            await take.enqueue_many([(1,), (value,), (2,)])
        with pytest.raises(SerializationError):
            await queue.send("bad.take", args=(value,))
        with pytest.raises(SerializationError):
            await take.options(headers={"h": value}).enqueue(1)
        await published_nothing(queue, raw_redis, namespace)
    finally:
        await queue.close()


async def test_message_over_max_size_is_refused_at_enqueue(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(mode=mode, max_message_size=1024)

    @queue.task(name="bad.big")
    async def big(data: str) -> None:
        return None

    try:
        with pytest.raises(MessageTooLarge) as info:
            await big.enqueue("x" * 2000)
        assert info.value.limit == 1024
        assert info.value.size > 2000
        with pytest.raises(MessageTooLarge):
            await big.enqueue_many([("small",), ("y" * 5000,)])
        with pytest.raises(MessageTooLarge):
            await big.options(delay=10).enqueue("z" * 3000)
        await published_nothing(queue, raw_redis, namespace)
        # Just under the limit is fine.
        handle = await big.enqueue("x" * 900)
        stats = await queue.stats([queue.name])
        assert stats["queues"][queue.name]["waiting"] == 1
        assert handle.id
    finally:
        await queue.close()


# -------------------------------------------------------------------------------- worker
def malformed_payloads(queue_name: str) -> list[bytes]:
    """Messages that are not well-formed envelopes."""
    bad_decimal = msgspec.msgpack.encode(
        ["bad-dec", "bad.ok", queue_name, [msgspec.msgpack.Ext(EXT_DECIMAL, b"not a number")]]
    )
    bad_datetime = msgspec.msgpack.encode(
        ["bad-dt", "bad.ok", queue_name, [msgspec.msgpack.Ext(1, b"yesterday-ish")]]
    )
    return [
        b"\xc1\x00 this is not msgpack",
        b"",
        msgspec.msgpack.encode({"id": "map-1", "task": "bad.ok", "queue": queue_name}),
        msgspec.msgpack.encode([1, 2, 3]),
        msgspec.msgpack.encode(["wrong-args", "bad.ok", queue_name, "not a list"]),
        msgspec.msgpack.encode(["wrong-kwargs", "bad.ok", queue_name, [], {1: 2}]),
        msgspec.msgpack.encode("just a string"),
        bad_decimal,
        bad_datetime,
        msgspec.msgpack.encode(
            ["unknown-ext", "bad.ok", queue_name, [msgspec.msgpack.Ext(99, b"?")]]
        ),
    ]


async def test_worker_dead_letters_bad_messages_and_goes_on(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(mode=mode, max_message_size=2048)
    runs: list[Any] = []

    @queue.task(name="bad.ok")
    async def ok(x: Any) -> Any:
        runs.append(x)
        return x

    keys = Keys(namespace)
    expected: Counter[str] = Counter()

    async def plant(payload: bytes, field: bytes = MESSAGE_FIELD) -> None:
        if mode == "reliable":
            await raw_redis.xadd(keys.stream(queue.name), {field: payload})
        else:
            await raw_redis.rpush(keys.list(queue.name), payload)

    for payload in malformed_payloads(queue.name):
        await plant(payload)
        expected["malformed message"] += 1
    unknown = Envelope("unknown-1", "no.such.task", queue.name, [1])
    await plant(encode_envelope(unknown, 1 << 20))
    expected["unknown task"] += 1
    oversized = Envelope("oversized-1", "bad.ok", queue.name, ["x" * 5000])
    await plant(encode_envelope(oversized, 1 << 20))
    expected["message too large"] += 1
    if mode == "reliable":
        # A stream entry without the "m" field is not a blitzq message, whatever it holds.
        foreign = Envelope("foreign-1", "bad.ok", queue.name, ["foreign"])
        await plant(encode_envelope(foreign, 1 << 20), field=b"data")
        expected["malformed message"] += 1

    try:
        worker = make_worker(queue, concurrency=4)
        async with running(worker):
            handle = await ok.enqueue("valid")
            assert await handle.result(timeout=15) == "valid"
            dead = await eventually(
                lambda: queue.dead_letters(limit=100),
                lambda rows: len(rows) >= sum(expected.values()),
            )
            # The worker is still consuming after all of that.
            again = await ok.enqueue("still alive")
            assert await again.result(timeout=15) == "still alive"
        assert runs == ["valid", "still alive"]
        assert Counter(d.reason for d in dead) == expected
        by_id = {d.id: d for d in dead}
        assert by_id["unknown-1"].task == "no.such.task"
        assert "no.such.task" in by_id["unknown-1"].error
        assert by_id["unknown-1"].args == [1]
        assert all(d.queue == queue.name for d in dead)
        planted = {bytes(p) for p in malformed_payloads(queue.name)}
        assert planted <= {d.message for d in dead}
        # An unknown task has a final record, so a waiter learns its fate.
        with pytest.raises(TaskFailed) as info:
            await queue.get_result("unknown-1", timeout=5)
        assert info.value.state == TaskState.DEAD_LETTERED.value
        # Nothing is left waiting or in flight.
        stats = await queue.stats([queue.name])
        assert stats["queues"][queue.name] == {"waiting": 0, "in_flight": 0}
    finally:
        await queue.close()
