"""Which annotations are rich (blitzq.arguments), and zoned datetimes as plain data."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import Any, NamedTuple, TypedDict
from zoneinfo import ZoneInfo

import msgspec
import pytest

from blitzq.arguments import TypedCall
from blitzq.exceptions import SerializationError
from blitzq.serialization import EXT_ZONED_DATETIME, dumps, loads


class Color(enum.Enum):
    RED = "red"


class Point(msgspec.Struct):
    x: int


@dataclasses.dataclass
class Box:
    side: int


class Pair(NamedTuple):
    a: int


class Doc(TypedDict):
    title: str


def plain(a: int, b: str, c: list[int], d: dict[str, Any], e: dt.datetime, f: Any) -> dict:  # type: ignore[type-arg]
    return {}


@pytest.mark.parametrize(
    "annotation",
    [
        Color,
        Point,
        Box,
        Pair,
        Doc,
        set[int],
        frozenset[str],
        tuple[int, int],
        dt.timedelta,
        list[Point],
        Point | None,
        dict[str, Color],
    ],
)
def test_rich_annotations_are_recognised(annotation: Any) -> None:
    def fn(value: Any) -> None:
        return None

    fn.__annotations__ = {"value": annotation, "return": None}
    typed = TypedCall.of(fn)
    assert typed is not None
    assert typed.positional == [annotation]
    assert typed.keyword == {"value": annotation}


def test_plain_annotations_cost_nothing() -> None:
    assert TypedCall.of(plain) is None


def test_unresolvable_annotation_means_plain_data() -> None:
    def fn(value: NoSuchType) -> None:  # type: ignore[name-defined]  # noqa: F821
        return None

    assert TypedCall.of(fn) is None


def test_positions_varargs_and_keywords() -> None:
    def fn(a: int, b: Point, /, c: Color, *more: Box, key: set[int], **rest: Pair) -> Point:
        return b

    typed = TypedCall.of(fn)
    assert typed is not None
    args, kwargs = typed.encode(
        (1, Point(2), Color.RED, Box(3), Box(4)), {"key": {5}, "other": Pair(6)}
    )
    assert args == [1, {"x": 2}, "red", {"side": 3}, {"side": 4}]
    assert kwargs["key"] == [5]
    assert list(kwargs["other"]) == [6]  # a tuple: plain data (sent as an array)
    back_args, back_kwargs = typed.decode(args, kwargs)
    assert back_args == [1, Point(2), Color.RED, Box(3), Box(4)]
    assert back_kwargs == {"key": {5}, "other": Pair(6)}
    assert typed.decode_result(typed.encode_result(Point(9))) == Point(9)
    with pytest.raises(SerializationError, match="cannot read"):
        typed.decode([1, {"x": "nine"}, "red"], {})


@pytest.mark.parametrize("fold", [0, 1])
def test_zoned_datetime_keeps_its_zone(fold: int) -> None:
    zone = ZoneInfo("Europe/Berlin")
    when = dt.datetime(2024, 10, 27, 2, 30, fold=fold, tzinfo=zone)  # the ambiguous hour
    back = loads(dumps([when]))[0]
    assert back.tzinfo is zone
    assert back == when
    assert back.utcoffset() == when.utcoffset()
    # A fixed offset stays a fixed offset.
    fixed = dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert loads(dumps([fixed]))[0].tzinfo == fixed.tzinfo


def test_unknown_zone_is_a_serialization_error() -> None:
    bad = msgspec.msgpack.Ext(EXT_ZONED_DATETIME, b"2024-01-01T00:00:00+00:00[No/Such_Zone]")
    with pytest.raises(SerializationError, match="unknown time zone"):
        loads(msgspec.msgpack.encode([bad]))


def test_a_mixed_value_enum_says_what_to_do() -> None:
    from blitzq.arguments import from_wire

    class Mixed(enum.Enum):
        RED = "red"
        BLUE = 2

    with pytest.raises(SerializationError, match=r"all str or all int.*pass the member's .value"):
        from_wire(2, Mixed)
