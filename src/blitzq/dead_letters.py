"""Dead letters as users read them back: :class:`DeadLetter`, one per dead-lettered task.

The broker stores each dead letter as its fields (the original message, the reason, the last
error, the queue and the time); :meth:`DeadLetter.from_fields` turns those into the value that
``queue.dead_letters()`` and ``blitzq dead-letters`` list. Task *records* are
:mod:`blitzq.records`, which re-exports this class.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .arg_preview import preview
from .broker.values import DEAD_LETTER_REASONS
from .exceptions import ConfigurationError, SerializationError
from .serialization import decode_envelope

__all__ = ["DEAD_LETTER_REASONS", "DeadLetter", "check_reason"]


def check_reason(reason: str | None) -> str | None:
    """``reason`` itself when it is ``None`` or one of :data:`DEAD_LETTER_REASONS`.

    Raises:
        ConfigurationError: any other value (the message names the valid reasons).
    """
    if reason is not None and reason not in DEAD_LETTER_REASONS:
        valid = ", ".join(DEAD_LETTER_REASONS)
        raise ConfigurationError(f"reason {reason!r} is not a dead-letter reason (one of: {valid})")
    return reason


#: A (dotted) exception type name, as ``describe_error`` writes it before ``": "``.
_TYPE_NAME = re.compile(r"[A-Za-z_][\w.]*")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead-lettered task, as listed by ``queue.dead_letters()``.

    Attributes:
        id: task id.
        task: task name ("" when the message could not be decoded).
        queue: physical queue it came from.
        reason: why it was dead-lettered, one of :data:`DEAD_LETTER_REASONS` (``"failed"``,
            ``"expired"``, ``"unknown task"``, ``"malformed message"``, ``"message too
            large"``, ``"max deliveries exceeded"``, ``"malformed scheduled entry"``,
            ``"unreadable entry"``).
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

    @property
    def error_type(self) -> str:
        """The exception type of a task that failed (reason ``"failed"``), as its record
        names it (``"ValueError"``, ``"myapp.errors.Gone"``); ``""`` for the other reasons."""
        if self.reason != "failed":
            return ""
        head, sep, _ = self.error.partition(": ")
        return head if sep and _TYPE_NAME.fullmatch(head) else ""

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for ``--json`` output); the message bytes are left out."""
        return {
            "id": self.id,
            "task": self.task,
            "queue": self.queue,
            "reason": self.reason,
            "error": self.error,
            "error_type": self.error_type,
            "failed_at": self.failed_at,
            "args": self.args,
            "kwargs": self.kwargs,
            "mode": self.mode,
        }

    def to_summary(self) -> dict[str, Any]:
        """:meth:`to_dict` with a bounded preview of the arguments instead of them all
        (:func:`blitzq.arg_preview.preview`, at most 2048 bytes, cuts marked), and
        ``args_truncated``: for lists (``dead-letter list --json``, the dashboard), which a
        page polls; :meth:`to_dict` (``dead-letter show``) keeps them whole."""
        doc = self.to_dict()
        if self.args is not None:
            shown = preview(self.args, self.kwargs or {})
            doc["args"], doc["kwargs"] = shown["args"], shown["kwargs"]
            doc["args_truncated"] = shown["truncated"]
        else:
            doc["args_truncated"] = False
        return doc
