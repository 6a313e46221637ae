"""Message envelope and plain-data serialization (MessagePack through msgspec).

Only plain data crosses the broker: ``None``, ``bool``, ``int`` (64-bit), ``float``, ``str``,
``bytes``, ``list``, ``tuple`` (decoded as ``list``), ``dict`` with ``str`` keys, plus
``datetime``, ``date``, ``UUID`` and ``Decimal`` through explicit MessagePack extension types
(a ``datetime`` in a ``ZoneInfo`` zone keeps its zone: extension 5). Richer values -- Structs,
dataclasses, enums, sets, ``timedelta``, pydantic models -- travel as plain data for the
parameters annotated with them (:mod:`blitzq.arguments`).
Anything else raises :class:`~blitzq.exceptions.SerializationError` where the value enters the
system (enqueue, or a task's return value). Nothing read from the broker is ever unpickled.

The :class:`Envelope` is a positional MessagePack array so that a no-argument message stays
around 60-90 bytes. New fields are only ever appended with defaults: a newer producer's extra
trailing fields are ignored by an older worker, and an older producer's shorter array decodes
with the defaults.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import re
import sys
import uuid
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from .exceptions import ConfigurationError, MessageTooLarge, SerializationError
from .limits import MAX_NESTING

#: Extension type codes used for the non-native plain types.
EXT_DATETIME: Final = 1
EXT_DATE: Final = 2
EXT_UUID: Final = 3
EXT_DECIMAL: Final = 4
#: A datetime in an IANA time zone: ISO 8601 with offset, then ``[zone key]`` (RFC 9557).
EXT_ZONED_DATETIME: Final = 5

_SCALARS: Final = frozenset({str, int, float, bool, type(None), bytes})
#: The extension types of plain data (what :func:`_to_ext` makes of a datetime, date, UUID or
#: Decimal): a value already in this form is kept as it is.
_WIRE_EXTS: Final = frozenset({EXT_DATETIME, EXT_DATE, EXT_UUID, EXT_DECIMAL, EXT_ZONED_DATETIME})
_TOO_DEEP: Final = (
    f"value is nested deeper than {MAX_NESTING} levels of lists and dicts "
    "(blitzq.limits.MAX_NESTING)"
)


def not_utf8(exc: UnicodeEncodeError) -> SerializationError:
    """The error for a ``str`` that is not valid Unicode text (a lone surrogate)."""
    return SerializationError(
        f"str values must be valid Unicode text: {exc.object[exc.start : exc.end]!r} "
        f"at position {exc.start} cannot be encoded as UTF-8 ({exc.reason})"
    )


def lookup_key(kind: str, value: Any) -> str:
    """Return ``value`` if it can name a task, queue or workflow in a call to the broker.

    What every lookup API checks where the id or name enters (``inspect``, ``get_result``,
    ``cancel``, ``retry``, ``get_progress``, ``purge_queue``, ``stats(queues=)``, …), so a
    bad one fails as it does at enqueue, not deep in the Redis client.

    Args:
        kind: what the value is, for the message (``"task id"``, ``"queue name"``).
        value: the id or name given.

    Raises:
        ConfigurationError: not a ``str`` (as enqueue's ``task_id=`` refuses one).
        SerializationError: not valid Unicode text (a lone surrogate such as ``"\\ud800"``,
            or a command-line argument that was not UTF-8): the error enqueue raises for it.
    """
    if not isinstance(value, str):
        raise ConfigurationError(f"{kind} must be a str, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        error = not_utf8(exc)
        raise SerializationError(f"{kind} {value!r}: {error}") from None
    return value


class Envelope(msgspec.Struct, array_like=True, gc=False):
    """One task message, as it travels through the broker.

    Attributes:
        id: task id (unique per task, kept across retries).
        task: registered task name.
        queue: physical queue name the message was published to.
        args: positional arguments (plain data).
        kwargs: keyword arguments (plain data, ``str`` keys).
        attempt: 1-based number of the attempt this message will run as.
        created_at: Unix time (seconds) the task was first enqueued.
        enqueued_at: Unix time (seconds) this copy was published (differs on retries). A
            message whose array ends before it (a first copy, ``enqueued_at`` equal to
            ``created_at`` and no optional field set: :func:`encode_envelope` leaves it off)
            decodes with ``created_at`` here.
        correlation_id: id shared by related tasks, or ``None``.
        headers: user metadata (``str`` keys, plain values), or ``None``.
        timeout: per-call timeout in seconds overriding the task's, or ``None``.
        reserved: a rate-limit token is already reserved for this copy (it runs without
            asking the bucket again).
        flow: workflow metadata of a step (plain data, see :mod:`blitzq.workflow`), or
            ``None`` for a task outside any workflow.
        unique_key: per-call unique key of a unique task (``None``: derived from the call).
        max_age: the per-call ``max_age`` of a message enqueued before the ``options``
            field (read by :mod:`blitzq.extensions.expiry`; new messages carry it in
            ``options``).
        deferrals: times in a row this copy was put back on the schedule because a start
            check could not reach the broker (``None``: none; see
            :mod:`blitzq.worker.deferral`); it sets the next deferral's delay.
        options: the per-call options middleware declare (``Middleware.call_options``), by
            name, plain data, or ``None``: one generic field, so a new per-call option is
            declared and read by its middleware alone (appended last: an older message,
            without it, decodes with ``None``).
        nonce: the mark of the enqueue made under an explicit ``task_id=`` (random text,
            kept by retries, recoveries and replays of that enqueue), ``None`` for a generated
            id. The newest enqueue of an id writes it as the id's owner (``tn:<id>``), and a
            run of an older enqueue of the id writes no record over the newer one's (see
            docs/guarantees.md, "re-using an id"; appended last, like ``options``).
    """

    id: str
    task: str
    queue: str
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    attempt: int = 1
    created_at: float = 0.0
    enqueued_at: float = 0.0
    correlation_id: str | None = None
    headers: dict[str, Any] | None = None
    timeout: float | None = None
    reserved: bool = False
    flow: Any = None
    unique_key: str | None = None
    max_age: float | None = None
    deferrals: int | None = None
    options: dict[str, Any] | None = None
    nonce: str | None = None


#: Fields always encoded (id … enqueued_at); the optional ones after them may be omitted.
_REQUIRED_FIELDS: Final = 8


def _is_zone_info(zone: _dt.tzinfo) -> bool:
    """``True`` for a :class:`zoneinfo.ZoneInfo` with a key (its zone is then kept).

    ``zoneinfo`` is not imported for this (it costs an idle worker about 0.35 MB, issue 29):
    a ``ZoneInfo`` can only exist once the application has imported ``zoneinfo``.
    """
    zoneinfo = sys.modules.get("zoneinfo")
    return zoneinfo is not None and type(zone) is zoneinfo.ZoneInfo and bool(zone.key)  # type: ignore[attr-defined]


def _to_ext(value: Any, depth: int = 1) -> Any:
    """Convert one non-scalar value into its wire form, recursing into containers.

    Raises:
        SerializationError: not plain data, or containers nested past ``MAX_NESTING``
            levels (``depth``: the level of ``value`` if it is a container).
    """
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is msgspec.msgpack.Ext and value.code in _WIRE_EXTS:
        return value  # converted already (a workflow's step, a periodic task's arguments)
    if (kind is list or kind is tuple or kind is dict) and depth > MAX_NESTING:
        raise SerializationError(_TOO_DEEP)
    if kind is list or kind is tuple:
        return [_to_ext(item, depth + 1) for item in value]
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise SerializationError(
                    f"dict keys must be str, got {type(key).__name__} key {key!r}"
                )
            out[key] = _to_ext(item, depth + 1)
        return out
    if kind is _dt.datetime:
        zone = value.tzinfo
        if zone is not None and _is_zone_info(zone):  # keeps its zone, not only the offset
            return msgspec.msgpack.Ext(
                EXT_ZONED_DATETIME, f"{value.isoformat()}[{zone.key}]".encode()
            )
        return msgspec.msgpack.Ext(EXT_DATETIME, value.isoformat().encode())
    if kind is _dt.date:
        return msgspec.msgpack.Ext(EXT_DATE, value.isoformat().encode())
    if kind is uuid.UUID:
        return msgspec.msgpack.Ext(EXT_UUID, value.bytes)
    if kind is decimal.Decimal:
        return msgspec.msgpack.Ext(EXT_DECIMAL, str(value).encode())
    raise SerializationError(
        f"value of type {kind.__module__}.{kind.__qualname__} is not plain data "
        "(allowed: None, bool, int, float, str, bytes, list, tuple, dict with str keys, "
        "datetime, date, UUID, Decimal); a msgspec Struct, dataclass, Enum, set, frozenset, "
        "timedelta or pydantic model travels when the task's parameter (or return value) is "
        "annotated with its type (docs/arguments.md)"
    )


def to_plain(value: Any) -> Any:
    """Check that ``value`` is plain data and return its wire form.

    Raises:
        SerializationError: when any nested value is not plain data or a dict key is not str,
            or the value is nested deeper than Python's recursion limit.
    """
    if type(value) in _SCALARS:
        return value
    try:
        return _to_ext(value)
    except RecursionError:
        raise SerializationError(_TOO_DEEP) from None


def plain_args(args: tuple[Any, ...] | list[Any]) -> list[Any]:
    """Return the wire form of positional arguments (fast path when all are scalars).

    Raises:
        SerializationError: an argument is not plain data or is nested too deep.
    """
    for item in args:
        if type(item) not in _SCALARS:
            try:
                return [_to_ext(item) for item in args]
            except RecursionError:
                raise SerializationError(_TOO_DEEP) from None
    return list(args)


def plain_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Return the wire form of keyword arguments (the dict is copied only when needed).

    Raises:
        SerializationError: a key that is not ``str`` or a value that is not plain data.
    """
    for key, item in kwargs.items():
        if type(key) is not str:
            raise SerializationError(f"keyword argument names must be str, got {key!r}")
        if type(item) not in _SCALARS:
            try:
                return {key: _to_ext(item) for key, item in kwargs.items()}
            except RecursionError:
                raise SerializationError(_TOO_DEEP) from None
    return kwargs


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == EXT_DATETIME:
        return _dt.datetime.fromisoformat(bytes(data).decode())
    if code == EXT_DATE:
        return _dt.date.fromisoformat(bytes(data).decode())
    if code == EXT_UUID:
        return uuid.UUID(bytes=bytes(data))
    if code == EXT_DECIMAL:
        return decimal.Decimal(bytes(data).decode())
    if code == EXT_ZONED_DATETIME:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # on first use (issue 29: memory)

        text, _, key = bytes(data).decode().rstrip("]").partition("[")
        try:
            zone = ZoneInfo(key)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise SerializationError(f"unknown time zone {key!r}") from exc
        return _dt.datetime.fromisoformat(text).astimezone(zone)
    raise SerializationError(f"unknown extension type {code}")


