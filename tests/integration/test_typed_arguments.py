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


@pytest.mark.parametrize("executor", ["thread", "process"])
async def test_nested_rich_arguments_arrive_as_annotated(queue: Queue, executor: str) -> None:
    """list[Struct], Optional[Enum] (a member, then None), dict[str, timedelta], a dataclass
    whose datetime field is in a ZoneInfo zone, a top-level set, tuple[int, ...] and a
    TypedDict (checked against it: a missing key is refused at enqueue)."""
    nested = queue.task(name=f"typed.nested.{executor}", executor=executor)(tt.nested)
    meeting = tt.Meeting("standup", WHEN)
    every = {"short": dt.timedelta(minutes=5), "long": dt.timedelta(days=2, microseconds=7)}
    async with running(make_worker(queue, concurrency=2)):
        with_color = await nested.enqueue([tt.Point(1, 2), tt.Point(3, 4)], tt.Color.BLUE,
                                          every, meeting, {"b", "a"}, span=[3, 1],
                                          info={"name": "n", "size": 2})  # fmt: skip
        without = await nested.enqueue([], None, {}, meeting, set())
        got = await with_color.result(timeout=30)
        assert got == {
            "points": ["Point", "Point"],
            "color": "BLUE",
            "every": {"short": ["timedelta", 300.0], "long": ["timedelta", 172800.000007]},
            "meeting": "Meeting",
            "zone": "zoneinfo.ZoneInfo(key='America/New_York')",
            "at": WHEN.isoformat(),  # the second 01:30 of that night: fold kept
            "seen": ["set", "a", "b"],
            "span": ["tuple", 3, 1],
            "info": {"name": "n", "size": 2},
        }
        other = await without.result(timeout=30)
        assert other["color"] is None
        assert other["points"] == []
        assert other["seen"] == ["set"]
        with pytest.raises(SerializationError, match="cannot read"):
            await nested.enqueue([], None, {}, meeting, set(), info={"name": "n"})


async def test_a_dataclass_result_keeps_its_zoned_datetime(queue: Queue) -> None:
    @queue.task(name="typed.later")
    async def later(meeting: tt.Meeting, by: dt.timedelta) -> tt.Meeting:
        return tt.Meeting(meeting.title, meeting.at + by)

    async with running(make_worker(queue, concurrency=1)):
        handle = await later.enqueue(tt.Meeting("review", WHEN), dt.timedelta(hours=2))
        back = await handle.result(timeout=30)
    assert isinstance(back, tt.Meeting)
    assert back.at.tzinfo is ZONE
    assert back.at == WHEN + dt.timedelta(hours=2)


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


RICH_VALUES = {
    "struct": tt.Point(1, 2),
    "dataclass": tt.Meeting("m", WHEN),
    "enum": tt.Color.RED,
    "set": {1, 2},
    "frozenset": frozenset({"a"}),
    "timedelta": dt.timedelta(seconds=1),
    "pydantic": tt.User(name="ada", born=dt.date(1815, 12, 10)),
}


@pytest.mark.parametrize("kind", sorted(RICH_VALUES))
async def test_rich_value_for_a_plain_parameter_is_refused_at_enqueue(
    queue: Queue, kind: str
) -> None:
    @queue.task(name="typed.plain")
    async def plain(value: dict, other=None) -> None:  # type: ignore[no-untyped-def,type-arg]
        return None

    value = RICH_VALUES[kind]
    name = type(value).__qualname__
    for enqueue in (
        lambda: plain.enqueue(value),  # a parameter annotated with a plain type
        lambda: plain.enqueue({}, other=value),  # a parameter without annotation
        lambda: plain.enqueue({"nested": [value]}),
        lambda: queue.send("typed.plain", args=(value,)),  # by name: plain data only
    ):
        with pytest.raises(SerializationError, match=f"{name} is not plain data") as refused:
            await enqueue()
        assert "annotated" in str(refused.value)  # says how to pass it
    assert (await queue.stats(["default"]))["queues"]["default"]["waiting"] == 0  # none sent


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
