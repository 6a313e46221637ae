"""What users read back about tasks: states, records and dead letters."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .exceptions import SerializationError
from .serialization import decode_envelope, loads


class TaskState(enum.StrEnum):
    """Where a task is in its life.

    Final states: succeeded, failed, dead_lettered, cancelled, expired (waited longer than
    its ``max_age``; never ran).
    """

    SCHEDULED = "scheduled"
    QUEUED = "queued"
    RUNNING = "running"
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

    @classmethod
    def from_bytes(cls, data: bytes) -> TaskRecord:
        """Decode a stored record.

        Raises:
            SerializationError: the bytes are not a record.
        """
        raw = loads(data)
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
        }


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered task, as listed by ``queue.dead_letters()``.

    Attributes:
        id: task id.
        task: task name ("" when the message could not be decoded).
        queue: physical queue it came from.
        reason: why it was dead-lettered ("failed", "malformed message", "unknown task",
            "max deliveries exceeded", "message too large").
        error: detail of the last error.
        failed_at: Unix time in seconds.
        args, kwargs: the task's arguments when the message decodes, else ``None``.
        message: the original message bytes.
        mode: the mode of the queue it came from, where a replay puts it back:
            ``"reliable"``, ``"fast"``, or ``None`` when unknown (written before blitzq
            recorded it; a replay then uses the replaying Queue's mode).
    """

    id: str
    task: str
    queue: str
    reason: str
    error: str
    failed_at: float
    args: list[Any] | None
    kwargs: dict[str, Any] | None
    message: bytes
    mode: str | None = None

    @classmethod
    def from_fields(
        cls,
        task_id: str,
        message: bytes,
        reason: str,
        error: str,
        task: str,
        queue: str,
        failed_at: float,
        kind: str = "",
    ) -> DeadLetter:
        """Build from broker fields, decoding the message when it is well-formed (``kind``:
        ``"s"`` reliable, ``"l"`` fast, ``""`` unknown)."""
        args: list[Any] | None = None
        kwargs: dict[str, Any] | None = None
        try:
            env = decode_envelope(message)
        except SerializationError:
            pass
        else:
            args, kwargs = env.args, env.kwargs
            task = task or env.task
        mode = {"s": "reliable", "l": "fast"}.get(kind)
        return cls(task_id, task, queue, reason, error, failed_at, args, kwargs, message, mode)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for ``--json`` output); the message bytes are left out."""
        return {
            "id": self.id,
            "task": self.task,
            "queue": self.queue,
            "reason": self.reason,
            "error": self.error,
            "failed_at": self.failed_at,
            "args": self.args,
            "kwargs": self.kwargs,
            "mode": self.mode,
        }
