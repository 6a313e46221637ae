"""Plain data that is not a MessagePack type (datetime, date, UUID, Decimal) arrives as itself
in every copy of a message, not only the first: a retry, a dead letter's replay, a rate
limit's deferral, the eager mode's retry; and in the messages blitzq builds from arguments
it already converted (a workflow's steps, a periodic task's occurrences). A copy re-encoded
from a decoded message had them as strings (a zoned datetime as UTC), and a workflow or a
periodic task with one was refused."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from blitzq import Every, Queue, RetryPolicy, TaskFailed, chain, current_task
from blitzq.periodic import build_message
from blitzq.serialization import decode_envelope, encode_envelope
from blitzq.testing import eager

from .proc_tasks import make_worker, running

pytestmark = pytest.mark.timeout(60)

VALUES: list[Any] = [
    dt.datetime(2024, 1, 2, 3, 4, 5),
    dt.datetime(2024, 1, 2, tzinfo=ZoneInfo("Europe/Paris")),
    dt.datetime(2024, 1, 2, 3, tzinfo=dt.UTC),
    dt.date(2024, 1, 2),
    uuid.UUID(int=5),
    decimal.Decimal("1.10"),
    [decimal.Decimal("2.5"), {"at": dt.date(2024, 2, 2)}],
]
EXPECTED = [repr(v) for v in VALUES]


def _seen(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """What a task saw: each positional and keyword argument's repr (a zone's key too)."""
    return [repr(v) for v in args] + [repr(kwargs["extra"])]


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    """A Queue on the test server."""
    q = make_queue()
    yield q
    await q.close()


def test_an_envelope_decoded_and_encoded_again_keeps_every_value() -> None:
    # The kind: any copy blitzq re-encodes from a message it read.
    message = encode_envelope(
        decode_envelope(
            encode_envelope(
                # as decoded: the values themselves, in args, kwargs and headers
                decode_envelope(_first_message()),
                1 << 20,
            )
        ),
        1 << 20,
    )
    again = decode_envelope(message)
    assert [repr(v) for v in again.args] == EXPECTED
    assert repr(again.kwargs["extra"]) == repr(VALUES[1])
    assert again.headers == {"when": VALUES[4]}


def _first_message() -> bytes:
    from blitzq.serialization import Envelope, plain_args, plain_kwargs, to_plain

    env = Envelope(
        "t1",
        "task",
        "q",
        plain_args(VALUES),
        plain_kwargs({"extra": VALUES[1]}),
        headers=to_plain({"when": VALUES[4]}),
    )
    return encode_envelope(env, 1 << 20)


async def test_a_retry_receives_the_values_of_the_first_attempt(queue: Queue) -> None:
    @queue.task(name="rich.retry", retry_policy=RetryPolicy(max_retries=2, base=0))
    async def flaky(*args: Any, **kwargs: Any) -> list[Any]:
        if current_task().attempt == 1:
            raise RuntimeError("the first attempt fails")
        return _seen(args, kwargs)

    async with running(make_worker(queue)):
        handle = await flaky.enqueue(*VALUES, extra=VALUES[1])
        assert await handle.result(timeout=30) == [*EXPECTED, repr(VALUES[1])]


async def test_a_replayed_dead_letter_receives_the_values(queue: Queue) -> None:
    failing = [True]

    @queue.task(name="rich.replay", retries=0)
    async def once(*args: Any, **kwargs: Any) -> list[Any]:
        if failing[0]:
            raise RuntimeError("dead-lettered")
        return _seen(args, kwargs)

    async with running(make_worker(queue)):
        handle = await once.enqueue(*VALUES, extra=VALUES[1])
        with pytest.raises(TaskFailed):
            await handle.result(timeout=30)
        failing[0] = False
        replayed = await queue.retry(handle.id)
        assert replayed is not None
        assert await replayed.result(timeout=30) == [*EXPECTED, repr(VALUES[1])]


async def test_a_rate_limited_copy_put_back_on_the_schedule_receives_the_values(
    queue: Queue,
) -> None:
    @queue.task(name="rich.limited", rate_limit="20/s")
    async def limited(*args: Any, **kwargs: Any) -> list[Any]:
        return _seen(args, kwargs)

    async with running(make_worker(queue, concurrency=10)):
        handles = await limited.enqueue_many([(tuple(VALUES), {"extra": VALUES[1]})] * 25)
        for handle in handles:  # past the burst: deferred copies among them
            assert await handle.result(timeout=30) == [*EXPECTED, repr(VALUES[1])]


async def test_the_eager_mode_retry_receives_the_values() -> None:
    queue = Queue(namespace="eager-rich")

    @queue.task(name="rich.eager", retry_policy=RetryPolicy(max_retries=1, base=0))
    async def flaky(*args: Any, **kwargs: Any) -> list[Any]:
        if current_task().attempt == 1:
            raise RuntimeError("the first attempt fails")
        return _seen(args, kwargs)

    with eager():
        handle = await flaky.enqueue(*VALUES, extra=VALUES[1])
        assert await handle.result(timeout=5) == [*EXPECTED, repr(VALUES[1])]
    await queue.close()


async def test_a_workflow_step_receives_the_values(queue: Queue) -> None:
    @queue.task(name="rich.step")
    async def step(*args: Any, **kwargs: Any) -> list[Any]:
        return _seen(args, kwargs)

    @queue.task(name="rich.last")
    async def last(previous: list[Any], value: Any) -> list[Any]:
        return [*previous, repr(value)]

    async with running(make_worker(queue)):
        single = await queue.apply(step.s(*VALUES, extra=VALUES[1]))
        assert await single.get(timeout=30) == [*EXPECTED, repr(VALUES[1])]
        chained = await queue.apply(
            chain(step.s(*VALUES, extra=VALUES[1]), last.s(decimal.Decimal("3.3")))
        )
        assert await chained.get(timeout=30) == [*EXPECTED, repr(VALUES[1]), "Decimal('3.3')"]


async def test_a_periodic_task_takes_the_values_and_its_occurrence_carries_them(
    queue: Queue,
) -> None:
    @queue.task(name="rich.periodic")
    async def tick(*args: Any, **kwargs: Any) -> None:
        return None

    entry = queue.add_periodic(tick, Every(60), args=VALUES, kwargs={"extra": VALUES[1]})
    env = decode_envelope(build_message(queue, entry, 120.0, 121.0))
    assert [repr(v) for v in env.args] == EXPECTED
    assert repr(env.kwargs["extra"]) == repr(VALUES[1])


def test_a_decoded_dict_with_int_keys_is_encoded_again_as_it_was() -> None:
    # A hand-written message (no enqueue makes one): its retry encodes as the first did.
    import msgspec

    from blitzq.serialization import Envelope

    raw = msgspec.msgpack.encode(["t1", "task", "q", [{1: "a"}, dt.date(2024, 1, 2).isoformat()]])
    env = decode_envelope(raw)
    again = decode_envelope(encode_envelope(Envelope(env.id, env.task, env.queue, env.args), 1024))
    assert again.args == [{1: "a"}, "2024-01-02"]
