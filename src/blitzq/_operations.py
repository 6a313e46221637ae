"""What a Queue offers besides registering and enqueueing: results, cancellation, dead
letters and inspection. Kept apart so that ``queue.py`` stays about one thing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from . import records
from .broker.base import Broker
from .client.sync import Portal, blocking
from .exceptions import (
    BrokerError,
    ResultNotStored,
    ResultTimeout,
    SerializationError,
    TaskCancelled,
    TaskExpired,
    TaskFailed,
)
from .extensions.unique import DEFAULT_UNIQUE_TTL, broker_key
from .records import DeadLetter, TaskRecord, TaskState
from .routing import check_name
from .serialization import decode_envelope, encode_envelope
from .task import TaskHandle

if TYPE_CHECKING:
    from .task import Task
    from .workflow.canvas import Node
    from .workflow.handle import WorkflowHandle
    from .workflow.signature import Signature

_FOREVER = 10 * 365 * 86400.0


def _raise_final(task_id: str, record: TaskRecord) -> None:
    """Raise the error of a record in a final state other than succeeded; else return."""
    if record.state is TaskState.CANCELLED:
        raise TaskCancelled(task_id, record.state.value, record.error_type, record.error, None)
    if record.state is TaskState.EXPIRED:
        raise TaskExpired(task_id, record.state.value, record.error_type, record.error, None)
    if record.state.is_final:
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


class QueueOperations:
    """Mixin of :class:`~blitzq.Queue`: results, cancellation, dead letters, inspection."""

    name: str
    result_ttl: int
    max_message_size: int
    tasks: dict[str, Task[Any, Any]]
    _portal: Portal

    @property
    def broker(self) -> Broker:  # provided by Queue
        raise NotImplementedError

    # ---------------------------------------------------------------- results
    async def inspect(self, task_id: str) -> TaskRecord | None:
        """The task's stored record (state, attempts, result or error, times), or ``None``."""
        data = await self.broker.get_record(task_id)
        return TaskRecord.from_bytes(data) if data is not None else None

    inspect_sync = blocking(inspect)

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
            ResultTimeout: no final record arrived in time (the task may still run; with
                ``store_result=False`` and no ``track_state`` a success writes no record,
                so only the task's handle can tell at once: ``handle.result()``).
        """
        wait = _FOREVER if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + wait
        broker = self.broker
        while True:
            try:
                data = await broker.wait_for_record(task_id, max(0.0, deadline - time.monotonic()))
            except BrokerError as exc:
                # The server restarting: keep waiting (re-reading) until the deadline.
                if not exc.transient or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
                continue
            if data is None:
                raise ResultTimeout(f"no result for task {task_id} within {timeout} s")
            record = TaskRecord.from_bytes(data)
            if record.state.is_final:
                return final_result(task_id, record)
            if time.monotonic() >= deadline:
                raise ResultTimeout(f"task {task_id} is {record.state.value} after {timeout} s")
            await asyncio.sleep(0.05)

    async def _no_stored_result(self, task_id: str) -> Any:
        """``result()`` of a task known not to store its result: raise at once.

        Raises:
            TaskFailed: a final failure (or cancellation, expiry) is already recorded.
            ResultNotStored: otherwise.
        """
        data = await self.broker.get_record(task_id)
        if data is not None:
            record = TaskRecord.from_bytes(data)
            if record.state is not TaskState.SUCCEEDED:
                _raise_final(task_id, record)
        raise ResultNotStored(task_id)

    get_result_sync = blocking(get_result)

    # ----------------------------------------------------------- cancellation
    async def cancel(self, task_id: str) -> str:
        """Cancel a task.

        A scheduled (delayed, retrying or rate-limited) task is taken off the schedule and
        never starts. A queued one is marked revoked: every worker skips it. A running one
        is cancelled by its worker at once: an async task is cancelled, a thread task sees
        ``current_task().cancelled``, a process task is terminated. Its record becomes
        ``cancelled`` and ``result()`` raises :class:`TaskCancelled`.

        Returns:
            What the task was: ``"scheduled"``, ``"queued"``, ``"running"``, ``"pending"``
            (queued or running: without ``track_state`` the two cannot be told apart) or
            ``"finished"`` (already final: nothing changed).
        """
        record = records.cancel_request(task_id, time.time())
        return await self.broker.cancel(task_id, record, self.result_ttl)

    cancel_sync = blocking(cancel)

    # ----------------------------------------------------------- dead letters
    async def dead_letters(self, limit: int = 100, offset: int = 0) -> list[DeadLetter]:
        """Dead letters, newest first.

        Args:
            limit: most entries to return.
            offset: entries to skip.
        """
        rows = await self.broker.dead_letters(offset, limit)
        return [
            DeadLetter.from_fields(
                task_id, f.message, f.reason, f.error, f.task, f.queue, f.failed_at, f.kind
            )
            for task_id, f in rows
        ]

    dead_letters_sync = blocking(dead_letters)

    async def dead_letter_count(self) -> int:
        """Number of stored dead letters."""
        return await self.broker.dead_letter_count()

    async def retry(self, task_id: str) -> TaskHandle[Any] | None:
        """Replay a dead letter: atomically remove it and publish it again with fresh attempts.

        The message goes back where it came from: the same queue, in the mode it was
        dead-lettered in (a fast-mode list or a reliable-mode stream), whatever this Queue's
        mode; a dead letter stored before blitzq recorded its mode goes to this Queue's mode.
        A unique task claims its unique key again, for the task's ``unique_ttl`` (the default
        one when the task is not registered here); while another task holds the key, nothing
        is replayed and the dead letter stays.

        Returns:
            A handle to the replayed task; a handle with ``duplicate=True`` naming the task
            that holds the unique key (nothing replayed); or ``None`` when no such dead
            letter exists (or a concurrent replay took it first).

        Raises:
            SerializationError: the dead letter's message is malformed and cannot be replayed.
            MessageTooLarge: the message is over this Queue's ``max_message_size`` (bytes);
                the dead letter stays.
        """
        broker = self.broker
        fields = await broker.get_dead_letter(task_id)
        if fields is None:
            return None
        if fields.reason == "unreadable entry" and not fields.message:  # its key is no hash
            raise SerializationError(f"dead letter {task_id} is unreadable: {fields.error}")
        env = decode_envelope(fields.message)
        queue = fields.queue or env.queue
        now = time.time()
        # Every field is kept (unique key, max_age, workflow metadata, …) but the attempts,
        # which start over, and the age: a replay would otherwise expire again at once.
        replayed = msgspec.structs.replace(
            env, queue=queue, attempt=1, created_at=now, enqueued_at=now, reserved=False
        )
        data = encode_envelope(replayed, self.max_message_size)
        unique = None
        if env.unique_key is not None:
            task = self.tasks.get(env.task)
            ttl = task.controls.unique_ttl if task is not None else DEFAULT_UNIQUE_TTL
            unique = (broker_key(env), ttl)
        outcome = await broker.replay_dead_letter(task_id, queue, data, fields.kind, unique)
        if outcome is False:
            return None
        if isinstance(outcome, str):
            return TaskHandle(self, outcome, queue, env.task, duplicate=True)
        return TaskHandle(self, env.id, queue, env.task)

    retry_sync = blocking(retry)

    dead_letter_count_sync = blocking(dead_letter_count)

    async def purge_dead_letters(self) -> int:
        """Delete every dead letter; return how many."""
        return await self.broker.purge_dead_letters()

    purge_dead_letters_sync = blocking(purge_dead_letters)

    async def purge_queue(self, queue: str | None = None) -> int:
        """Delete the messages waiting in ``queue`` (default: this Queue's ``name``).

        Messages already taken by a worker are not touched. Returns how many were deleted.
        """
        return await self.broker.purge_queue(check_name("queue name", queue or self.name))

    purge_queue_sync = blocking(purge_queue)

    # ------------------------------------------------------------- inspection
    async def stats(self, queues: Iterable[str] | None = None) -> dict[str, Any]:
        """Queue depths, schedule size, dead letters and live workers.

        Returns:
            ``{"queues": {name: {"waiting": n, "in_flight": n}}, "scheduled": n,
            "dead_letters": n, "workers": n, "stale_completions": n}``; the last counts the
            completions ever refused by fencing in this namespace (a worker that lost its
            lease, see docs/guarantees.md).
        """
        broker = self.broker
        names = sorted(set(queues) if queues is not None else set(await broker.known_queues()))
        per_queue = await broker.queue_stats(names) if names else {}
        if queues is None:  # empty priority levels are noise in an overview
            per_queue = {
                q: counts
                for q, counts in per_queue.items()
                if any(counts.values()) or not q.endswith((":high", ":low"))
            }
        return {
            "queues": per_queue,
            "scheduled": await broker.scheduled_count(),
            "dead_letters": await broker.dead_letter_count(),
            "workers": len(await broker.workers()),
            "stale_completions": (await broker.counters()).get("stale_completions", 0),
        }

    stats_sync = blocking(stats)

    # -------------------------------------------------------------- workflows
    def sig(self, name: str, /, *args: Any, **kwargs: Any) -> Signature:
        """A workflow step calling the task registered as ``name`` (it need not be imported
        here); see :mod:`blitzq.workflow`.

        Raises:
            SerializationError: an argument is not plain data.
        """
        from .workflow.signature import Signature

        return Signature(name, args, kwargs)

    async def apply(self, workflow: Node) -> WorkflowHandle:
        """Start a workflow (a chain, group, chord or signature); returns at once.

        Its state and first steps are written in one atomic round-trip (steps past the
        first 1000 in further calls); workers advance it.

        Raises:
            ConfigurationError: not a workflow.
            SerializationError, MessageTooLarge: a step's message cannot be built.
            BrokerError: the broker could not be reached.
        """
        from .workflow.engine import apply_workflow

        return await apply_workflow(self, workflow)  # type: ignore[arg-type]

    apply_sync = blocking(apply)

    def workflow(self, workflow_id: str) -> WorkflowHandle:
        """A handle to the workflow ``workflow_id`` (re-attach from any process)."""
        from .workflow.handle import WorkflowHandle

        return WorkflowHandle(self, workflow_id)
