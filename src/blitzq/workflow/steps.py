"""The workflow engine's hook on every task: the finisher that advances a workflow when one of
its steps ends (:func:`finish_step`), the middleware that adds it to each task
(:data:`WORKFLOW_STEPS`) and the internal step :data:`COLLECT`.

Kept apart from :mod:`.engine` so that a worker whose tasks run outside workflows imports
neither the engine nor the canvas and the handles (issue 29: an idle worker's memory): the
first step of a workflow to end imports the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..extensions.middleware import Middleware

if TYPE_CHECKING:
    from ..broker import Completion
    from ..options import TaskOptions
    from ..task import Task
    from ..worker.execution import Job

__all__ = ["COLLECT", "WORKFLOW_STEPS", "WorkflowSteps", "collect", "finish_step"]

#: Internal task that returns the list of a group's results (a group feeding a group, or a
#: group as a chord member). Registered on every Queue that has tasks.
COLLECT = "blitzq.workflow.collect"


async def collect(results: list[Any]) -> list[Any]:
    """Return the list of a group's results unchanged (the :data:`COLLECT` step)."""
    return results


def finish_step(
    job: Job, completion: Completion, final: bool, error: BaseException | None
) -> Completion:
    """Finisher of every task: for a workflow step that ended for good, add the ops that
    advance (or fail) its workflow to ``completion`` (:func:`.engine.advance`). A task outside
    workflows, or a retry, passes through untouched.

    Args:
        job: the task's job (its envelope's ``flow`` names the workflow, if any).
        completion: the job's completion.
        final: ``True`` when the task ended for good (no retry follows).
        error: the task's error (``None`` if it succeeded).

    Returns:
        ``completion``, with the workflow's ops appended for a step that ended for good.
    """
    flow = job.envelope.flow
    if flow is None or not final:
        return completion
    workflow_id = str(flow.get("w", "")) if isinstance(flow, dict) else ""
    if not workflow_id:
        return completion
    from .engine import advance  # the engine, on the first step of a workflow to end

    return advance(job, completion, error, flow, workflow_id)


class WorkflowSteps(Middleware):
    """The workflow engine as a built-in middleware: its :meth:`setup_task` makes every task
    able to take part in workflows (its finisher :func:`finish_step` advances the workflow a
    step belongs to). Listed last by :func:`blitzq.registration.task_middleware`, so its
    finisher comes after those of the middleware registered before the task; the registrar
    registers :data:`COLLECT` (:func:`collect`) on the Queue."""

    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        """Add :func:`finish_step` to ``task``'s finishers (once)."""
        if finish_step not in task.finishers:
            task.finishers.append(finish_step)


#: The one instance (it holds nothing).
WORKFLOW_STEPS = WorkflowSteps()