_encoder: Final = msgspec.msgpack.Encoder()
_envelope_decoder: Final = msgspec.msgpack.Decoder(Envelope, ext_hook=_ext_hook)
_any_decoder: Final = msgspec.msgpack.Decoder(ext_hook=_ext_hook)


#: The envelope's fields that hold plain data (args, kwargs, headers, flow, options), by
#: position: what :func:`encode_envelope` puts in wire form.
_PLAIN_FIELDS: Final = tuple(
    Envelope.__struct_fields__.index(name)
    for name in ("args", "kwargs", "headers", "flow", "options")
)


def encode_envelope(envelope: Envelope, max_size: int) -> bytes:
    """Encode an envelope, its plain data (args, kwargs, headers, flow, options) in wire form
    whichever form it holds: as made by :func:`plain_args` and :func:`plain_kwargs` (an
    enqueue's), or as decoded from a message (a retry's, a replay's, a deferral's: a
    datetime, date, UUID or Decimal decoded as itself is made its extension type again, not
    encoded by msgspec as a string).

    Raises:
        SerializationError: an integer beyond 64 bits, a ``str`` that is not valid Unicode
            (a lone surrogate such as ``"\\ud800"``), or another encoding failure.
        MessageTooLarge: the message is over ``max_size`` bytes.
    """
    values = list(msgspec.structs.astuple(envelope))
    try:
        for at in _PLAIN_FIELDS:
            value = values[at]
            if type(value) not in _SCALARS:
                values[at] = _rewired(value)
    except RecursionError:  # deeper than a message decodes: encoded as it is, as before
        values = list(msgspec.structs.astuple(envelope))
    return _encode_values(values, max_size)


