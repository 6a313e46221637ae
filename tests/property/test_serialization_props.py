"""Property tests of plain-data serialization (hypothesis).

Any generated plain value survives ``dumps``/``loads`` and the envelope (tuples come back as
lists), and no value containing a non-plain type anywhere is ever accepted.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from collections import OrderedDict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blitzq.exceptions import SerializationError
from blitzq.serialization import (
    Envelope,
    decode_envelope,
    dumps,
    encode_envelope,
    loads,
    plain_args,
    plain_kwargs,
    to_plain,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

offsets = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda m: dt.timezone(dt.timedelta(minutes=m))
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(),
    st.binary(),
    st.datetimes(),
    st.datetimes(timezones=offsets),
    st.dates(),
    st.uuids(),
    st.decimals(allow_nan=False),
)
plain = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.tuples(children, children),
        st.dictionaries(st.text(max_size=10), children, max_size=5),
    ),
    max_leaves=25,
)


def expected(value: Any) -> Any:
    """What a value decodes as: tuples become lists, recursively."""
    if isinstance(value, (list, tuple)):
        return [expected(v) for v in value]
    if isinstance(value, dict):
        return {k: expected(v) for k, v in value.items()}
    return value


def same(a: Any, b: Any) -> bool:
    """Equal with the same types throughout (so ``True`` is not ``1``, naive is not aware)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, dt.datetime):
        return a.isoformat() == b.isoformat()
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    return bool(a == b)


@SETTINGS
@given(plain)
def test_plain_values_round_trip(value: Any) -> None:
    assert same(loads(dumps(value)), expected(value))


@SETTINGS
@given(st.lists(plain, max_size=4), st.dictionaries(st.text(max_size=8), plain, max_size=4))
def test_arguments_round_trip_through_envelope(args: list[Any], kwargs: dict[str, Any]) -> None:
    env = Envelope("id", "tasks.t", "q", plain_args(tuple(args)), plain_kwargs(kwargs))
    out = decode_envelope(encode_envelope(env, 1 << 24))
    assert same(out.args, expected(args))
    assert same(out.kwargs, expected(kwargs))


@dataclasses.dataclass
class Record:
    """Not plain data."""

    value: int


class Mode(enum.Enum):
    """Not plain data."""

    A = "a"


class Opaque:
    """Not plain data."""


non_plain = st.one_of(
    st.sets(st.integers(), max_size=3),
    st.frozensets(st.integers(), max_size=3),
    st.complex_numbers(allow_nan=False),
    st.builds(Opaque),
    st.builds(Record, st.integers()),
    st.just(Mode.A),
    st.binary().map(bytearray),
    st.timedeltas(),
    st.times(),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2).map(OrderedDict),
    st.dictionaries(
        st.one_of(st.integers(), st.binary(), st.none(), st.tuples(st.text())),
        st.integers(),
        min_size=1,
        max_size=3,
    ),
)


@st.composite
def poisoned(draw: st.DrawFn) -> Any:
    """A plain container with one non-plain value planted somewhere inside."""
    bad = draw(non_plain)
    depth = draw(st.integers(min_value=0, max_value=3))
    value: Any = bad
    for _ in range(depth):
        siblings = draw(st.lists(scalars, max_size=3))
        where = draw(st.integers(min_value=0, max_value=len(siblings)))
        kind = draw(st.sampled_from(["list", "tuple", "dict"]))
        items = [*siblings[:where], value, *siblings[where:]]
        if kind == "list":
            value = items
        elif kind == "tuple":
            value = tuple(items)
        else:
            value = {f"k{i}": item for i, item in enumerate(items)}
    return value


@SETTINGS
@given(poisoned())
def test_non_plain_values_are_never_accepted(value: Any) -> None:
    for encode in (to_plain, dumps, lambda v: plain_args((v,)), lambda v: plain_kwargs({"v": v})):
        try:
            encode(value)
        except SerializationError:
            continue
        raise AssertionError(f"{encode} accepted {value!r}")


out_of_range = st.one_of(st.integers(min_value=2**64), st.integers(max_value=-(2**63) - 1))


@SETTINGS
@given(out_of_range, st.lists(scalars, max_size=3))
def test_integers_beyond_64_bits_are_refused_when_encoded(big: int, others: list[Any]) -> None:
    # An int is a plain type; its range is checked where the message is encoded.
    for value in (big, [*others, big], {"n": big}):
        try:
            dumps(value)
        except SerializationError:
            pass
        else:
            raise AssertionError(f"dumps accepted {value!r}")
        env = Envelope("id", "tasks.t", "q", plain_args((value,)))
        try:
            encode_envelope(env, 1 << 20)
        except SerializationError:
            pass
        else:
            raise AssertionError(f"encode_envelope accepted {value!r}")


@SETTINGS
@given(plain)
def test_to_plain_is_idempotent_on_its_output(value: Any) -> None:
    # The wire form is itself encodable, and encoding it again gives the same bytes.
    assert dumps(value) == dumps(loads(dumps(value)))


@SETTINGS
@given(st.uuids(), st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=20))
def test_envelope_header_fields_round_trip(task_id: uuid.UUID, task: str, queue: str) -> None:
    env = Envelope(task_id.hex, task, queue)
    assert decode_envelope(encode_envelope(env, 1 << 20)) == env
