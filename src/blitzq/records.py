"""What users read back about tasks: states and records (dead letters: :mod:`blitzq.dead_letters`).

This module is the one reader (:class:`TaskRecord`) **and writer** (the builders below) of
task records: every record blitzq stores, except the one ``recover.lua`` writes for a
message delivered too often (:func:`deliveries_exceeded` is its Python twin; a contract
test holds the two equal), is made here.

A record is a MessagePack map with some of the keys :data:`RECORD_FIELDS`, in that order.
Each builder writes a fixed key set (the one blitzq has always written for that state); a
key it does not write reads back as ``None`` (``attempts``: 0). A ``succeeded`` record
without a ``result`` key is one whose task does not store results.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from .arg_preview import preview
from .dead_letters import DeadLetter as DeadLetter
from .exceptions import SerializationError
from .serialization import _SCALARS, _TOO_DEEP, loads, not_utf8, to_plain


class TaskState(enum.StrEnum):
    """Where a task is in its life.

    Final states: succeeded, failed, dead_lettered, cancelled, expired (waited longer than
    its ``max_age``; never ran).
    """

    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
    CANCELLING = "cancelling"  # never stored: inspect() of a running task a cancel waits for
    RETRYING = "retrying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    DEAD_LETTERED = "dead_lettered"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def is_final(self) -> bool:
        """Whether the task will not run again in this state."""
        return self in _FINAL


_FINAL = frozenset(
    {
        TaskState.SUCCEEDED,
        TaskState.FAILED,
        TaskState.DEAD_LETTERED,
        TaskState.CANCELLED,
        TaskState.EXPIRED,
    }
)


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task's stored record, as returned by ``queue.inspect(id)``.

    Attributes:
        id: task id.
        task: task name.
        queue: physical queue.
        state: current state.
        attempts: attempts made so far (crash redeliveries included).
        result: the return value (succeeded only).
        error_type: qualified exception type, or a reason such as ``MaxDeliveriesExceeded``.
        error: the error message.
        traceback: formatted traceback of the last failure, when captured.
        enqueued_at, started_at, finished_at: Unix times in seconds, or ``None``.
        worker: id of the worker that wrote the record.
        result_stored: ``False`` for a succeeded record written without the return value
            (the task does not store results); ``True`` otherwise.
        due_at: for a task waiting on the schedule (a delay, an eta, a retry's backoff):
            when it is due, Unix seconds on the broker's clock; ``None`` otherwise. Not
            stored: ``inspect`` reads it from the schedule.
        args, kwargs: a preview of the call's arguments (:func:`blitzq.arg_preview.preview`,
            at most 2048 bytes), or ``None``. Kept by failed, dead-lettered, retrying, expired
            and worker-cancelled records; with ``track_state`` by queued, scheduled, running
            and succeeded ones too. Stored as one key, ``call``.
        args_truncated: the preview was cut to fit (its cut parts are marked ``…``).
    """

    id: str
    task: str
    queue: str
    state: TaskState
    attempts: int = 0
    result: Any = None
    error_type: str | None = None
    error: str | None = None
    traceback: str | None = None
    enqueued_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    worker: str | None = None
    result_stored: bool = True
    due_at: float | None = None
    args: list[Any] | None = None
    kwargs: dict[str, Any] | None = None
    args_truncated: bool = False

    @classmethod
    def from_bytes(cls, data: bytes) -> TaskRecord:
        """Decode a stored record.

        Raises:
            SerializationError: the bytes are not a record.
        """
        return cls.from_map(loads(data))

    @classmethod
    def from_map(cls, raw: Any) -> TaskRecord:
        """A record from its decoded map (what :meth:`from_bytes` decodes ``data`` to).

        Raises:
            SerializationError: ``raw`` is not a record (not a map, or an unknown state).
        """
        if not isinstance(raw, dict):
            raise SerializationError("record is not a map")
        try:
            state = TaskState(raw.get("state", "failed"))
        except ValueError as exc:
            raise SerializationError(f"unknown state {raw.get('state')!r}") from exc
        return cls(
            id=str(raw.get("id", "")),
            task=str(raw.get("task", "")),
            queue=str(raw.get("queue", "")),
            state=state,
            attempts=int(raw.get("attempts") or 0),
            result=raw.get("result"),
            error_type=raw.get("error_type"),
            error=raw.get("error"),
            traceback=raw.get("traceback"),
            enqueued_at=raw.get("enqueued_at"),
            started_at=raw.get("started_at"),
            finished_at=raw.get("finished_at"),
            worker=raw.get("worker"),
            result_stored=state is not TaskState.SUCCEEDED or "result" in raw,
            **_call_fields(raw.get("call")),
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for ``--json`` output)."""
        return {
            "id": self.id,
            "task": self.task,
            "queue": self.queue,
            "state": self.state.value,
            "attempts": self.attempts,
            "result": self.result,
            "error_type": self.error_type,
            "error": self.error,
            "traceback": self.traceback,
            "enqueued_at": self.enqueued_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "worker": self.worker,
            "result_stored": self.result_stored,
            "due_at": self.due_at,
            "args": self.args,
            "kwargs": self.kwargs,
            "args_truncated": self.args_truncated,
        }


def _call_fields(call: Any) -> dict[str, Any]:
    """:class:`TaskRecord`'s ``args``, ``kwargs`` and ``args_truncated`` from a stored
    ``call`` (``{}`` when the record keeps none, or they are not a preview's types)."""
    if not isinstance(call, dict):
        return {}
    args, kwargs = call.get("args"), call.get("kwargs")
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return {}
    return {"args": args, "kwargs": kwargs, "args_truncated": bool(call.get("truncated"))}


# ------------------------------------------------------------------------------ writer
# The builders' common arguments: ``task_id``, ``task`` (name), ``queue`` (physical queue);
# ``attempts`` (this run's attempt number); ``enqueued_at`` (Unix seconds the message was
# created), ``started_at`` (Unix seconds the run started, ``None`` when not known);
# ``worker`` (the writing worker's id); ``error_type``/``error`` (qualified type or reason,
# and message); ``call`` (the message's ``(args, kwargs)``: the record keeps their preview,
# see :mod:`blitzq.arg_preview`; ``None``: no arguments kept). Builders of a record that ends
# a run or an attempt set ``finished_at`` to now unless they take it as an argument.


class _Stored(msgspec.Struct, gc=False):
    """A record as written: a field left :data:`msgspec.UNSET` is not written at all, so each
    builder keeps the exact key set of its state (field order = :data:`RECORD_FIELDS`)."""

    id: str
    task: str
    queue: str
    state: str
    attempts: Any = msgspec.UNSET
    enqueued_at: Any = msgspec.UNSET
    started_at: Any = msgspec.UNSET
    finished_at: Any = msgspec.UNSET
    worker: Any = msgspec.UNSET
    result: Any = msgspec.UNSET
    error_type: Any = msgspec.UNSET
    error: Any = msgspec.UNSET
    traceback: Any = msgspec.UNSET
    call: Any = msgspec.UNSET  # the arguments' preview: {"args", "kwargs", "truncated"}
    # msgspec writes a map16 header once a Struct has more than 15 fields, written or not:
    # a 16th field would change the bytes of every record (the default success included).


#: Every key a task record may have, in the order the builders write them.
RECORD_FIELDS: Final[tuple[str, ...]] = _Stored.__struct_fields__

#: The reason and message of a record cancelled by request.
CANCELLED_TYPE: Final = "TaskCancelled"
CANCELLED_MESSAGE: Final = "cancelled by request"

_UNSET: Final[Any] = msgspec.UNSET
_encode: Final = msgspec.msgpack.Encoder().encode


def _encode_checked(record: _Stored) -> bytes:
    """Encode a record whose ``result`` is already in wire form (see ``to_plain``)."""
    try:
        return _encode(record)
    except UnicodeEncodeError as exc:  # a lone surrogate in the result
        raise not_utf8(exc) from None
    except (TypeError, OverflowError) as exc:
        raise SerializationError(str(exc)) from exc
    except RecursionError:
        raise SerializationError(_TOO_DEEP) from None


def _keep(record: _Stored, call: tuple[Any, Any] | None) -> _Stored:
    """``record`` with the preview of ``call`` (``(args, kwargs)``; ``None``: unchanged)."""
    if call is not None:
        record.call = preview(*call)
    return record


def queued(
    task_id: str,
    task: str,
    queue: str,
    enqueued_at: float,
    scheduled: bool = False,
    call: tuple[Any, Any] | None = None,
) -> bytes:
    """The record of a task just enqueued (``track_state``): ``queued``, or ``scheduled``
    when it waits on the schedule (a delay or eta) first; ``attempts`` 0."""
    state = "scheduled" if scheduled else "queued"
    record = _Stored(task_id, task, queue, state, attempts=0, enqueued_at=enqueued_at)
    return _encode(_keep(record, call))


def running(
    task_id: str,
    task: str,
    queue: str,
    attempts: int,
    enqueued_at: float,
    started_at: float | None,
    worker: str,
    call: tuple[Any, Any] | None = None,
) -> bytes:
    """The record of a task a worker started (``track_state``); ``finished_at`` is ``None``."""
    record = _Stored(
        task_id, task, queue, "running", attempts, enqueued_at, started_at, None, worker
    )
    return _encode(_keep(record, call))


def succeeded(
    task_id: str,
    task: str,
    queue: str,
    attempts: int,
    enqueued_at: float,
    started_at: float | None,
    worker: str,
    result: Any = _UNSET,
    call: tuple[Any, Any] | None = None,
) -> bytes:
    """The ``succeeded`` record of a run that returned ``result``. Without ``result`` the
    record has no ``result`` key (the task does not store results). Without ``call`` (the
    default: no ``track_state``) it keeps no arguments.

    Raises:
        SerializationError: ``result`` is not plain data (or is nested too deep, or an
            integer beyond 64 bits).
    """
    if result is not _UNSET and type(result) not in _SCALARS:
        result = to_plain(result)
    record = _Stored(
        task_id,
        task,
        queue,
        "succeeded",
        attempts,
        enqueued_at,
        started_at,
        time.time(),
        worker,
        result,
    )
    if call is not None:
        _keep(record, call)
    try:  # _encode_checked, inlined: once per task on the worker's hot path
        return _encode(record)
    except (UnicodeEncodeError, TypeError, OverflowError, RecursionError):
        return _encode_checked(record)


def retrying(
    task_id: str,
    task: str,
    queue: str,
    attempts: int,
    enqueued_at: float,
    started_at: float | None,
    worker: str,
    error_type: str,
    error: str,
    call: tuple[Any, Any] | None = None,
) -> bytes:
    """The ``retrying`` record of an attempt that failed and will run again."""
    record = _Stored(
        task_id,
        task,
        queue,
        "retrying",
        attempts,
        enqueued_at,
        started_at,
        time.time(),
        worker,
        error_type=error_type,
        error=error,
    )
    return _encode(_keep(record, call))


def failed(
    task_id: str,
    task: str,
    queue: str,
    attempts: int,
    enqueued_at: float,
    started_at: float | None,
    worker: str,
    error_type: str,
    error: str,
    traceback: str,
    dead_lettered: bool = False,
    call: tuple[Any, Any] | None = None,
) -> bytes:
    """The final record of a run that failed for good, with its formatted ``traceback``:
    ``failed``, or ``dead_lettered`` when a dead letter is written with it."""
    state = "dead_lettered" if dead_lettered else "failed"
    record = _Stored(
        task_id,
        task,
        queue,
        state,
        attempts,
        enqueued_at,
        started_at,
        time.time(),
        worker,
        error_type=error_type,
        error=error,
        traceback=traceback,
    )
    return _encode(_keep(record, call))


def cancelled(
    task_id: str,
    task: str,
    queue: str,
    attempts: int,
    enqueued_at: float,
    worker: str,
    call: tuple[Any, Any] | None = None,
    started_at: float | None = None,
) -> bytes:
    """A worker's ``cancelled`` record; ``started_at`` (Unix s) when its run had started."""
    record = _Stored(
        task_id,
        task,
        queue,
        "cancelled",
        attempts,
        enqueued_at,
        started_at or _UNSET,
        time.time(),
        worker,
        error_type=CANCELLED_TYPE,
        error=CANCELLED_MESSAGE,
    )
    return _encode(_keep(record, call))


def cancel_request(task_id: str, finished_at: float) -> bytes:
    """The ``cancelled`` record ``queue.cancel`` hands the broker, stored when the task is
    scheduled or queued; task name and queue are not known there (``""``), ``finished_at``
    is the request's Unix time in seconds."""
    record = _Stored(
        task_id,
        "",
        "",
        "cancelled",
        finished_at=finished_at,
        error_type=CANCELLED_TYPE,
        error=CANCELLED_MESSAGE,
    )
    return _encode(record)


def rejected(
    task_id: str, task: str, queue: str, deliveries: int, reason: str, error: str, worker: str
) -> bytes:
    """The ``dead_lettered`` record of a message that cannot run (malformed, unknown task,
    too large): ``attempts`` is its ``deliveries``, ``error_type`` the dead letter's
    ``reason``; ``task`` is ``""`` when unknown."""
    record = _Stored(
        task_id,
        task,
        queue,
        "dead_lettered",
        deliveries,
        finished_at=time.time(),
        worker=worker,
        error_type=reason,
        error=error,
    )
    return _encode(record)


def expired(
    task_id: str,
    task: str,
    queue: str,
    attempts: int,
    enqueued_at: float,
    finished_at: float,
    worker: str,
    error: str,
    call: tuple[Any, Any] | None = None,
) -> bytes:
    """The ``expired`` record of a task that waited longer than its ``max_age`` and never
    ran: ``attempts`` made before this delivery, ``finished_at`` the Unix time it was found
    expired, ``error`` how long it waited."""
    record = _Stored(
        task_id,
        task,
        queue,
        "expired",
        attempts,
        enqueued_at,
        finished_at=finished_at,
        worker=worker,
        error_type="TaskExpired",
        error=error,
    )
    return _encode(_keep(record, call))


def refused(task_id: str, queue: str, previous: bytes | None, error_type: str, error: str) -> bytes:
    """The small ``failed`` record written instead of a completion the broker refused, the
    broker's error in ``error_type``/``error``. Task name, attempts, times, worker and the
    arguments' preview come from ``previous``, the refused record (``None`` or unreadable:
    left empty)."""
    fields: dict[str, Any] = {}
    if previous is not None:
        try:
            decoded = loads(previous)
        except SerializationError:
            decoded = None
        if isinstance(decoded, dict):
            fields = decoded
    get = fields.get
    record = _Stored(
        task_id,
        str(get("task", "")),
        queue,
        "failed",
        get("attempts", 0),
        get("enqueued_at"),
        get("started_at"),
        time.time(),
        get("worker"),
        error_type=error_type,
        error=error,
    )
    if isinstance(get("call"), dict):
        record.call = get("call")
    return _encode_checked(record)


def deliveries_exceeded(
    task_id: str, task: str, queue: str, deliveries: int, error: str, finished_at: float
) -> bytes:
    """The ``dead_lettered`` record of a message delivered ``max_deliveries`` times without
    completing (``attempts``: ``deliveries``; ``finished_at``: Unix seconds). ``recover.lua``
    writes the same keys and values in Lua (a contract test holds them equal)."""
    record = _Stored(
        task_id,
        task,
        queue,
        "dead_lettered",
        deliveries,
        finished_at=finished_at,
        error_type="MaxDeliveriesExceeded",
        error=error,
    )
    return _encode(record)
