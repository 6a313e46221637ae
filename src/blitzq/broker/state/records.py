"""The records role of the state seam: task records and the waits on them, progress,
workflow state, and task liveness.

Used by the result side of the client (waits, progress watches, workflow handles) and by the
worker (running records, progress, keep-running, the liveness check of a result wait).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator, Mapping, Sequence

__all__ = ["RecordsState"]


class RecordsState(abc.ABC):
    """Records, results and their waits, progress, workflow state, liveness."""

    async def workflow_state(self, workflow_id: str) -> dict[str, bytes] | None:
        """The fields of a workflow's state hash (``state``, ``result``, …), or ``None``."""
        raise NotImplementedError(f"{type(self).__name__} does not support workflows")

    async def wait_for_workflow(self, workflow_id: str, timeout: float) -> dict[str, bytes] | None:
        """Like :meth:`workflow_state`, returning once ``state`` is no longer ``running`` or
        after ``timeout`` seconds (pushed by the ``WorkflowDone`` / ``WorkflowFail`` effects,
        not polled)."""
        raise NotImplementedError(f"{type(self).__name__} does not support workflows")

    async def set_progress(
        self,
        task_id: str,
        data: bytes,
        at: float,
        ttl: int,
        fence: tuple[str, bytes] | None = None,
    ) -> bool:
        """Store a task's progress update ``data`` made at Unix time ``at`` for ``ttl``
        seconds and publish it to watchers, unless a newer update is stored already.

        ``fence``: ``(queue, token)`` of the run's delivery; nothing is stored unless it is
        still leased to this consumer (as for :meth:`complete`; ignored without leases).

        Returns:
            Whether it was stored.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support progress")

    async def get_progress(self, task_id: str) -> bytes | None:
        """The latest stored progress update of a task, or ``None``."""
        raise NotImplementedError(f"{type(self).__name__} does not support progress")

    def watch_progress(self, task_id: str) -> AsyncGenerator[tuple[str, bytes], None]:
        """Follow a task: yields ``("progress", update)`` and ``("record", record)`` items.

        After subscribing it yields the stored update and record (those that exist), then
        each update published and each record written, and both again after a second
        without news (a fallback should pushes be lost). The caller decides when to stop
        and closes the generator.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support progress")

    @abc.abstractmethod
    async def get_record(self, task_id: str) -> bytes | None:
        """The stored record of a task, or ``None``."""

    async def get_records(self, task_ids: Sequence[str]) -> list[bytes | None]:
        """The stored records of ``task_ids``, in order, ``None`` where there is none.

        A backend reads them in a few round trips (the Redis brokers: MGET in chunks); this
        default reads one after the other, never all at once.
        """
        return [await self.get_record(task_id) for task_id in task_ids]

    async def take_redelivered(
        self, task_ids: Sequence[str], digests: Sequence[str], owners: Sequence[bytes], ttl: int
    ) -> tuple[list[bytes | None], list[int]]:
        """Read the records of redelivered messages and, in the same atomic step, note each
        delivery as the latest take of its message copy (RabbitMQ's fencing, see
        ``broker/amqp/redelivered.py``): the copy of ``task_ids[i]`` whose body has the
        digest ``digests[i]`` is now taken by the delivery ``owners[i]``, one more take
        counted, kept ``ttl`` seconds. A completion of another delivery of that copy is then
        stale (:meth:`~blitzq.broker.state.StateStore.complete`).

        Args:
            task_ids: the tasks' ids, whose records are read.
            digests: the digests of the copies taken (hex), one per id.
            owners: the taking deliveries' tokens, one per id.
            ttl: seconds the takes are kept.

        Returns:
            The records (``None`` where there is none) and each copy's takes counted so far,
            this one included, in order.

        Raises:
            NotImplementedError: a store that notes no takes (the caller reads the records
                alone and fences nothing).
            BrokerError: the broker failed.
        """
        raise NotImplementedError(f"{type(self).__name__} does not note takes")

    async def count_solo_start(self, task_id: str, ttl: int) -> int:
        """Count one more run of a redelivered task started alone in its worker process
        (the worker's :mod:`~blitzq.worker.solo`), kept ``ttl`` seconds after the last;
        return the count, this run included (1 for the first).

        Raises:
            NotImplementedError: a store that keeps no such count (the worker then runs the
                task and leaves its bound to the transport's delivery count).
            BrokerError: the broker failed.
        """
        raise NotImplementedError(f"{type(self).__name__} does not count solo runs")

    async def solo_runs(self, task_id: str) -> int:
        """How many runs of ``task_id`` started alone so far (:meth:`count_solo_start`; 0
        when none, or their count expired).

        Raises:
            NotImplementedError: a store that keeps no such count.
            BrokerError: the broker failed.
        """
        raise NotImplementedError(f"{type(self).__name__} does not count solo runs")

    async def record_ids(self, limit: int) -> tuple[list[str], bool]:
        """Ids of stored records, at most ``limit``, in no particular order, and whether
        more were left (for inspection pages; the Redis stores scan their keys).

        Raises:
            NotImplementedError: a store that cannot list its records.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot list task records")

    @abc.abstractmethod
    async def set_record(self, task_id: str, record: bytes, ttl: int) -> None:
        """Store a record for ``ttl`` seconds and wake anyone waiting for it."""

    async def reset_tasks(
        self, task_ids: Sequence[str], owners: Mapping[str, str] | None = None, ttl: int = 0
    ) -> None:
        """Forget what earlier tasks of these ids left (record, cancel mark, progress), in
        one atomic step: a task enqueued again under an explicit id starts afresh.

        Args:
            task_ids: the ids.
            owners: id -> the mark of the enqueue that now owns the id's record
                (``Envelope.nonce``), stored in the same step for ``ttl`` seconds: a
                completion of another enqueue of the id stores no record while it stands
                (see :attr:`~blitzq.broker.values.Completion.nonce`).
            ttl: seconds the owner marks live (the Queue's ``result_ttl``).

        Raises:
            BrokerError: the broker failed; nothing or all of it was applied.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot reset task ids")

    @abc.abstractmethod
    async def wait_for_record(
        self, task_id: str, timeout: float, since: object | None = None
    ) -> bytes | None:
        """Return the record once one is stored, or ``None`` after ``timeout`` seconds.

        ``since``: what :meth:`result_token` returned just before the task's message was
        sent, if anything; a store may use it to skip its first read (a hint only)."""

    def result_token(self) -> object | None:
        """A mark to take just before sending a message and pass to :meth:`wait_for_record`
        as ``since``; ``None`` (the default) when the store has no use for one."""
        return None

    async def trace_task(self, task_id: str, queue: str) -> bool | None:
        """Whether ``task_id`` is known anywhere, in one atomic look: ``True`` when it has a
        record, waits on the schedule or has a message (waiting or in flight) in its
        physical ``queue``; ``False`` when it is known nowhere (its result cannot arrive);
        ``None`` when the store cannot tell (the default).

        Raises:
            BrokerError: the broker could not be reached.
        """
        return None

    async def keep_running(self, task_ids: Sequence[str], ttl: int) -> int:
        """Give the ``running`` records of ``task_ids`` (runs this worker holds) at least
        ``ttl`` seconds to live; a record in another state is left alone. Returns how many
        were extended (the default: none, records expire as written).

        Raises:
            BrokerError: the broker could not be reached.
        """
        return 0
