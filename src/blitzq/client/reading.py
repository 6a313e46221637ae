"""The reading side of a :class:`~blitzq.Queue`: results (one or many), records, cancellation,
progress and workflows.

A :class:`Results` belongs to one Queue and uses its broker of the running event loop.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .. import _checks, records
from ..context import current_task
from ..exceptions import (
    BrokerError,
    ResultExpired,
    ResultNotStored,
    ResultTimeout,
    SerializationError,
    TaskCancelled,
    TaskExpired,
    TaskFailed,
    unknown_outcome,
)
from ..extensions.signals import Signal, SignalEvent
from ..progress import Progress, decode_progress
from ..records import TaskRecord, TaskState
from ..routing import check_task_id
from ..serialization import loads
from ..task import BoundTask, Task, TaskHandle
from . import lookup, testmode
from .patience import GRACE, patiently

if TYPE_CHECKING:
    from .context import QueueContext

R = TypeVar("R")

_FOREVER = 10 * 365 * 86400.0
#: A succeeded record's ``state`` (a wait returns its ``result`` without making the record).
_SUCCEEDED = TaskState.SUCCEEDED.value
#: Result waits ``get_results`` runs at once; the others start as these end.
WAIT_FANOUT = 100

#: Answers of a cancel whose task was marked revoked (a worker skips it, or cancels its run).
MARKED = frozenset({"queued", "pending", "running"})


def _raise_final(task_id: str, record: TaskRecord) -> None:
    """Raise the error of a record in a final state other than succeeded; else return."""
    if record.state is TaskState.CANCELLED:
        raise TaskCancelled(task_id, record.state.value, record.error_type, record.error, None)
    if record.state is TaskState.EXPIRED:
        raise TaskExpired(task_id, record.state.value, record.error_type, record.error, None)
    if record.state.is_final:
        if testmode.failure is not None:  # the eager test mode: the task's own exception
            original = testmode.task_error(task_id)
            if original is not None:
                raise original
        raise TaskFailed(
            task_id, record.state.value, record.error_type, record.error, record.traceback
        )


def final_result(task_id: str, record: TaskRecord) -> Any:
    """The result of a task whose ``record`` is final.

    Raises:
        TaskCancelled, TaskExpired: the task was cancelled, or expired before it ran.
        TaskFailed: it failed or was dead-lettered (carries the error).
        ResultNotStored: it succeeded without storing its result.
    """
    if record.state is TaskState.SUCCEEDED:
        if not record.result_stored:
            raise ResultNotStored(task_id)
        return record.result
    _raise_final(task_id, record)
    raise ValueError(f"record of task {task_id} is not final: {record.state.value}")


class Results:
    """Results, records, cancellation, progress and workflows of one Queue.

    Args:
        queue: the Queue whose broker and settings it uses.
    """

    def __init__(self, queue: QueueContext) -> None:
        self.queue = queue

    # ---------------------------------------------------------------- results
    async def inspect(self, task_id: str) -> TaskRecord | None:
        """The task's record (state, attempts, result or error, times), or ``None`` when
        nothing is known of it.

        A task waiting on the schedule (a delay, an eta, a retry's backoff) is reported as
        ``scheduled`` (or its stored ``retrying`` record) with ``due_at`` set, even without
        ``track_state``; a task waiting in its queue has no record unless the Queue tracks
        state (``track_state=True``), so it reads ``None``.

        Raises:
            SerializationError, ConfigurationError: a bad ``task_id`` (empty, too long,
                holding a space or a newline: :func:`~blitzq.routing.check_task_id`, the
                rule enqueue applies to ``task_id``); BrokerError: no broker.
        """
        return await lookup.inspect(self.queue.broker, check_task_id("task id", task_id))

    async def why_no_result(self, task_id: str, queue: str | None = None) -> str:
        """See :func:`~blitzq.client.lookup.why_no_result` (the hint of a result timeout)."""
        task_id = check_task_id("task id", task_id)
        queue_ = self.queue
        return await lookup.why_no_result(
            queue_.broker, queue_.namespace, task_id, queue, queue_.url
        )

    async def get_result(self, task_id: str, timeout: float | None = None) -> Any:
        """Wait for a task's final record and return its result.

        Args:
            task_id: the id from the task handle.
            timeout: seconds to wait; ``None`` waits without limit.

        Raises:
            TaskFailed: the task ended failed or dead-lettered (carries the error).
            TaskExpired: the task waited longer than its ``max_age`` and never ran.
            ResultNotStored: the task succeeded without storing its result (its record
                says so: ``store_result=False`` with ``track_state=True``).
            ResultExpired: (a ResultTimeout) a record this wait read is gone and the task is
                known nowhere: no result can arrive (:meth:`wait_result`; ``None`` too).
            ResultTimeout: no final record arrived in time (the task may still run; with
                ``store_result=False`` and no ``track_state`` a success writes no record,
                so only the task's handle can tell at once: ``handle.result()``).
            SerializationError, ConfigurationError: a bad ``task_id`` (``check_task_id``), or
                a ``timeout`` that is not ``None`` or a finite number of seconds ``>= 0``.
        """
        return await self.wait_result(task_id, _checks.wait(timeout))

    async def wait_result(
        self,
        task_id: str,
        timeout: float | None,
        queue: str | None = None,
        since: object | None = None,
        sent: bool = False,
        sent_at: float | None = None,
    ) -> Any:
        """:meth:`get_result`, given the task's physical ``queue`` when the caller knows it (a
        handle does), so that a timeout can say that no worker consumes that queue, and the
        broker's ``since`` mark taken when the task was sent (see
        :meth:`~blitzq.broker.state.RecordsState.wait_for_record`); ``sent``: the caller sent it
        (:func:`~blitzq.client.lookup.end_if_gone` may end the wait early), at ``sent_at``
        (``time.monotonic()``) when known: its ``ResultExpired`` then tells a record lost
        before ``result_ttl`` from one that expired."""
        task_id = check_task_id("task id", task_id)
        timeout = _checks.wait(timeout)
        if testmode.after_enqueue is not None and current_task() is None:
            await self._stranded_in_eager_mode(task_id)
        wait = _FOREVER if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + wait
        broker = self.queue.broker
        trace_every = lookup.TRACE_FIRST
        seen: TaskRecord | None = None  # the last record this wait read
        while True:
            left = max(0.0, deadline - time.monotonic())
            where = (queue or (seen.queue if seen else None) or None) if sent or seen else None
            try:
                data = await broker.wait_for_record(
                    task_id, left if where is None else min(left, trace_every), since
                )
            except BrokerError as exc:
                # The server restarting: keep waiting (re-reading) until the deadline.
                if not exc.transient or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                continue
            if data is None:
                if time.monotonic() >= deadline:
                    hint = await self._hint(task_id, queue)
                    raise ResultTimeout(f"no result for task {task_id} within {timeout} s{hint}")
                if where is not None:  # a task known to exist: is it anywhere still?
                    # Its broker calls ride out a transient error until the deadline, as the
                    # wait does (a paused or restarting server is no failure of the wait).
                    await patiently(
                        functools.partial(
                            lookup.end_if_gone,
                            broker,
                            task_id,
                            where,
                            seen,
                            self.queue.result_ttl,
                            None if sent_at is None else time.monotonic() - sent_at,
                        ),
                        deadline,
                    )
                    trace_every = min(lookup.TRACE_MAX, trace_every * 2)
                continue
            raw = loads(data)
            if type(raw) is dict and raw.get("state") == _SUCCEEDED and "result" in raw:
                return raw["result"]  # final_result() of the usual record, without the record
            record = TaskRecord.from_map(raw)
            if record.state.is_final:
                return final_result(task_id, record)
            seen = record
            if time.monotonic() >= deadline:
                waiting = record.state is not TaskState.RUNNING
                hint = await self._hint(task_id, queue) if waiting else ""
                raise ResultTimeout(
                    f"task {task_id} is {record.state.value} after {timeout} s{hint}"
                )
            await asyncio.sleep(0.05)

    async def _stranded_in_eager_mode(self, task_id: str) -> None:
        """In the eager test mode, what could run has run when the enqueue returned: a task
        still on the schedule is due past the drain's horizon and never runs in this test.

        Raises:
            ResultTimeout: the task is on the schedule (its due time named), at once, where
                a wait without a timeout would hang the test.
        """
        record = await lookup.inspect(self.queue.broker, task_id)
        if record is None or record.state.is_final or record.due_at is None:
            return
        ahead = record.due_at - time.time()
        raise ResultTimeout(
            f"task {task_id} is {record.state.value}, due in {ahead:.0f} s: past what the eager "
            "test mode runs (a drain skips at most its horizon of waiting, 600 s by default: "
            "@pytest.mark.blitzq_eager(horizon=...) or eager(horizon=...); a rate limit's or a "
            "lock's wait is never skipped, and waited for up to 5 s), so no result can come in "
            "this test"
        )

    async def _hint(self, task_id: str, queue: str | None) -> str:
        """:meth:`why_no_result` for a wait's :class:`~blitzq.ResultTimeout`, or ``""`` when
        the broker cannot tell now (the timeout is raised all the same, within
        :data:`~.patience.GRACE` s)."""
        try:
            async with asyncio.timeout(GRACE):
                return await self.why_no_result(task_id, queue)
        except (BrokerError, TimeoutError):
            return ""

    def decode_result(self, task: str, value: Any) -> Any:
        """``value``, a result of task ``task``, as its return annotation asks (a rich type,
        :mod:`blitzq.arguments`); unchanged for a task not registered here or without one.

        Raises:
            SerializationError: the value does not fit the annotation.
        """
        registered = self.queue.tasks.get(task)
        if registered is not None and registered.arguments is not None:
            return registered.arguments.decode_result(value)
        return value

    async def no_stored_result(self, task_id: str) -> Any:
        """``result()`` of a task known not to store its result: raise at once.

        Raises:
            TaskFailed: a final failure (or cancellation, expiry) is already recorded.
            ResultNotStored: otherwise.
            SerializationError, ConfigurationError: a bad ``task_id`` (``check_task_id``).
        """
        data = await self.queue.broker.get_record(check_task_id("task id", task_id))
        if data is not None:
            record = TaskRecord.from_bytes(data)
            if record.state is not TaskState.SUCCEEDED:
                _raise_final(task_id, record)
        raise ResultNotStored(task_id)

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
            SerializationError, ConfigurationError: an id breaks the rule of task ids
                (:func:`~blitzq.routing.check_task_id`), or ``timeout`` is
                not ``None`` or a finite number of seconds ``>= 0``; nothing is waited for.
        """
        timeout = _checks.wait(timeout)
        items = list(tasks)
        if not items:
            return []
        ids = [t.id if isinstance(t, TaskHandle) else check_task_id("task id", t) for t in items]
        deadline = time.monotonic() + (_FOREVER if timeout is None else max(0.0, timeout))
        # One read of every record first (MGET in chunks): what is already final costs no wait.
        known: dict[str, Any] = {}
        # The pre-read keeps the caller's deadline too (plus the same 1 s grace as the waits)
        # and rides out transient errors until it, as the waits do.
        raws = await patiently(functools.partial(self.queue.broker.get_records, ids), deadline)
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
                except Exception as exc:  # TaskFailed, ResultNotStored; eager: the task's own
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
                except ResultTimeout as exc:
                    if isinstance(exc, ResultExpired):
                        raise
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
            ConfigurationError: ``timeout`` is not ``None`` or a finite number of seconds
                ``>= 0`` (nothing is enqueued).
            SerializationError, MessageTooLarge, BrokerError: as for ``enqueue``.
        """
        timeout = _checks.wait(timeout)  # before enqueueing: a bad wait sends nothing
        handle = await task.enqueue(*args, **kwargs)
        return await handle.result(timeout=timeout)

    # ----------------------------------------------------------- cancellation
    async def cancel(self, task_id: str) -> str:
        """Cancel a task.

        A scheduled (delayed, retrying or rate-limited) task is taken off the schedule and
        never starts. A queued one is marked revoked: every worker skips it. A running one
        is cancelled by its worker at once: an async task is cancelled, a thread task sees
        ``current_task().cancelled``, a process task is terminated; its record stays
        ``running`` (``inspect``: ``cancelling``) until the run ended. Then (at once for
        the others) the record is ``cancelled`` and ``result()`` raises
        :class:`TaskCancelled` -- or both give the run's outcome, if it ended first.

        Returns:
            What the task was: ``"scheduled"``, ``"queued"``, ``"running"``, ``"pending"``
            (queued or running: without ``track_state`` the two cannot be told apart) or
            ``"finished"`` (already final: nothing changed). ``Signal.TASK_REVOKED``
            handlers get it as ``event.extra["was"]``, after the request was written.

        Raises:
            SerializationError, ConfigurationError: a bad ``task_id`` (``check_task_id``).
            OutcomeUnknown: the broker stopped answering after the cancel was sent
                (``.task_id``); it may be applied. Cancelling again is safe.
            BrokerError: the broker could not be reached.
        """
        task_id = check_task_id("task id", task_id)
        record = records.cancel_request(task_id, time.time())
        with unknown_outcome("cancel", (task_id,)):
            was = await self.queue.broker.cancel(task_id, record, self.queue.result_ttl)
        if testmode.cancelled is not None:  # the eager test mode: no worker hears the event
            testmode.cancelled(self.queue, task_id)
        signals = self.queue.signals
        if signals.has(Signal.TASK_REVOKED):
            event = SignalEvent(Signal.TASK_REVOKED, task_id, extra={"was": was})
            await signals.emit(Signal.TASK_REVOKED, event)
        return was

    async def cancel_together(self, task_ids: Sequence[str], fanout: int) -> list[str]:
        """Cancel ``task_ids`` (a workflow's steps) as :meth:`cancel` does each, so that no
        worker starts one of them after it heard another's cancel: every one is marked
        revoked (or taken off the schedule) first, ``fanout`` at a time, and only then are
        the workers told, in one call (``announce_revoked``). A worker whose slot a running
        step's cancel frees reads the marks again before it starts its next task
        (``worker/admission.py``), so a queued step never starts in that slot.

        Returns:
            Each id's answer, as :meth:`cancel`'s, in order.

        Raises:
            OutcomeUnknown: the broker stopped answering after a cancel was sent; some may
                be applied (cancelling again is safe).
            BrokerError: the broker could not be reached.
        """
        ids = [check_task_id("task id", task_id) for task_id in task_ids]
        broker, ttl = self.queue.broker, self.queue.result_ttl
        answers: list[str] = []
        with unknown_outcome("cancel", tuple(ids)):
            for start in range(0, len(ids), fanout):  # bounded: never one connection per id
                chunk = ids[start : start + fanout]
                at = time.time()
                answers += await asyncio.gather(
                    *(
                        broker.cancel(i, records.cancel_request(i, at), ttl, announce=False)
                        for i in chunk
                    )
                )
            marked = [i for i, was in zip(ids, answers, strict=True) if was in MARKED]
            await broker.announce_revoked(marked)
        signals = self.queue.signals
        for task_id, was in zip(ids, answers, strict=True):
            if testmode.cancelled is not None:
                testmode.cancelled(self.queue, task_id)
            if signals.has(Signal.TASK_REVOKED):
                event = SignalEvent(Signal.TASK_REVOKED, task_id, extra={"was": was})
                await signals.emit(Signal.TASK_REVOKED, event)
        return answers

    # --------------------------------------------------------------- progress
    async def get_progress(self, task_id: str) -> Progress | None:
        """The latest progress a task reported, or ``None`` (none reported, or expired).

        Raises:
            BrokerError: the broker could not be reached.
            SerializationError, ConfigurationError: a bad ``task_id`` (``check_task_id``).
        """
        data = await self.queue.broker.get_progress(check_task_id("task id", task_id))
        if data is None:
            return None
        return decode_progress(data)[0]

    async def watch_progress(
        self, task_id: str, timeout: float | None = None
    ) -> AsyncIterator[Progress]:
        """Yield a task's progress updates as they are pushed, until the task ends.

        The latest stored update (if any) comes first; then each update published (pub/sub,
        not polling; with a re-read every second as a fallback should the connection drop).
        Updates coalesced by the worker are not all seen, but the newest always is. The
        iterator ends when the task reaches a final state (succeeded, failed,
        dead-lettered, cancelled), after yielding the update written with its end.

        A task that writes no record when it succeeds (``store_result=False`` without
        ``track_state``) and never reports progress gives no sign of its end: pass a
        ``timeout``.

        Args:
            task_id: the task's id.
            timeout: seconds to follow at most; ``None`` for no limit.

        Raises:
            ResultTimeout: the task did not end within ``timeout`` seconds.
            ConfigurationError: ``timeout`` is not ``None`` or a finite number of seconds
                ``>= 0``, at the first iteration.
            BrokerError: the broker could not be reached.
            SerializationError, ConfigurationError: a bad ``task_id`` (see
                :func:`~blitzq.routing.check_task_id`), at the first iteration.
        """
        task_id = check_task_id("task id", task_id)
        timeout = _checks.wait(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        last_at = -math.inf
        events = self.queue.broker.watch_progress(task_id)
        try:
            while True:
                if deadline is None:
                    kind, data = await anext(events)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise ResultTimeout(f"task {task_id} did not end within {timeout} s")
                    try:
                        kind, data = await asyncio.wait_for(anext(events), left)
                    except TimeoutError:
                        raise ResultTimeout(
                            f"task {task_id} did not end within {timeout} s"
                        ) from None
                if kind == "progress":
                    try:
                        progress, final = decode_progress(data)
                    except SerializationError:
                        continue
                    if progress.updated_at > last_at:
                        last_at = progress.updated_at
                        yield progress
                    if final:
                        return
                elif kind == "record":
                    try:
                        record = TaskRecord.from_bytes(data)
                    except SerializationError:
                        continue
                    if record.state.is_final:
                        # The run's last update is written with its completion: read it now.
                        latest = await self.get_progress(task_id)
                        if latest is not None and latest.updated_at > last_at:
                            yield latest
                        return
        finally:
            await events.aclose()


__all__ = ["WAIT_FANOUT", "Results", "final_result"]
