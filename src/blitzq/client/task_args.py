"""Where a task's arguments can be read back, for the dashboard's task page and
``blitzq task inspect``: its record's preview first, else its dead letter, else its message
waiting on the schedule; and, when none has them, why.

Every source is shown as a preview (:func:`blitzq.arg_preview.preview`: JSON data of at most
2048 bytes), so a dead letter's huge arguments cannot swell a page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ..arg_preview import preview
from ..dead_letters import DeadLetter
from ..exceptions import SerializationError
from ..records import TaskRecord, TaskState
from ..serialization import decode_envelope

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["ARGS_SOURCES", "args_note", "dead_letter_of", "task_arguments"]

#: The values of ``args_from``: the task's record, its dead letter, its scheduled message.
ARGS_SOURCES: Final = ("record", "dead letter", "schedule")

_NOT_TRACKED: Final = "unless track_state is on (Queue(track_state=True))"


def args_note(record: TaskRecord, dead_letter: bool = False) -> str:
    """Why no arguments are shown for a task with ``record`` (one without a preview whose
    dead letter and scheduled message, if any, gave none either).

    Args:
        record: the task's record (or the one made up for a task known only by its progress
            or dead letter).
        dead_letter: a dead letter of the task exists (its message could not be decoded).
    """
    state = record.state
    if dead_letter:
        return "its dead letter holds a message that could not be decoded"
    if state is TaskState.SUCCEEDED:
        return f"a succeeded task keeps no arguments {_NOT_TRACKED}"
    if state in (TaskState.QUEUED, TaskState.RUNNING) and not record.worker and not record.task:
        return (
            "a task waiting in its queue or running keeps its arguments in its message only, "
            f"which is not read here; its record keeps them {_NOT_TRACKED}"
        )
    if state is TaskState.CANCELLED and not record.task:
        return (
            "a task cancelled before a worker took it keeps no arguments: its message was "
            "dropped from the schedule, or waits in its queue for a worker to skip it (the "
            "record that worker writes keeps them)"
        )
    if state is TaskState.DEAD_LETTERED:
        return (
            "its dead letter is gone (replayed, purged, trimmed or expired) and its record keeps "
            "no arguments (written by the broker's recovery, or for a message that could not run)"
        )
    if state in (TaskState.SCHEDULED, TaskState.QUEUED, TaskState.RUNNING, TaskState.RETRYING):
        return f"its record keeps no arguments {_NOT_TRACKED}, and no scheduled message has them"
    return "its record keeps no arguments (written by a blitzq that did not keep them)"


async def dead_letter_of(broker: Broker, task_id: str) -> DeadLetter | None:
    """The dead letter of ``task_id``, decoded, or ``None``.

    Raises:
        BrokerError: the broker could not be reached.
    """
    fields = await broker.get_dead_letter(task_id)
    if fields is None:
        return None
    return DeadLetter.from_fields(
        task_id,
        fields.message,
        fields.reason,
        fields.error,
        fields.task,
        fields.queue,
        fields.failed_at,
        fields.kind,
    )


async def task_arguments(
    broker: Broker, record: TaskRecord, letter: DeadLetter | None
) -> dict[str, Any]:
    """The arguments of the task of ``record`` and where they came from.

    Args:
        broker: the Queue's broker (read for the scheduled message only).
        record: the task's record (``due_at`` set when it waits on the schedule).
        letter: its dead letter, when it has one.

    Returns:
        ``{"args", "kwargs", "args_truncated", "args_from", "args_note"}``: ``args_from`` one
        of :data:`ARGS_SOURCES` or ``None`` (then ``args`` and ``kwargs`` are ``None`` and
        ``args_note`` says why; else ``args_note`` is ``None``).

    Raises:
        BrokerError: the broker could not be reached.
    """
    out: dict[str, Any] = {
        "args": None,
        "kwargs": None,
        "args_truncated": False,
        "args_from": None,
        "args_note": None,
    }
    if record.args is not None:
        out.update(args=record.args, kwargs=record.kwargs or {}, args_from="record")
        out["args_truncated"] = record.args_truncated
        return out
    call: tuple[Any, Any] | None = None
    if letter is not None and letter.args is not None:
        call, source = (letter.args, letter.kwargs or {}), "dead letter"
    elif record.due_at is not None:
        entry = await broker.scheduled_entry(record.id)
        if entry is not None:
            try:
                envelope = decode_envelope(entry[2])
            except SerializationError:
                pass
            else:
                call, source = (envelope.args, envelope.kwargs), "schedule"
    if call is None:
        out["args_note"] = args_note(record, letter is not None)
        return out
    shown = preview(*call)
    out.update(args=shown["args"], kwargs=shown["kwargs"], args_from=source)
    out["args_truncated"] = shown["truncated"]
    return out
