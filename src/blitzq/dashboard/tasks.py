"""The dashboard's task page as a JSON-ready dict (:func:`task_doc`).

Reads through the Queue's client methods (``inspect``, ``get_progress``) and the broker's
read-only inspection (its dead letter, its scheduled message); times are Unix seconds.
Nothing here depends on the web framework.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..client.task_args import dead_letter_of, task_arguments
from ..records import TaskRecord, TaskState

if TYPE_CHECKING:
    from ..queue import Queue

__all__ = ["task_doc"]


async def task_doc(queue: Queue, task_id: str) -> dict[str, Any] | None:
    """One task: its record (state, attempts, result or error with traceback, times), its
    latest progress, its dead letter, and its arguments (see
    :func:`~blitzq.client.task_args.task_arguments`): ``args``, ``kwargs``,
    ``args_truncated``, ``args_from`` (``"record"``, ``"dead letter"``, ``"schedule"`` or
    ``None``) and ``args_note`` (why there are none, else ``None``). A task without a stored
    record (running with ``track_state`` off, known by its progress; or known by its dead
    letter only) reads ``running`` or ``dead_lettered`` with ``attempts`` ``None``.

    Returns:
        ``None`` when nothing is known of the task (no record, progress or dead letter:
        never enqueued, not started yet without state tracking, or expired).

    Raises:
        BrokerError: the broker could not be reached.
    """
    record = await queue.inspect(task_id)
    progress = await queue.get_progress(task_id)
    letter = await dead_letter_of(queue.broker, task_id)
    if record is None and progress is None and letter is None:
        return None
    stored = record is not None
    if record is None:
        state = TaskState.DEAD_LETTERED if letter is not None else TaskState.RUNNING
        record = TaskRecord(
            task_id, letter.task if letter else "", letter.queue if letter else "", state
        )
    doc = record.to_dict()
    if not stored:  # a made-up record knows no attempts (not 0: the task ran or runs)
        doc["attempts"] = None
    started, finished, enqueued = record.started_at, record.finished_at, record.enqueued_at
    doc["duration"] = None if started is None or finished is None else finished - started
    doc["wait"] = None if started is None or enqueued is None else started - enqueued
    doc["progress"] = None
    if progress is not None:
        doc["progress"] = {
            "current": progress.current,
            "total": progress.total,
            "fraction": progress.fraction,
            "message": progress.message,
            "updated_at": progress.updated_at,
        }
    doc["dead_letter"] = None
    if letter is not None:
        doc["dead_letter"] = {
            "reason": letter.reason,
            "error": letter.error,
            "failed_at": letter.failed_at,
        }
    doc.update(await task_arguments(queue.broker, record, letter))
    return doc
