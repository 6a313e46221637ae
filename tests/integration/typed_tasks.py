"""Importable types and functions of the typed-argument tests (a process pool imports them)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
from typing import NamedTuple, TypedDict

import msgspec
import pydantic


class Color(enum.Enum):
    """An enum argument."""

    RED = "red"
    BLUE = "blue"


class Point(msgspec.Struct):
    """A Struct argument."""

    x: int
    y: int


@dataclasses.dataclass
class Box:
    """A dataclass argument holding other rich values."""

    corner: Point
    colors: set[Color]


class Pair(NamedTuple):
    """A NamedTuple argument."""

    left: int
    right: int


class User(pydantic.BaseModel):
    """A pydantic v2 model argument."""

    name: str
    born: dt.date


class Info(TypedDict):
    """A TypedDict argument."""

    name: str
    size: int


@dataclasses.dataclass
class Meeting:
    """A dataclass with a zoned datetime field (its ZoneInfo must survive)."""

    title: str
    at: dt.datetime


def nested(
    points: list[Point],
    color: Color | None,
    every: dict[str, dt.timedelta],
    meeting: Meeting,
    seen: set[str],
    span: tuple[int, ...] = (),
    info: Info | None = None,
) -> dict[str, object]:
    """What nested rich arguments arrived as: type names, the enum member, the zone."""
    return {
        "points": [type(p).__name__ for p in points],
        "color": color.name if color is not None else None,
        "every": {k: [type(v).__name__, v.total_seconds()] for k, v in every.items()},
        "meeting": type(meeting).__name__,
        "zone": repr(meeting.at.tzinfo),
        "at": meeting.at.isoformat(),
        "seen": [type(seen).__name__, *sorted(seen)],
        "span": [type(span).__name__, *span],
        "info": info,
    }


def describe(
    at: Point,
    color: Color,
    box: Box,
    pair: Pair,
    every: dt.timedelta,
    tags: frozenset[str],
    when: dt.datetime,
    user: User,
    points: list[Point] | None = None,
) -> dict[str, str]:
    """The type name of each argument as the function received it (runs in any executor)."""
    values = {"at": at, "color": color, "box": box, "pair": pair, "every": every,
              "tags": tags, "when": when, "user": user, "points": points}  # fmt: skip
    out = {k: type(v).__name__ for k, v in values.items()}
    out["corner"] = type(box.corner).__name__
    out["colors"] = ",".join(sorted(type(c).__name__ for c in box.colors))
    out["zone"] = str(when.tzinfo)
    out["first_point"] = type(points[0]).__name__ if points else "-"
    return out


def moved(at: Point, by: int) -> Point:
    """A rich return value."""
    return Point(at.x + by, at.y + by)
