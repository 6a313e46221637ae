"""Following a running workflow: its final result, its state, its steps, cancelling it.

A :class:`WorkflowHandle` holds only the workflow's id, so ``queue.workflow(id)`` in another
process re-attaches to the same workflow. The state lives in the broker (``{ns}:wf:<id>``);
``get()`` is woken by a push when the workflow ends, not by polling.
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import TYPE_CHECKING, Any

from .. import _checks
from ..broker import Completion
from ..broker.effects import WorkflowFail
from ..client import testmode
from ..client.patience import patiently
from ..client.sync import blocking
from ..exceptions import (
    BlitzQError,
    BrokerError,
    ResultTimeout,
    SerializationError,
    TaskCancelled,
    TaskFailed,
)
from ..handle import TaskHandle
from ..records import TaskRecord, TaskState
from ..serialization import loads

if TYPE_CHECKING:
    from ..client.context import QueueContext
    from ..client.sync import Portal

_FOREVER = 10 * 365 * 86400.0
#: Seconds between checks, while waiting, for a step that ended without advancing its
#: workflow (a step dead-lettered by lease recovery or as an unknown task); grows to 15 s.
LIVENESS_INTERVAL = 2.0
#: Broker calls a handle runs at once (cancelling steps): a few connections, not one per step.
FANOUT = 16


class WorkflowNotFound(BlitzQError, LookupError):
    """No workflow with this id is stored (a wrong id, or its state expired)."""


class WorkflowExpired(WorkflowNotFound):
    """The workflow existed (this handle started it or read its state) but its state is
    stored no more: it expired, ``result_ttl`` seconds after the workflow ended (a running
    workflow's state is kept at least 7 days). Its result cannot be read any more."""


class WorkflowHandle:
    """What ``queue.apply(workflow)`` returns; ``queue.workflow(id)`` makes one from an id.

    Attributes:
        id: the workflow id (also the correlation id of every step).
    """

    __slots__ = ("_known", "_owner", "_steps", "id")

    def __init__(
        self, owner: QueueContext, workflow_id: str, steps: list[list[str]] | None = None
    ) -> None:
        self._owner = owner
        self.id = workflow_id
        self._steps = steps
        #: Whether the workflow is known to have existed (started here, or its state read).
        self._known = steps is not None

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.id}>"

    @property
    def _portal(self) -> Portal:
        """The owning Queue's sync-API loop (what the ``*_sync`` twins run on)."""
        return self._owner._portal

    async def _state(self) -> dict[str, bytes]:
        state = await self._owner.broker.workflow_state(self.id)
        if state is None:
            raise self._not_found()
        self._known = True
        return state

    def _not_found(self) -> WorkflowNotFound:
        """The error for a workflow whose state is not stored: :class:`WorkflowExpired`
        when this handle knows it existed, else :class:`WorkflowNotFound`."""
        if self._known:
            return WorkflowExpired(
                f"the state of workflow {self.id} is stored no more: it expired (kept "
                f"result_ttl = {self._owner.result_ttl} s after the workflow ended), so its "
                "result cannot be read"
            )
        return WorkflowNotFound(f"no workflow {self.id} is stored (unknown id, or expired)")

    async def _step_list(self) -> list[list[str]]:
        if self._steps is None:
            raw = (await self._state()).get("steps")
            steps = loads(raw) if raw else []
            self._steps = [[str(x) for x in step] for step in steps]
        return self._steps

    def _outcome(self, state: dict[str, bytes]) -> tuple[bool, Any]:
        """``(True, result)`` for a succeeded workflow, ``(False, None)`` while it runs.

        Raises:
            TaskFailed: the workflow failed (the failed step's id and error); in the eager
                test mode that propagates errors, the step's own exception instead.
            TaskCancelled: the workflow was cancelled.
        """
        value = state.get("state", b"running")
        if value == b"running":
            return False, None
        if value == b"succeeded":
            raw = state.get("result")
            return True, (loads(raw) if raw else None)
        step = (state.get("step") or b"").decode() or self.id
        error_type = (state.get("error_type") or b"").decode() or None
        error = (state.get("error") or b"").decode(errors="replace") or None
        if value == b"cancelled":
            raise TaskCancelled(step, "cancelled", error_type, error)
        if testmode.failure is not None:  # the eager test mode: the step's own exception
            original = testmode.task_error(step)
            if original is not None:
                raise original
        raise TaskFailed(step, value.decode(errors="replace"), error_type, error)

    async def get(self, timeout: float | None = None) -> Any:
        """Wait for the workflow's result: the last step's result (a list of results for a
        workflow that ends with a group).

        Args:
            timeout: seconds to wait; ``None`` waits without limit.

        Raises:
            TaskFailed: a step failed for good (its id, error type and message).
            TaskCancelled: the workflow was cancelled.
            ResultTimeout: not finished within ``timeout``.
            BrokerError: the broker refused a read, or could not be reached until the
                deadline (a transient error before it is waited out: see
                :mod:`blitzq.client.patience`).
            ConfigurationError: ``timeout`` is not ``None`` or a finite number of seconds
                ``>= 0``.
            WorkflowExpired: (a WorkflowNotFound) the workflow existed (started by this
                handle, or its state read by it) and its state expired.
            WorkflowNotFound: no such workflow is stored.
        """
        timeout = _checks.wait(timeout)
        wait = _FOREVER if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + wait
        interval = LIVENESS_INTERVAL
        check_at = time.monotonic() + interval
        broker = self._owner.broker
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                state = await broker.wait_for_workflow(self.id, min(remaining, interval))
            except BrokerError as exc:  # a server restart: keep waiting until the deadline
                if not exc.transient or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                continue
            if state is None:
                raise self._not_found()
            self._known = True
            done, value = self._outcome(state)
            if done:
                return value
            if time.monotonic() >= check_at:
                # Broker calls of the wait: a transient error is waited out until the
                # deadline, as the wait itself is (a paused or restarting server).
                stalled = await patiently(self._stalled_step, deadline)
                if stalled is not None:
                    await patiently(functools.partial(self._end, stalled), deadline)
                    continue  # re-read: raises with the step's error
                interval = min(15.0, interval * 1.5)
                check_at = time.monotonic() + interval
            if time.monotonic() >= deadline:
                raise ResultTimeout(f"workflow {self.id} is still running after {timeout} s")

    async def _stalled_step(self) -> TaskRecord | None:
        """A step whose record is final but not succeeded (it ended without advancing the
        workflow, e.g. dead-lettered by lease recovery), or ``None``."""
        broker = self._owner.broker
        steps = await self._step_list()
        for start in range(0, len(steps), 100):
            chunk = steps[start : start + 100]
            for raw in await broker.get_records([step[0] for step in chunk]):
                if raw is None:
                    continue
                try:
                    record = TaskRecord.from_bytes(raw)
                except SerializationError:
                    continue
                if record.state.is_final and record.state is not TaskState.SUCCEEDED:
                    return record
        return None

    async def _end(self, record: TaskRecord) -> None:
        """End the workflow as failed (or cancelled) by ``record``'s step."""
        state = "cancelled" if record.state is TaskState.CANCELLED else "failed"
        await self._apply_end(state, record.error_type or "", record.error or "", record.id)

    async def _apply_end(self, state: str, error_type: str, error: str, step: str) -> None:
        owner = self._owner
        op = WorkflowFail(self.id, state, error_type, error, step, owner.result_ttl, time.time())
        await owner.broker.complete([Completion(owner.name, None, self.id, ops=(op,))])

    get_sync = blocking(get)

    async def status(self) -> str:
        """``"running"``, ``"succeeded"``, ``"failed"`` or ``"cancelled"``.

        Raises:
            WorkflowNotFound: no such workflow is stored.
        """
        return (await self._state()).get("state", b"running").decode()

    status_sync = blocking(status)

    async def children(self) -> list[TaskHandle[Any]]:
        """Handles of the workflow's steps (every signature in it, in the order written),
        whether they already ran, run, or are still to come.

        Raises:
            WorkflowNotFound: no such workflow is stored (for a re-attached handle).
        """
        owner = self._owner
        return [TaskHandle(owner, sid, queue, task) for sid, task, queue in await self._step_list()]

    children_sync = blocking(children)

    async def cancel(self) -> str:
        """Cancel the workflow: mark it cancelled (no further step is published and a chord
        does not fire), then cancel its steps that are scheduled, queued or running
        (see :meth:`blitzq.Queue.cancel`). ``get()`` then raises :class:`TaskCancelled`.

        Returns:
            ``"cancelled"``, or the final state it already had (nothing changed then).

        Raises:
            WorkflowNotFound: no such workflow is stored.
        """
        steps = await self._step_list()
        await self._apply_end("cancelled", "TaskCancelled", "workflow cancelled by request", "")
        state = (await self._state()).get("state", b"").decode()
        if state != "cancelled":
            return state
        # Every step marked before any worker hears of one (Results.cancel_together): a slot
        # that a running step's cancel frees never starts a queued step of this workflow.
        await self._owner._results.cancel_together([step[0] for step in steps], FANOUT)
        return state

    cancel_sync = blocking(cancel)