_REWIRED: Final = frozenset({_dt.datetime, _dt.date, uuid.UUID, decimal.Decimal})


def _rewired(value: Any) -> Any:
    """``value`` with each datetime, date, UUID and Decimal in it made its extension type
    (:func:`_to_ext`), at any depth of lists, tuples and dicts. Nothing else is checked or
    changed: a decoded message's other values (a dict with int keys written by hand) encode
    as they did, and a copy of a message never fails where its first encoding passed."""
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is list or kind is tuple:
        return [_rewired(item) for item in value]
    if kind is dict:
        return {key: _rewired(item) for key, item in value.items()}
    if kind in _REWIRED:
        return _to_ext(value)
    return value


def encode_wire_envelope(envelope: Envelope, max_size: int) -> bytes:
    """Encode an envelope whose plain data is already in wire form (just made by
    :func:`plain_args` / :func:`plain_kwargs`: an enqueue's, which converted it once).

    Raises:
        SerializationError, MessageTooLarge: as :func:`encode_envelope`.
    """
    return _encode_values(msgspec.structs.astuple(envelope), max_size)


def _encode_values(values: Sequence[Any], max_size: int) -> bytes:
    """The MessagePack array of an envelope's field ``values`` (see the callers)."""
    # Trailing optional fields still at their default (None / False) are left out: an
    # older or shorter array decodes with the defaults, so a plain message stays small.
    end = len(values)
    while end > _REQUIRED_FIELDS and (values[end - 1] is None or values[end - 1] is False):
        end -= 1
    if end == _REQUIRED_FIELDS and values[7] == values[6]:
        end -= 1  # enqueued_at, the last one left, equals created_at: decoded as it (9 bytes)
    try:
        data = _encoder.encode(values[:end])
    except UnicodeEncodeError as exc:
        raise not_utf8(exc) from None
    except (TypeError, OverflowError) as exc:
        raise SerializationError(str(exc)) from exc
    except RecursionError:
        raise SerializationError(_TOO_DEEP) from None
    if len(data) > max_size:
        raise MessageTooLarge(len(data), max_size)
    return data


