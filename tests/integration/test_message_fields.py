"""Times and numbers read from a message are checked once, when the worker decodes it.

A foreign or broken producer can write any float into ``created_at``: NaN, an infinity, a
time thousands of years ahead. Before, an unknown task with such a ``created_at`` never
reached its ``unknown_task_grace`` and came back every second forever (a warning each
time); a NaN ``timeout`` armed a timer on NaN. Now such a message is dead-lettered as
``malformed message`` with an error naming the field, its waiters learn it, and other work
goes on. Each input is planted raw in a real stream (reliable) or list (fast).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from blitzq import Queue, TaskFailed, TaskState
from blitzq.broker.redis.keys import MESSAGE_FIELD, Keys
from blitzq.limits import MAX_ATTEMPT, MAX_CLOCK_AHEAD

from .proc_tasks import make_worker, running

pytestmark = pytest.mark.timeout(60)

KNOWN = "fields.echo"
UNKNOWN = "fields.nobody.has.this"

#: (field, value, task name): the task is unknown to the worker for the times, whose bad
#: value used to keep an unknown task deferred forever; known for the others.
BAD: list[tuple[str, Any, str]] = [
    ("created_at", math.nan, UNKNOWN),
    ("created_at", math.inf, UNKNOWN),
    ("created_at", -math.inf, UNKNOWN),
    ("created_at", 1e12, UNKNOWN),  # ~31,000 years ahead (a producer writing ms?)
    ("created_at", -1.0, UNKNOWN),
    ("created_at", "ahead", KNOWN),  # MAX_CLOCK_AHEAD + 10 min past now
    ("created_at", math.nan, KNOWN),
    ("enqueued_at", math.nan, KNOWN),
    ("enqueued_at", math.inf, KNOWN),
    ("enqueued_at", 1e12, KNOWN),
    ("enqueued_at", -5.0, KNOWN),
    ("attempt", 0, KNOWN),
    ("attempt", -3, KNOWN),
    ("attempt", MAX_ATTEMPT + 1, KNOWN),
    ("timeout", math.nan, KNOWN),
    ("timeout", math.inf, KNOWN),
    ("timeout", -math.inf, KNOWN),
    ("timeout", -1.0, KNOWN),
    ("timeout", 0.0, KNOWN),
    ("timeout", 1e12, KNOWN),
    ("max_age", math.nan, KNOWN),
    ("max_age", math.inf, KNOWN),
    ("max_age", -5.0, KNOWN),
]

#: Position of each checked field in the positional envelope array.
POSITION = {
    "id": 0,
    "attempt": 5,
    "created_at": 6,
    "enqueued_at": 7,
    "correlation_id": 8,
    "timeout": 10,
    "unique_key": 13,
    "max_age": 14,
    "deferrals": 15,
    "options": 16,
}


def raw_message(task_id: str, task: str, queue: str, field: str, value: Any) -> bytes:
    """A full 17-field envelope array, with ``field`` set to ``value`` (the others valid)."""
    now = time.time()
    message: list[Any] = [task_id, task, queue, [1], {}, 1, now, now, None, None, None]
    message += [False, None, None, None, None, None]
    message[POSITION[field]] = value
    return msgspec.msgpack.encode(message)


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.mark.parametrize(
    ("field", "value", "task"), BAD, ids=[f"{f}={v!r}-{t.split('.')[1]}" for f, v, t in BAD]
)
async def test_a_bad_time_or_number_is_dead_lettered_naming_the_field(
    make_queue: Callable[..., Queue],
    mode: str,
    raw_redis: Any,
    namespace: str,
    field: str,
    value: Any,
    task: str,
) -> None:
    queue = make_queue(mode=mode)
    runs: list[Any] = []

    @queue.task(name=KNOWN)
    async def echo(x: Any) -> Any:
        runs.append(x)
        return x

    if value == "ahead":
        value = time.time() + MAX_CLOCK_AHEAD + 600
    keys = Keys(namespace)
    payload = raw_message("bad-1", task, queue.name, field, value)
    if mode == "reliable":
        await raw_redis.xadd(keys.stream(queue.name), {MESSAGE_FIELD: payload})
    else:
        await raw_redis.rpush(keys.list(queue.name), payload)
    try:
        async with running(make_worker(queue, unknown_task_grace=300)):
            # The planted message has a final record: its waiter learns its fate at once.
            with pytest.raises(TaskFailed) as info:
                await queue.get_result("bad-1", timeout=20)
            assert info.value.state == TaskState.DEAD_LETTERED.value
            assert info.value.error_type == "malformed message"
            # Other work goes on.
            assert await (await echo.enqueue("after")).result(timeout=20) == "after"
        dead = await queue.dead_letters(limit=10)
        assert [(d.id, d.reason, d.task) for d in dead] == [("bad-1", "malformed message", task)]
        assert dead[0].error.startswith(f"{field} is "), dead[0].error
        assert dead[0].message == payload
        assert runs == ["after"]
        stats = await queue.stats([queue.name])
        assert stats["queues"][queue.name] == {"waiting": 0, "in_flight": 0}
        assert stats["scheduled"] == 0  # not deferred: dead-lettered on its first receipt
    finally:
        await queue.close()


async def test_edge_values_are_accepted(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str
) -> None:
    """A producer clock a little ahead, created_at 0 (unknown), the largest attempt and the
    longest timeout still run."""
    queue = make_queue(mode=mode)

    @queue.task(name=KNOWN, retries=0)
    async def echo(x: Any) -> Any:
        return x

    keys = Keys(namespace)
    cases = {
        "ahead": ("created_at", time.time() + MAX_CLOCK_AHEAD - 600),
        "zero": ("created_at", 0.0),
        "enq-zero": ("enqueued_at", 0),
        "last-attempt": ("attempt", MAX_ATTEMPT),
        "long-timeout": ("timeout", 10 * 365 * 86400.0),
        "max-age": ("max_age", 3600.0),
    }
    for ident, (field, value) in cases.items():
        payload = raw_message(ident, KNOWN, queue.name, field, value)
        if mode == "reliable":
            await raw_redis.xadd(keys.stream(queue.name), {MESSAGE_FIELD: payload})
        else:
            await raw_redis.rpush(keys.list(queue.name), payload)
    try:
        async with running(make_worker(queue)):
            for ident in cases:
                assert await queue.get_result(ident, timeout=20) == 1, ident
        assert await queue.dead_letters(limit=10) == []
    finally:
        await queue.close()


async def test_a_field_of_the_wrong_type_is_named(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(mode=mode)

    @queue.task(name=KNOWN)
    async def echo(x: Any) -> Any:
        return x

    keys = Keys(namespace)
    payload = raw_message("typed-1", KNOWN, queue.name, "created_at", "yesterday")
    if mode == "reliable":
        await raw_redis.xadd(keys.stream(queue.name), {MESSAGE_FIELD: payload})
    else:
        await raw_redis.rpush(keys.list(queue.name), payload)
    try:
        async with running(make_worker(queue)):
            with pytest.raises(TaskFailed):
                await queue.get_result("typed-1", timeout=20)
        dead = await queue.dead_letters(limit=10)
        assert dead[0].reason == "malformed message"
        assert "`$[6]` (created_at)" in dead[0].error, dead[0].error
    finally:
        await queue.close()


#: (case id, envelope field or ``None``, its value, stream field "d" or ``None``, reason,
#: start of the error): values a call's options refuse at enqueue (``task.options``), and
#: delivery counts no recovery writes. Each one used to run (or be silently ignored).
ENQUEUE_RULES: list[tuple[str, str | None, Any, bytes | None, str, str]] = [
    ("id-empty", "id", "", None, "malformed message", "id is ''"),
    ("id-space", "id", "a b", None, "malformed message", "id is 'a b'"),
    ("max_age-str", "options", {"max_age": "abc"}, None, "malformed message", "options.max_age"),
    ("max_age-neg", "options", {"max_age": -1}, None, "malformed message", "options.max_age"),
    ("max_age-bool", "options", {"max_age": True}, None, "malformed message", "options.max_age"),
    ("deferrals-neg", "deferrals", -1, None, "malformed message", "deferrals is -1"),
    ("deferrals-zero", "deferrals", 0, None, "malformed message", "deferrals is 0"),
    ("correlation-empty", "correlation_id", "", None, "malformed message", "correlation_id"),
    ("unique-empty", "unique_key", "", None, "malformed message", "unique_key is ''"),
    ("max_age-field", "max_age", -1, None, "malformed message", "max_age is -1"),
    ("d-999", None, None, b"999", "max deliveries exceeded", "delivery count is 999"),
    # past the backstop of deliveries (4 x max_deliveries 5); a count under it runs alone
    (
        "d-21",
        None,
        None,
        b"21",
        "max deliveries exceeded",
        "delivery count is 21, past the backstop of 20 deliveries: 4 x max_deliveries=5, "
        "at least 20",
    ),
    ("d-str", None, None, b"abc", "malformed message", "delivery count"),
    ("d-neg", None, None, b"-3", "malformed message", "delivery count"),
    ("d-zero", None, None, b"0", "malformed message", "delivery count"),
    ("d-inf", None, None, b"inf", "malformed message", "delivery count"),
]


@pytest.mark.parametrize(
    ("field", "value", "count", "reason", "error"),
    [case[1:] for case in ENQUEUE_RULES],
    ids=[case[0] for case in ENQUEUE_RULES],
)
async def test_what_enqueue_refuses_is_dead_lettered_at_decode(
    make_queue: Callable[..., Queue],
    mode: str,
    raw_redis: Any,
    namespace: str,
    field: str | None,
    value: Any,
    count: bytes | None,
    reason: str,
    error: str,
) -> None:
    """A message holding a value ``task.options`` refuses, or a delivery count past the
    backstop of ``max_deliveries`` (or no count at all), is dead-lettered naming the field;
    the task never runs and no record is written under an unusable id."""
    if count is not None and mode == "fast":
        pytest.skip("a list entry has no delivery count")
    queue = make_queue(mode=mode, max_deliveries=5)
    runs: list[Any] = []

    @queue.task(name=KNOWN)
    async def echo(x: Any) -> Any:
        runs.append(x)
        return x

    keys = Keys(namespace)
    payload = raw_message("bad-2", KNOWN, queue.name, field or "attempt", value if field else 1)
    ident = "bad-2" if field != "id" else None
    if mode == "reliable":
        entry = {MESSAGE_FIELD: payload, **({b"d": count} if count is not None else {})}
        await raw_redis.xadd(keys.stream(queue.name), entry)
    else:
        await raw_redis.rpush(keys.list(queue.name), payload)
    try:
        async with running(make_worker(queue)):
            if ident is not None:
                with pytest.raises(TaskFailed) as info:
                    await queue.get_result(ident, timeout=20)
                assert info.value.state == TaskState.DEAD_LETTERED.value
                exceeded = reason == "max deliveries exceeded"  # the record a recovery writes
                assert info.value.error_type == ("MaxDeliveriesExceeded" if exceeded else reason)
            # Other work goes on (and, once it ran, the planted message was handled first).
            assert await (await echo.enqueue("after")).result(timeout=20) == "after"
        dead = await queue.dead_letters(limit=10)
        assert [(d.reason, d.task) for d in dead] == [(reason, KNOWN)]
        assert dead[0].error.startswith(error), dead[0].error
        assert dead[0].message == payload
        if ident is None:  # no record under the empty or spaced id
            assert not await raw_redis.exists(keys.record(value))
        else:
            assert dead[0].id == ident
        assert runs == ["after"]
    finally:
        await queue.close()
