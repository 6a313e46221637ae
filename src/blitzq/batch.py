"""Batch API: wait for many results at once, or enqueue one call and wait for it.

- ``await queue.get_results(ids, timeout=...)`` → results in the order of ``ids``.
- ``await queue.run(task, *args, **kwargs)`` → enqueue, then wait for the result.
- ``task.enqueue_many([...])`` (see :meth:`blitzq.Task.enqueue_many`) takes per-item options:
  ``(args, kwargs, {"delay": 5, "task_id": "...", "priority": "high"})``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from ._operations import final_result
from .broker import Broker
from .client.sync import Portal, blocking
from .exceptions import (
    BrokerError,
    ConfigurationError,
    ResultNotStored,
    ResultTimeout,
    SerializationError,
    TaskFailed,
)
from .records import TaskRecord
from .task import BoundTask, CallOptions, Task, TaskHandle

R = TypeVar("R")

_FOREVER = 10 * 365 * 86400.0
#: Result waits ``get_results`` runs at once; the others start as these end.
WAIT_FANOUT = 100


def item_options(options: CallOptions, extra: Mapping[str, Any]) -> CallOptions:
    """The options of one ``enqueue_many`` item: ``options`` with ``extra`` applied.

    Args:
        options: the options bound to the task (``task.options(...)``).
        extra: per-item options, any field of :class:`~blitzq.task.CallOptions` (``delay``,
            ``eta``, ``task_id``, ``headers``, ``timeout``, ``queue``, ``correlation_id``,
            ``priority``).

    Raises:
        ConfigurationError: an unknown option name or an invalid value.
    """
    if not isinstance(extra, Mapping):
        raise ConfigurationError(f"per-item options must be a dict, got {extra!r}")
    try:
        return dataclasses.replace(options, **dict(extra))
    except TypeError as exc:
        fields = ", ".join(f.name for f in dataclasses.fields(CallOptions))
        raise ConfigurationError(f"bad per-item option ({exc}); use some of: {fields}") from None


class BatchOperations:
    """Mixin of :class:`~blitzq.Queue`: ``get_results`` and ``run``."""

    _portal: Portal

    @property
    def broker(self) -> Broker:  # provided by Queue
        raise NotImplementedError

    if TYPE_CHECKING:  # provided by QueueOperations

        async def get_result(self, task_id: str, timeout: float | None = None) -> Any: ...

    async def get_results(
        self,
        tasks: Iterable[str | TaskHandle[Any]],
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Wait for the results of many tasks; return them in the order given.

        The records are read first in a few round trips (MGET in chunks); the tasks not yet
        final are then waited for, at most ``WAIT_FANOUT`` (100) at once, all sharing one
        deadline. Like ``asyncio.gather``:

        - ``return_exceptions=False`` (default): the first failure to happen is raised at
          once (:class:`~blitzq.TaskFailed`, :class:`~blitzq.TaskCancelled`, or
          :class:`~blitzq.ResultTimeout` when the deadline passes) and the other waits are
          stopped (the tasks themselves go on).
        - ``return_exceptions=True``: every position holds its result or its exception
          (a ResultTimeout for tasks not finished by the deadline); nothing is raised for a
          task.

        Args:
            tasks: task ids or handles.
            timeout: seconds to wait for all of them; ``None`` waits without limit.
            return_exceptions: see above.

        Raises:
            TaskFailed, ResultTimeout: with ``return_exceptions=False``, as above.
            ResultNotStored: a handle's task does not store its result (see
                :meth:`blitzq.TaskHandle.result`).
            BrokerError: the broker could not be reached.
        """
        items = list(tasks)
        if not items:
            return []
        ids = [t.id if isinstance(t, TaskHandle) else t for t in items]
        deadline = time.monotonic() + (_FOREVER if timeout is None else max(0.0, timeout))
        # One read of every record first (MGET in chunks): what is already final costs no wait.
        known: dict[str, Any] = {}
        # The pre-read keeps the caller's deadline too (plus the same 1 s grace as the waits):
        # a server that accepts and never answers must not hold it for the socket timeout.
        try:
            async with asyncio.timeout(None if timeout is None else max(0.0, timeout) + 1.0):
                raws = await self.broker.get_records(ids)
        except TimeoutError:
            raise BrokerError(
                f"Redis did not answer within {max(0.0, timeout or 0.0) + 1.0:.1f} s (get_results)",
                True,
            ) from None
        for task_id, raw in zip(ids, raws, strict=True):
            if raw is None:
                continue
            try:
                record = TaskRecord.from_bytes(raw)
            except SerializationError:
                continue  # the wait reads it again and reports it
            if record.state.is_final:
                try:
                    known[task_id] = (True, final_result(task_id, record))
                except (TaskFailed, ResultNotStored) as exc:
                    if not return_exceptions:
                        raise
                    known[task_id] = (False, exc)
        # Then wait for the others, at most WAIT_FANOUT at once (each wait reads its record
        # when it starts and on every push): bounded bursts of reads, whatever len(ids).
        gate = asyncio.Semaphore(WAIT_FANOUT)

        async def one(task: str | TaskHandle[Any]) -> Any:
            task_id = task.id if isinstance(task, TaskHandle) else task
            if task_id in known:
                ok, value = known[task_id]
                if ok:
                    return value
                raise value
            async with gate:
                left = max(0.0, deadline - time.monotonic())
                try:
                    if isinstance(task, TaskHandle):  # knows whether a result is stored
                        return await task.result(timeout=left)
                    return await self.get_result(task, timeout=left)
                except ResultTimeout:
                    raise ResultTimeout(
                        f"no result for task {task_id} within {timeout} s (get_results)"
                    ) from None

        waits = [asyncio.ensure_future(one(task)) for task in items]
        try:
            return list(await asyncio.gather(*waits, return_exceptions=return_exceptions))
        finally:
            for wait in waits:
                if not wait.done():
                    wait.cancel()
            # Let the cancelled waits unwind (their unsubscribes go on in the background).
            await asyncio.gather(*waits, return_exceptions=True)

    def get_results_sync(
        self,
        tasks: Iterable[str | TaskHandle[Any]],
        timeout: float | None = None,
        return_exceptions: bool = False,
    ) -> list[Any]:
        """Blocking :meth:`get_results`."""
        # By hand, not blocking(): ``tasks`` (perhaps a generator) is consumed here, in the
        # caller's thread, not on the background loop's.
        return self._portal.call(self.get_results(list(tasks), timeout, return_exceptions))

    async def run(
        self,
        task: Task[Any, R] | BoundTask[Any, R],
        /,
        *args: Any,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> R:
        """Enqueue one call of ``task`` and wait for its result.

        Per-call options go through ``task.options(...)``: ``queue.run(add.options(
        priority="high"), 1, 2)``. ``timeout`` is the wait, not the task's run time limit
        (a task argument named ``timeout`` needs ``enqueue`` and ``result`` instead).

        Args:
            task: a registered task, or one with bound options.
            args, kwargs: the call's arguments.
            timeout: seconds to wait for the result; ``None`` waits without limit.

        Raises:
            TaskFailed: the task ended failed, dead-lettered or cancelled.
            ResultTimeout: no result within ``timeout`` (the task goes on).
            SerializationError, MessageTooLarge, BrokerError: as for ``enqueue``.
        """
        handle = await task.enqueue(*args, **kwargs)
        return await handle.result(timeout=timeout)

    run_sync = blocking(run)


__all__ = ["BatchOperations", "item_options"]
