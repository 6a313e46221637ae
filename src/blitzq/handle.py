"""What an enqueue returns: :class:`TaskHandle`, a task's id and queue and the ways to follow it
(wait for its result, read its record, cancel it)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from . import _checks
from .client.sync import blocking

if TYPE_CHECKING:
    from .client.sync import Portal
    from .records import TaskRecord

R = TypeVar("R")


class ResultReader(Protocol):
    """What a handle reads its task through: its Queue's results client
    (:class:`blitzq.client.reading.Results`)."""

    async def wait_result(
        self,
        task_id: str,
        timeout: float | None,
        queue: str | None = None,
        since: object | None = None,
        sent: bool = False,
        sent_at: float | None = None,
    ) -> Any:
        """Wait for the task's result (see :meth:`TaskHandle.result`)."""
        ...

    async def no_stored_result(self, task_id: str) -> Any:
        """Raise what a wait for a result that is not stored raises."""
        ...

    def decode_result(self, task: str, value: Any) -> Any:
        """``value`` as task ``task`` annotated its return (unchanged when it did not)."""
        ...

    async def cancel(self, task_id: str) -> str:
        """Cancel the task (see :meth:`blitzq.Queue.cancel`)."""
        ...

    async def cancel_together(self, task_ids: Sequence[str], fanout: int) -> list[str]:
        """Cancel a workflow's steps, all marked before any is announced (see
        :meth:`blitzq.client.reading.Results.cancel_together`)."""
        ...

    async def inspect(self, task_id: str) -> TaskRecord | None:
        """The task's record (see :meth:`blitzq.Queue.inspect`)."""
        ...


class HandleOwner(Protocol):
    """Where a handle comes from (a :class:`~blitzq.Queue`, as clients see it): its sync-API
    loop and its results client."""

    _portal: Portal

    @property
    def _results(self) -> ResultReader:
        """The results client."""
        ...


class TaskHandle(Generic[R]):
    """What an enqueue returns: the task's id and queue, and ways to follow it.

    Attributes:
        id: the task id.
        queue: the physical queue it was published to.
        task: the task name.
        duplicate: ``True`` when nothing was published because the call duplicated a task
            that already exists (``id`` is that task's id; see unique tasks).
        stores_result: whether the task stores its return value (``False``:
            ``store_result=False``, so :meth:`result` raises
            :class:`~blitzq.ResultNotStored` at once); ``None`` when unknown (a handle made
            from an id, or ``queue.send`` of a task this process has not registered).
    """

    __slots__ = (
        "_portal",
        "_results",
        "_sent",
        "_sent_at",
        "_since",
        "duplicate",
        "id",
        "queue",
        "stores_result",
        "task",
    )

    def __init__(
        self,
        owner: HandleOwner,
        task_id: str,
        queue: str,
        task: str,
        duplicate: bool = False,
        stores_result: bool | None = None,
        sent: bool = False,
    ) -> None:
        self._portal = owner._portal
        self._results = owner._results
        #: Whether this process sent the task (so a wait may end once it is known nowhere).
        self._sent = sent
        #: When it was sent (``time.monotonic()``), or ``None``: a ResultExpired can then
        #: tell a record lost early (the server lost its data) from one past result_ttl.
        self._sent_at = time.monotonic() if sent else None
        self.id = task_id
        self.queue = queue
        self.task = task
        self.duplicate = duplicate
        self.stores_result = stores_result
        #: The broker's mark taken just before the message was sent (a hint for result()).
        self._since: object | None = None

    def __repr__(self) -> str:
        return f"<TaskHandle {self.task} id={self.id} queue={self.queue}>"

    async def result(self, timeout: float | None = None) -> R:
        """Wait for the task's result.

        Args:
            timeout: seconds to wait; ``None`` waits without limit.

        Raises:
            TaskFailed: the task ended failed or dead-lettered (in the eager test mode,
                :mod:`blitzq.testing`, the exception the task raised instead, unless that
                mode was given ``propagate=False`` or this is called inside a task).
            ResultNotStored: the task does not store its result (``store_result=False``):
                raised at once, without waiting (a failure already recorded raises
                TaskFailed instead).
            ResultExpired: (a ResultTimeout) the result cannot arrive any more: no record is
                stored (it expired after ``result_ttl``) and the task is known nowhere
                else; raised early, also with ``timeout=None`` (docs/guarantees.md, "Result
                waits end").
            ResultTimeout: no final record within ``timeout``.
            ConfigurationError: ``timeout`` is not ``None`` or a finite number of seconds
                ``>= 0`` (:func:`blitzq._checks.wait`).
        """
        timeout = _checks.wait(timeout)
        if self.stores_result is False:
            value: R = await self._results.no_stored_result(self.id)
            return value
        value = await self._results.wait_result(
            self.id, timeout, self.queue, self._since, self._sent, self._sent_at
        )
        decoded: R = self._results.decode_result(self.task, value)  # a rich return annotation
        return decoded

    result_sync = blocking(result)

    async def cancel(self) -> str:
        """Cancel the task; see :meth:`blitzq.Queue.cancel` for what happens and the answer."""
        return await self._results.cancel(self.id)

    cancel_sync = blocking(cancel)

    async def status(self) -> TaskRecord | None:
        """The task's record (see :meth:`blitzq.Queue.inspect`: a task on the schedule reads
        ``scheduled`` with ``due_at``), or ``None`` when nothing is known of it (waiting in
        its queue without ``track_state``, or expired)."""
        return await self._results.inspect(self.id)

    status_sync = blocking(status)


__all__ = ["TaskHandle"]
