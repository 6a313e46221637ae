"""The note of a task's end in its queue's index of ended tasks (the dashboard's task list).

Each final completion carries ``Completion.ended``: ``"<state>\\n<task>\\n<task_id>"`` with the
index's cap and TTL (the Queue's ``recent_index`` and ``result_ttl``), which ``complete.lua``
adds to ``{ns}:recent:<queue>`` in the batch's one round trip. A run that goes on (a retry,
a requeue) notes nothing; a success with nothing to write (fast mode, no record) gets a
completion of its own for the note.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..broker import Completion

if TYPE_CHECKING:
    from .execution import Job

__all__ = ["noted"]


def noted(
    job: Job,
    completion: Completion | None,
    error: BaseException | None,
    cancelled: bool,
    recent: tuple[int, int],
) -> Completion | None:
    """``completion`` with the end of ``job`` noted (module docstring).

    Args:
        job: the run.
        completion: what is written for it (``None``: nothing).
        error: the run's exception, or ``None``.
        cancelled: the completion records a cancellation.
        recent: the index's ``(cap, ttl)``: entries kept, seconds.
    """
    if completion is not None and (
        completion.reschedule is not None or completion.requeue is not None
    ):
        return completion
    if cancelled:
        state = "cancelled"
    elif completion is not None and completion.dead_letter is not None:
        state = "dead_lettered"
    elif error is not None or job.encode_error is not None:
        state = "failed"
    else:
        state = "succeeded"
    env = job.envelope
    ended = (f"{state}\n{env.task}\n{env.id}", *recent)
    if completion is None:
        return Completion(job.delivery.queue, None, env.id, ended=ended)
    # Set in place, not copied (dataclasses.replace costs ~6 us): the completion is this
    # run's own and nothing has seen it yet (the flusher gets it next).
    object.__setattr__(completion, "ended", ended)
    return completion