_decode: Final = _envelope_decoder.decode
#: The envelope decoder's own ``decode`` (no Python frame of its own): the worker's hot path
#: inlines :func:`decode_envelope_unchecked` with it.
decode_envelope_raw: Final = _decode


def decode_envelope_unchecked(data: bytes) -> Envelope:
    """Decode an envelope without the error translation of :func:`decode_envelope` (the
    worker's hot path: on any exception, call :func:`decode_envelope` for the error to raise).
    An ``enqueued_at`` left off (decoded as its default ``0.0``) is ``created_at``."""
    env = _decode(data)
    if not env.enqueued_at:
        env.enqueued_at = env.created_at
    return env


def decode_envelope(data: bytes) -> Envelope:
    """Decode a message read from the broker.

    Raises:
        SerializationError: the bytes are not a well-formed envelope ("malformed message").
    """
    try:
        return decode_envelope_unchecked(data)
    except (
        msgspec.DecodeError,
        SerializationError,
        ValueError,
        ArithmeticError,
        RecursionError,
    ) as exc:
        # ArithmeticError: decimal.InvalidOperation from a malformed Decimal extension;
        # RecursionError: arrays or maps nested deeper than the decoder's recursion limit.
        raise SerializationError(f"malformed message: {_name_field(str(exc))}") from exc


_FIELD_PATH: Final = re.compile(r"`\$\[(\d+)\]")


def _name_field(error: str) -> str:
    """msgspec's error with the envelope field its path starts at named: ``... - at `$[6]```
    becomes ``... - at `$[6]` (created_at)``."""
    found = _FIELD_PATH.search(error)
    fields = Envelope.__struct_fields__
    if found is None or int(found.group(1)) >= len(fields):
        return error
    return f"{error} ({fields[int(found.group(1))]})"


