"""Arguments users actually pass (issue 12): rich annotated types round-trip through a real
worker on Redis; zoned datetimes keep their zone; rich values for unannotated parameters are
refused at enqueue; a message that does not fit its annotation fails without retries."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable
from zoneinfo import ZoneInfo

import pytest

from blitzq import Queue, SerializationError, TaskFailed

from . import typed_tasks as tt
from .proc_tasks import make_worker, running

ZONE = ZoneInfo("America/New_York")
WHEN = dt.datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=ZONE)  # the second 01:30 (EST)


def _call() -> tuple[tuple[object, ...], dict[str, object]]:
    args = (
        tt.Point(1, 2),
        tt.Color.RED,
        tt.Box(tt.Point(3, 4), {tt.Color.RED, tt.Color.BLUE}),
        tt.Pair(5, 6),
        dt.timedelta(days=1, seconds=3),
        frozenset({"a", "b"}),
        WHEN,
        tt.User(name="ada", born=dt.date(1815, 12, 10)),
    )
    return args, {"points": [tt.Point(7, 8)]}


EXPECTED = {
    "at": "Point", "color": "Color", "box": "Box", "pair": "Pair", "every": "timedelta",
    "tags": "frozenset", "when": "datetime", "user": "User", "points": "list",
    "corner": "Point", "colors": "Color,Color", "zone": "America/New_York",
    "first_point": "Point",
}  # fmt: skip


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    """A Queue on the test server."""
    q = make_queue()
    yield q
    await q.close()


@pytest.mark.parametrize("executor", ["thread", "process"])
async def test_rich_arguments_arrive_as_their_annotated_types(queue: Queue, executor: str) -> None:
    describe = queue.task(name=f"typed.describe.{executor}", executor=executor)(tt.describe)
    args, kwargs = _call()
    async with running(make_worker(queue, concurrency=2)):
        handle = await describe.enqueue(*args, **kwargs)
        assert await handle.result(timeout=30) == EXPECTED


async def test_async_task_rich_result_comes_back_typed(queue: Queue) -> None:
    @queue.task(name="typed.moved")
    async def moved(at: tt.Point, by: int) -> tt.Point:
        return tt.Point(at.x + by, at.y + by)

    @queue.task(name="typed.when")
    async def when(at: dt.datetime) -> dt.datetime:
        return at + dt.timedelta(hours=1)

    async with running(make_worker(queue, concurrency=2)):
        assert await (await moved.enqueue(tt.Point(1, 1), 2)).result(timeout=30) == tt.Point(3, 3)
        # Without annotations too, a zoned datetime keeps its zone (plain data, extension 5).
        back = await (await when.enqueue(WHEN)).result(timeout=30)
        assert back.tzinfo is ZONE
        assert back == WHEN + dt.timedelta(hours=1)
        # A chain passes a rich result on as plain data; the next step's annotation reads it.
        flow = await queue.apply(moved.s(tt.Point(0, 0), 1) | moved.s(10))
        assert tt.Point(**await flow.get(timeout=30)) == tt.Point(11, 11)


async def test_rich_value_for_a_plain_parameter_is_refused_at_enqueue(queue: Queue) -> None:
    @queue.task(name="typed.plain")
    async def plain(value: dict) -> None:  # type: ignore[type-arg]
        return None

    with pytest.raises(SerializationError, match="not plain data"):
        await plain.enqueue(tt.Point(1, 2))
    with pytest.raises(SerializationError, match="not plain data"):
        await queue.send("typed.plain", args=(tt.Color.RED,))


async def test_a_value_that_does_not_fit_fails_without_retries(queue: Queue) -> None:
    @queue.task(name="typed.strict", retries=3)
    async def strict(at: tt.Point) -> int:
        return at.x

    async with running(make_worker(queue, concurrency=1)):
        handle = await queue.send("typed.strict", args=({"x": "not an int", "y": 1},))
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=30)
        assert failed.value.error_type is not None
        assert "SerializationError" in failed.value.error_type
        record = await queue.inspect(handle.id)
        assert record is not None
        assert record.attempts == 1


async def test_a_value_that_does_not_fit_is_refused_at_enqueue(queue: Queue) -> None:
    @queue.task(name="typed.greet")
    async def greet(user: tt.User, at: tt.Point) -> str:
        return user.name

    with pytest.raises(SerializationError, match="cannot read"):
        await greet.enqueue({"name": 1}, tt.Point(1, 2))  # pydantic: born missing, name an int
    with pytest.raises(SerializationError, match="cannot read"):
        await greet.enqueue(tt.User(name="ada", born=dt.date(1815, 12, 10)), {"x": 1})
