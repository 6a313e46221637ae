"""Plain-data serialization and the message envelope (no broker involved)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import math
import time
import uuid
from collections import OrderedDict
from typing import Any

import msgspec
import pytest

from blitzq import MessageTooLarge, SerializationError
from blitzq.records import DeadLetter, TaskRecord
from blitzq.serialization import (
    EXT_DECIMAL,
    Envelope,
    decode_envelope,
    decode_envelope_unchecked,
    dumps,
    encode_envelope,
    loads,
    plain_args,
    plain_kwargs,
    to_plain,
)

UTC = dt.UTC
IST = dt.timezone(dt.timedelta(hours=5, minutes=30))
NEG = dt.timezone(dt.timedelta(hours=-7))


def round_trip(value: Any) -> Any:
    """``value`` through dumps/loads."""
    return loads(dumps(value))


def envelope_round_trip(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Envelope:
    """An envelope carrying ``args``/``kwargs`` through encode/decode."""
    env = Envelope("id-1", "tasks.t", "q", plain_args(args), plain_kwargs(kwargs))
    return decode_envelope(encode_envelope(env, 1 << 20))


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize(
    "value",
    [
        None,
        True,
        False,
        0,
        -1,
        2**63 - 1,
        2**63,
        2**64 - 1,
        -(2**63),
        1.5,
        -0.25,
        1e308,
        float("inf"),
        float("-inf"),
        "",
        "plain",
        "ünïcødé ✓ 🚀",
        b"",
        b"\x00\xff binary",
        [],
        {},
        [1, "a", None, [2.5, [b"x"]]],
        {"a": {"b": {"c": [1, {"d": None}]}}},
    ],
    ids=repr,
)
def test_native_values_round_trip_with_their_type(value: Any) -> None:
    out = round_trip(value)
    assert out == value
    assert type(out) is type(value)


def test_nan_round_trips() -> None:
    assert math.isnan(round_trip(float("nan")))


@pytest.mark.parametrize(
    "value",
    [
        dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
        dt.datetime(1970, 1, 1),
        dt.datetime(1, 1, 1),
        dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
    ],
    ids=str,
)
def test_naive_datetime_stays_naive(value: dt.datetime) -> None:
    out = round_trip(value)
    assert type(out) is dt.datetime
    assert out == value
    assert out.tzinfo is None


@pytest.mark.parametrize("tz", [UTC, IST, NEG], ids=str)
def test_aware_datetime_keeps_instant_and_offset(tz: dt.timezone) -> None:
    value = dt.datetime(2025, 6, 1, 12, 30, 15, 42, tzinfo=tz)
    out = round_trip(value)
    assert out == value
    assert out.utcoffset() == value.utcoffset()
    assert out.isoformat() == value.isoformat()


def test_date_uuid_decimal_round_trip() -> None:
    values = {
        "date": dt.date(2024, 2, 29),
        "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "uuid4": uuid.uuid4(),
        "dec": decimal.Decimal("1.10"),
        "tiny": decimal.Decimal("-0.000000000000000000000000001"),
        "huge": decimal.Decimal("123456789012345678901234567890.123456789"),
        "exp": decimal.Decimal("1E+3"),
        "inf": decimal.Decimal("-Infinity"),
    }
    out = round_trip(values)
    assert out == values
    for key, value in values.items():
        assert type(out[key]) is type(value), key
        assert str(out[key]) == str(value), key  # precision and exponent kept
    assert type(round_trip(dt.date(2000, 1, 1))) is dt.date  # not a datetime


def test_tuples_become_lists_recursively() -> None:
    value = (1, (2, 3), {"t": (4, (5,))}, [(6,)])
    assert round_trip(value) == [1, [2, 3], {"t": [4, [5]]}, [[6]]]


def test_nested_containers_with_extension_types() -> None:
    when = dt.datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    value = {
        "rows": [
            {"id": uuid.UUID(int=i), "at": when, "amount": decimal.Decimal(i)} for i in range(3)
        ],
        "meta": {"day": dt.date(2025, 1, 2), "tags": ("a", "b")},
    }
    out = round_trip(value)
    assert out["rows"] == value["rows"]
    assert out["meta"] == {"day": dt.date(2025, 1, 2), "tags": ["a", "b"]}


def test_arguments_round_trip_through_the_envelope() -> None:
    when = dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=IST)
    args = (1, "two", (3, 4), {"k": [when]}, b"\x01")
    kwargs = {"id": uuid.UUID(int=7), "price": decimal.Decimal("9.99"), "on": dt.date(2025, 3, 4)}
    env = envelope_round_trip(args, kwargs)
    assert env.args == [1, "two", [3, 4], {"k": [when]}, b"\x01"]
    assert env.kwargs == kwargs
    assert env.args[3]["k"][0].utcoffset() == when.utcoffset()


def test_to_plain_returns_wire_form_of_scalars_unchanged() -> None:
    for value in (None, 1, 1.5, "s", b"b", True):
        assert to_plain(value) is value


# -------------------------------------------------------------------------- refusals
@dataclasses.dataclass
class Point:
    """Not plain data."""

    x: int


class Colour(enum.Enum):
    """Not plain data."""

    RED = 1


@pytest.mark.parametrize(
    "value",
    [
        object(),
        {1, 2},
        frozenset(),
        Point(1),
        Colour.RED,
        complex(1, 1),
        bytearray(b"x"),
        memoryview(b"x"),
        dt.timedelta(1),
        dt.time(12, 0),
        range(3),
        OrderedDict(a=1),
        {1: "int key"},
        {b"k": "bytes key"},
        {None: 1},
        [1, [2, [3, {4}]]],
        {"ok": {"nested": object()}},
        lambda: None,
    ],
    ids=lambda v: type(v).__name__,
)
def test_non_plain_values_are_refused(value: Any) -> None:
    with pytest.raises(SerializationError):
        to_plain(value)
    with pytest.raises(SerializationError):
        dumps(value)
    with pytest.raises(SerializationError):
        plain_args((1, value))
    with pytest.raises(SerializationError):
        plain_kwargs({"a": 1, "b": value})


def test_error_names_the_offending_type_and_key() -> None:
    with pytest.raises(SerializationError, match="set"):
        to_plain([{1}])
    with pytest.raises(SerializationError, match="dict keys must be str"):
        to_plain({"outer": {3: "x"}})


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**30])
def test_integers_beyond_64_bits_are_refused(value: int) -> None:
    with pytest.raises(SerializationError):
        dumps(value)
    with pytest.raises(SerializationError):
        encode_envelope(Envelope("i", "t", "q", plain_args((value,))), 1 << 20)


def test_loads_of_garbage_is_a_serialization_error() -> None:
    for data in (b"\xc1", b"\x92\x01", b"\xd4\x63?", b""):
        with pytest.raises(SerializationError):
            loads(data)


def test_malformed_extension_payloads_are_serialization_errors() -> None:
    bad_decimal = msgspec.msgpack.encode(
        ["i", "t", "q", [msgspec.msgpack.Ext(EXT_DECIMAL, b"not a number")]]
    )
    bad_uuid = msgspec.msgpack.encode(["i", "t", "q", [msgspec.msgpack.Ext(3, b"short")]])
    bad_date = msgspec.msgpack.encode(["i", "t", "q", [msgspec.msgpack.Ext(2, b"\xff")]])
    for data in (bad_decimal, bad_uuid, bad_date):
        with pytest.raises(SerializationError, match="malformed message"):
            decode_envelope(data)
    with pytest.raises(SerializationError):
        loads(msgspec.msgpack.encode(msgspec.msgpack.Ext(EXT_DECIMAL, b"??")))


# -------------------------------------------------------------------------- envelope
def full_envelope() -> Envelope:
    """An envelope with every field set."""
    return Envelope("abc", "tasks.t", "q", [1], {"k": "v"}, 3, 100.5, 200.25, "corr", {"h": 1}, 9.5)


def test_envelope_round_trips_every_field() -> None:
    env = full_envelope()
    assert decode_envelope(encode_envelope(env, 1 << 20)) == env


def test_envelope_is_a_positional_array() -> None:
    raw = msgspec.msgpack.decode(encode_envelope(full_envelope(), 1 << 20))
    assert isinstance(raw, list)
    # The documented positions; fields appended later (with defaults) follow them.
    assert raw[:11] == [
        "abc",
        "tasks.t",
        "q",
        [1],
        {"k": "v"},
        3,
        100.5,
        200.25,
        "corr",
        {"h": 1},
        9.5,
    ]


def test_envelope_from_a_newer_producer_with_extra_fields_decodes() -> None:
    # A newer producer writes every field it knows (trailing defaults are only left out when
    # nothing follows them), then its new ones.
    fields = list(msgspec.structs.astuple(full_envelope()))
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(fields))
    newer = msgspec.msgpack.encode([*raw, "future field", {"more": [1, 2]}, 42])
    assert decode_envelope(newer) == full_envelope()


def test_envelope_from_an_older_producer_gets_defaults() -> None:
    env = decode_envelope(msgspec.msgpack.encode(["old", "tasks.t", "q"]))
    assert env == Envelope("old", "tasks.t", "q")
    assert (env.args, env.kwargs, env.attempt) == ([], {}, 1)
    assert (env.created_at, env.enqueued_at) == (0.0, 0.0)
    assert env.correlation_id is None
    assert env.headers is None
    assert env.timeout is None
    five = decode_envelope(msgspec.msgpack.encode(["old", "tasks.t", "q", [1], {"a": 2}]))
    assert (five.args, five.kwargs, five.attempt) == ([1], {"a": 2}, 1)


def test_defaults_are_not_shared_between_envelopes() -> None:
    a = decode_envelope(msgspec.msgpack.encode(["a", "t", "q"]))
    a.args.append(1)
    a.kwargs["x"] = 1
    b = decode_envelope(msgspec.msgpack.encode(["b", "t", "q"]))
    assert b.args == []
    assert b.kwargs == {}


@pytest.mark.parametrize(
    "raw",
    [
        ["only-id", "task"],  # a required field missing
        [1, "t", "q"],
        ["i", "t", "q", [], {}, "not an int"],
        {"id": "i", "task": "t", "queue": "q"},
    ],
    ids=repr,
)
def test_envelope_of_wrong_shape_is_malformed(raw: Any) -> None:
    with pytest.raises(SerializationError, match="malformed message"):
        decode_envelope(msgspec.msgpack.encode(raw))


def test_no_argument_envelope_is_small() -> None:
    now = time.time()
    env = Envelope(uuid.uuid4().hex, "app.tasks.send_report", "default", [], {}, 1, now, now)
    data = encode_envelope(env, 1 << 20)
    assert len(data) < 100


def test_a_first_copy_leaves_enqueued_at_off() -> None:
    """A first copy with no optional field ends at ``created_at`` (9 bytes fewer); it decodes
    with ``enqueued_at`` equal to ``created_at``, on the checked and the hot path."""
    now = time.time()
    env = Envelope(uuid.uuid4().hex, "app.tasks.send_report", "default", [], {}, 1, now, now)
    data = encode_envelope(env, 1 << 20)
    assert len(msgspec.msgpack.decode(data)) == 7
    for decode in (decode_envelope, decode_envelope_unchecked):
        assert decode(data) == env
        assert decode(data).enqueued_at == now
    # What a producer before this change wrote: the eight required fields, enqueued_at last.
    older = msgspec.msgpack.encode(list(msgspec.structs.astuple(env))[:8])
    assert len(older) == len(data) + 9
    for decode in (decode_envelope, decode_envelope_unchecked):
        assert decode(older) == env
    retried = msgspec.structs.replace(env, attempt=2, enqueued_at=now + 5)
    assert decode_envelope(encode_envelope(retried, 1 << 20)).enqueued_at == now + 5
    headed = msgspec.structs.replace(env, headers={"h": 1})
    raw = msgspec.msgpack.decode(encode_envelope(headed, 1 << 20))
    assert raw[7] == now  # kept where an optional field follows it
    assert decode_envelope(encode_envelope(headed, 1 << 20)) == headed


def test_max_message_size_is_inclusive() -> None:
    env = Envelope("i", "t", "q", ["x" * 200])
    size = len(encode_envelope(env, 1 << 20))
    assert len(encode_envelope(env, size)) == size
    with pytest.raises(MessageTooLarge) as info:
        encode_envelope(env, size - 1)
    assert (info.value.size, info.value.limit) == (size, size - 1)
    assert isinstance(info.value, SerializationError)


# --------------------------------------------------------------------------- records
def test_task_record_decodes_with_defaults_and_rejects_garbage() -> None:
    rec = TaskRecord.from_bytes(dumps({"id": "x", "state": "succeeded", "result": [1]}))
    assert rec.id == "x"
    assert rec.result == [1]
    assert rec.attempts == 0
    with pytest.raises(SerializationError):
        TaskRecord.from_bytes(dumps([1, 2]))
    with pytest.raises(SerializationError):
        TaskRecord.from_bytes(dumps({"state": "exploded"}))
    with pytest.raises(SerializationError):
        TaskRecord.from_bytes(b"\xc1")


def test_dead_letter_of_a_malformed_message_has_no_arguments() -> None:
    dead = DeadLetter.from_fields("tok", b"\xc1garbage", "malformed message", "e", "", "q", 1.0)
    assert dead.args is None
    assert dead.kwargs is None
    assert dead.task == ""
    good = encode_envelope(Envelope("i", "tasks.t", "q", [1], {"a": 2}), 1 << 20)
    dead = DeadLetter.from_fields("i", good, "failed", "e", "", "q", 1.0)
    assert (dead.args, dead.kwargs, dead.task) == ([1], {"a": 2}, "tasks.t")


# ------------------------------------------------------------------------- nesting depth
def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


def test_value_nested_too_deep_is_a_serialization_error_not_recursion_error() -> None:
    deep = _nested(100_000)
    for encode in (dumps, to_plain, lambda v: plain_args((v,)), lambda v: plain_kwargs({"k": v})):
        with pytest.raises(SerializationError, match="nested deeper"):
            encode(deep)


def test_one_nesting_limit_for_every_encoded_value() -> None:
    """``MAX_NESTING`` levels pass, one more is refused with the limit named, whatever the
    interpreter's recursion limit (arguments, keyword arguments, results and records)."""
    from blitzq.limits import MAX_NESTING

    at = _nested(MAX_NESTING - 1)  # MAX_NESTING lists, one inside the other
    past = _nested(MAX_NESTING)
    mixed: Any = {}
    for _ in range(MAX_NESTING):
        mixed = {"k": [mixed]} if isinstance(mixed, dict) else mixed
    encoders = (dumps, to_plain, lambda v: plain_args((v,)), lambda v: plain_kwargs({"k": v}))
    for encode in encoders:
        encode(at)
        with pytest.raises(SerializationError, match=rf"deeper than {MAX_NESTING} levels"):
            encode(past)
        with pytest.raises(SerializationError, match=r"blitzq\.limits\.MAX_NESTING"):
            encode(mixed)  # dicts and lists count alike: 2 levels per round
    assert loads(dumps(at)) == at


def test_message_nested_too_deep_is_malformed() -> None:
    nested = b"\x94\xa1i\xa1t\xa1q" + b"\x91" * 200_000 + b"\xc0"
    with pytest.raises(SerializationError, match="malformed message"):
        decode_envelope(nested)
    with pytest.raises(SerializationError, match="malformed data"):
        loads(b"\x91" * 200_000 + b"\xc0")
    dead = DeadLetter.from_fields("x", nested, "malformed message", "", "", "q", 0.0)
    assert dead.args is None
    assert dead.kwargs is None
