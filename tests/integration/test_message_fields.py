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
POSITION = {"attempt": 5, "created_at": 6, "enqueued_at": 7, "timeout": 10, "max_age": 14}


def raw_message(task_id: str, task: str, queue: str, field: str, value: Any) -> bytes:
    """A full 15-field envelope array, with ``field`` set to ``value`` (the others valid)."""
    now = time.time()
    message: list[Any] = [task_id, task, queue, [1], {}, 1, now, now, None, None, None]
    message += [False, None, None, None]
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