def _read_str(data: bytes, pos: int) -> tuple[str, int] | None:
    """The MessagePack ``str`` at ``pos`` and the position after it, or ``None``."""
    if pos >= len(data):
        return None
    head = data[pos]
    if 0xA0 <= head <= 0xBF:
        size, pos = head & 0x1F, pos + 1
    elif head in (0xD9, 0xDA, 0xDB):
        width = {0xD9: 1, 0xDA: 2, 0xDB: 4}[head]
        if pos + 1 + width > len(data):
            return None
        size, pos = int.from_bytes(data[pos + 1 : pos + 1 + width], "big"), pos + 1 + width
    else:
        return None
    if pos + size > len(data):
        return None
    try:
        return data[pos : pos + size].decode(), pos + size
    except UnicodeDecodeError:
        return None


def envelope_head(data: bytes) -> tuple[str, str] | None:
    """``(id, task)`` of a message that does not decode as a whole, when they can be read.

    A message malformed in one field (a ``correlation_id`` of the wrong type, a bad
    extension value, arguments nested too deep) still starts with its id and task name, the
    first two elements of the envelope array. Only those two headers are parsed, whatever
    follows (so a message too large or nested too deep costs nothing more), so the worker can
    dead-letter it under its task id and write a final record that wakes its waiters.

    Args:
        data: the raw message bytes.

    Returns:
        The id and task name (the task name may be ``""``), or ``None`` when the message does
        not start with an array whose first element is a usable task id (a non-empty string
        without spaces, braces or newlines).
    """
    if not data:
        return None
    head = data[0]
    if 0x92 <= head <= 0x9F:
        pos = 1
    elif head == 0xDC and len(data) >= 3:
        pos = 3
    elif head == 0xDD and len(data) >= 5:
        pos = 5
    else:
        return None
    first = _read_str(data, pos)
    if first is None:
        return None
    ident, pos = first
    if not ident or any(c in ident for c in "{}\n\r\0 "):
        return None
    second = _read_str(data, pos)
    return ident, second[0] if second is not None else ""


_sorted_encoder: Final = msgspec.msgpack.Encoder(order="sorted")


def dumps(value: Any, sort_keys: bool = False) -> bytes:
    """Encode any plain-data value (results, records) to MessagePack.

    Args:
        value: plain data.
        sort_keys: every dict's keys in sorted order, at any depth (one encoding for equal
            values: a unique task's key), rather than in their insertion order.

    Raises:
        SerializationError: ``value`` is not plain data (or is nested too deep, or holds a
            ``str`` that is not valid Unicode).
    """
    try:
        return (_sorted_encoder if sort_keys else _encoder).encode(to_plain(value))
    except SerializationError:
        raise
    except UnicodeEncodeError as exc:
        raise not_utf8(exc) from None
    except (TypeError, OverflowError) as exc:
        raise SerializationError(str(exc)) from exc
    except RecursionError:
        raise SerializationError(_TOO_DEEP) from None


def loads(data: bytes) -> Any:
    """Decode MessagePack written by :func:`dumps`.

    Raises:
        SerializationError: the bytes are not valid MessagePack (or are nested too deep).
    """
    try:
        return _any_decoder.decode(data)
    except (msgspec.DecodeError, ValueError, ArithmeticError, RecursionError) as exc:
        raise SerializationError(f"malformed data: {exc}") from exc


def jsonable(value: Any) -> Any:
    """``json.dumps``'s ``default`` for user data shown as JSON (the CLI's ``--json``, the
    dashboard's API): bytes as text, or ``{"base64": ...}`` when not UTF-8; ``datetime`` and
    ``date`` in ISO 8601; ``UUID`` and ``Decimal`` as strings; sets and tuples as lists; any
    other value as its ``repr``."""
    if isinstance(value, bytes | bytearray | memoryview):
        raw = bytes(value)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode()}
    if isinstance(value, _dt.date):  # datetime too
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return repr(value)
