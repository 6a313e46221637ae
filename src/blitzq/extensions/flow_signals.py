"""The signals of a workflow step's end: ``WORKFLOW_STEP_DONE``, then ``WORKFLOW_COMPLETED``
or ``WORKFLOW_FAILED`` from the one step whose completion ended the workflow.

Which completion ended a workflow is decided inside the broker's completion script: the
first effect that finds the workflow running writes its final state, with its own
``finished_at`` (the effect's time, sent as ``repr`` of the float). A step whose completion
carries an effect that may end the workflow (:func:`workflow_end`: the result of a chain's
last step or a chord's callback, a failure, or the result of a member of a group that ends
the workflow, which completes it only when it is the last one in) reads the workflow's state
once its completion is written and emits the end only when ``finished_at`` is its own. So the
end is emitted once, by one worker, however many members fail at once, and a group that ends
a workflow emits it too.

Called by :class:`~.registry.Extensions` (the run's background task), only when a workflow
signal has a handler.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from ..broker.effects import ChordMember, WorkflowDone, WorkflowFail
from ..exceptions import BlitzQError, TaskFailed
from ..serialization import loads
from .signals import Signal, SignalEvent, Signals

if TYPE_CHECKING:
    from ..broker import Broker, Completion
    from ..serialization import Envelope
    from ..worker.execution import Job

logger = logging.getLogger("blitzq.signals")

#: Most seconds a step waits to see the workflow's final state after its completion: its
#: own write, or (a group's member) the end of the last member.
CONFIRM_TIMEOUT = 10.0
#: First and longest pause between two reads of the state (seconds).
CONFIRM_FIRST, CONFIRM_MAX = 0.01, 0.5

#: The ``finished_at`` (as written) of the effect by which a step's completion may end its
#: workflow.
WorkflowEnd = str


def workflow_end(completion: Completion | None) -> WorkflowEnd | None:
    """The mark (``repr`` of its time) of the effect by which ``completion`` (a workflow
    step's, through its finishers) may end the step's workflow, or ``None`` when it cannot:
    the workflow goes on (a next step, a chord member whose callback follows)."""
    if completion is None:
        return None
    for op in completion.ops:
        if isinstance(op, WorkflowDone | WorkflowFail) or (
            isinstance(op, ChordMember) and not op.queue
        ):
            return repr(op.now)
    return None


def workflow_extra(envelope: Envelope) -> dict[str, Any]:
    """``{"workflow_id": ...}`` for a workflow step's message, else an empty dict."""
    flow = envelope.flow
    if isinstance(flow, dict) and flow.get("w"):
        return {"workflow_id": str(flow["w"])}
    return {}


async def step_ended(
    signals: Signals,
    broker: Broker,
    job: Job,
    kind: str,
    error: BaseException | None,
    described: tuple[str | None, str | None],
    result: Any,
    worker_id: str,
    end: WorkflowEnd | None,
) -> None:
    """Emit ``WORKFLOW_STEP_DONE`` for ``job``, a step that ended for good as ``kind``, then
    the workflow's end when ``end`` (:func:`workflow_end`) is what ended it.

    Args:
        signals: the Queue's handlers.
        broker: where the workflow's state is read.
        job: the step's run.
        kind: its outcome (``"succeeded"``, ``"failed"``, ``"dead_lettered"``,
            ``"cancelled"``).
        error: its exception, if it failed.
        described: ``(error_type, error_message)`` of the failure, as recorded.
        result: its return value, if it succeeded.
        worker_id: the worker emitting.
        end: the mark of the effect that may end the workflow, or ``None``.
    """
    env = job.envelope
    extra = workflow_extra(env)
    if not extra:
        return
    queue, ok = job.delivery.queue, kind == "succeeded"
    if signals.has(Signal.WORKFLOW_STEP_DONE):
        event = SignalEvent(
            Signal.WORKFLOW_STEP_DONE,
            env.id,
            env.task,
            queue,
            job.attempt,
            error=None if ok else error,
            error_type=described[0],
            error_message=described[1],
            result=result if ok else None,
            worker=worker_id,
            extra={**extra, "state": kind},
        )
        await signals.emit(Signal.WORKFLOW_STEP_DONE, event)
    if end is None or not (
        signals.has(Signal.WORKFLOW_COMPLETED) or signals.has(Signal.WORKFLOW_FAILED)
    ):
        return
    state = await _final_state(broker, extra["workflow_id"])
    if state is None or state.get("finished_at") != end.encode():
        return  # still running after the wait, or ended by another step
    done = state.get("state") == b"succeeded"
    signal = Signal.WORKFLOW_COMPLETED if done else Signal.WORKFLOW_FAILED
    if not signals.has(signal):
        return
    ended = (state.get("state") or b"failed").decode()
    error_type = (state.get("error_type") or b"").decode() or None
    message = (state.get("error") or b"").decode() or None
    if done:
        error = None
        try:
            raw = state.get("result")
            result = loads(raw) if raw else None
        except BlitzQError:
            pass  # the step's own result, as the worker has it
    elif error is None:  # the step succeeded, but its result could not be passed on
        error = TaskFailed(env.id, ended, error_type, message)
    event = SignalEvent(
        signal,
        env.id,
        env.task,
        queue,
        job.attempt,
        error=error,
        error_type=error_type,
        error_message=message,
        result=result if done else None,
        worker=worker_id,
        extra={**extra, "state": "completed" if done else ended},
    )
    await signals.emit(signal, event)


async def _final_state(broker: Broker, workflow_id: str) -> dict[str, bytes] | None:
    """The workflow's state once it is no longer running, or ``None`` when it still runs
    after :data:`CONFIRM_TIMEOUT` seconds (or cannot be read)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CONFIRM_TIMEOUT
    pause = CONFIRM_FIRST
    while True:
        try:
            state = await broker.workflow_state(workflow_id)
        except BlitzQError as exc:
            logger.debug("reading workflow %s for its signals: %s", workflow_id, exc)
            state = None
        if state is not None and state.get("state", b"running") != b"running":
            return state
        if loop.time() + pause > deadline:
            return None
        await asyncio.sleep(pause)
        pause = min(pause * 2, CONFIRM_MAX)


__all__ = ["WorkflowEnd", "step_ended", "workflow_end", "workflow_extra"]
