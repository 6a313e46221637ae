"""The broker contract.

A broker moves opaque ``bytes`` between producers and workers. Everything above this layer
(queue, task, worker, CLI) calls only these methods, so a new backend implements this class,
passes the shared contract suite in ``tests/contract/`` unchanged, and the rest needs no change.

Operations are grouped by concern: queues (publish, fetch, complete, heartbeat, recover),
schedule (schedule, promote_due), records, dead letters, inspection. Every method is a coroutine
that raises :class:`~blitzq.exceptions.BrokerError` when the server cannot be reached.
"""

from __future__ import annotations

import abc
import enum
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple


class Guarantee(enum.StrEnum):
    """What a broker promises about delivery."""

    AT_LEAST_ONCE = "at-least-once"
    """Every published message is run to completion at least once, across worker crashes."""
    AT_MOST_ONCE = "at-most-once"
    """A message taken by a worker that then crashes is lost; never delivered twice."""
    EPHEMERAL = "ephemeral"
    """Messages live in one process's memory and vanish with it."""


class Delivery(NamedTuple):
    """One message handed to a worker by :meth:`Broker.fetch`.

    Attributes:
        queue: physical queue name.
        token: broker-specific delivery token needed to ack (a stream entry id), or ``None``.
        payload: the encoded message.
        deliveries: how many times this message has been delivered, this one included.
    """

    queue: str
    token: bytes | None
    payload: bytes
    deliveries: int


class Scheduled(NamedTuple):
    """A message to put on the schedule (see :meth:`Broker.schedule`).

    Attributes:
        task_id: the task's id (keys the schedule entry).
        queue: physical queue it goes to when due.
        message: the encoded message.
        delay: seconds from when the broker stores it until it is due (a ``delay=``, a
            backoff), counted on the broker's clock; ignored when ``eta`` is set.
        eta: absolute due time (Unix seconds, an ``eta=``), compared with the broker's
            clock, or ``None`` for ``delay``.
    """

    task_id: str
    queue: str
    message: bytes
    delay: float = 0.0
    eta: float | None = None


@dataclass(slots=True)
class Completion:
    """Everything that must happen, atomically, when a worker is done with one delivery.

    The delivery is acknowledged (and removed) together with whatever else is set:

    Attributes:
        queue: physical queue the delivery came from.
        token: the delivery's token (``None`` for brokers that need no ack).
        task_id: the task's id (keys the record and dead letter).
        record: encoded task record to store, or ``None``.
        record_ttl: seconds the record lives.
        reschedule: encoded message to put on the schedule (a retry), or ``None``.
        delay: seconds until the rescheduled message becomes due, counted on the broker's
            clock from when the completion is applied (never a worker's wall clock).
        dead_letter: fields of a dead letter to store, or ``None``.
        requeue: encoded message to put back at the head of ``queue`` now, or ``None``.
        ops: further operations applied in the same atomic step, each a tuple whose first
            item names the operation (see :data:`COMPLETION_OPS`); items are str, int,
            float or bytes.
        fence: the token of the delivery these writes belong to when ``token`` is ``None``
            (a ``running`` record, a unique key freed at start): checked like ``token``
            (see *Fencing* in :meth:`Broker.complete`) but not acknowledged.

    Fencing: a completion whose ``token`` (or ``fence``) names a delivery this consumer no
    longer holds (its lease lapsed and the message was recovered) is *stale*; the broker
    applies none of its writes.
    """

    queue: str
    token: bytes | None
    task_id: str
    record: bytes | None = None
    record_ttl: int = 0
    reschedule: bytes | None = None
    delay: float = 0.0
    dead_letter: DeadLetterFields | None = None
    requeue: bytes | None = None
    ops: tuple[tuple[Any, ...], ...] = ()
    fence: bytes | None = None


#: Operations a Completion may carry in ``ops``, by name, with their items:
#:
#: - ``("publish", kind, queue, message)``: publish ``message`` (bytes) to ``queue``, where
#:   ``kind`` is ``"s"`` or ``"l"`` as the broker's own, or ``""`` for the broker's mode.
#:
#: Features add theirs here and in ``lua/complete.lua``.
COMPLETION_OPS: dict[str, str] = {
    "publish": "publish a message to a queue together with the completion",
    # Workflows (blitzq.workflow): the state hash of a workflow and its chord joins.
    "workflow_start": "(id, steps, ttl, now): create a running workflow's state",
    "workflow_step": "(id, kind, queue, message): publish a step unless the workflow ended",
    "workflow_done": "(id, result, ttl, now): a running workflow succeeded; notify waiters",
    "workflow_fail": "(id, state, error_type, error, step, ttl, now): end it failed/cancelled",
    "chord": "(id, join, index, size, result, ttl, kind, queue, head, tail, now, splice, "
    "result_ttl, max_bytes): record a "
    "member's result once; the last one publishes head + results + tail exactly once "
    "(queue '': the list becomes the workflow's result); a body over max_bytes fails the "
    "workflow with ResultTooLarge instead",
    # ("unique_release", key, task_id): delete unique key ``key`` while it holds ``task_id``.
    "unique_release": "free a unique-task key while it still holds this task's id",
    # ("lock_release", key, holder): remove ``holder`` from task lock ``key``.
    "lock_release": "give back a task's place of a lock",
    # ("progress", task_id, at, data, ttl): a run's last progress update (blitzq.progress).
    "progress": "store a task's progress update unless a newer one is stored; publish it",
}


@dataclass(slots=True, frozen=True)
class DeadLetterFields:
    """What a broker stores for one dead letter.

    Attributes:
        message: the original encoded message (may be malformed bytes).
        reason: short machine-readable cause ("failed", "malformed message", "unknown task",
            "max deliveries exceeded", "message too large").
        error: human-readable detail.
        task: task name, or "" when the message could not be decoded.
        queue: physical queue it came from.
        failed_at: Unix time (seconds).
        kind: where the message came from in that queue: ``"s"`` (a reliable-mode stream) or
            ``"l"`` (a fast-mode list); ``""`` when unknown (a dead letter written before
            blitzq recorded it, or by a broker with one kind of queue). A replay goes there.
    """

    message: bytes
    reason: str
    error: str
    task: str
    queue: str
    failed_at: float
    kind: str = ""


class Broker(abc.ABC):
    """Abstract broker. See the module docstring for the contract."""

    guarantee: Guarantee
    supports_recovery: bool = False
    """Whether abandoned deliveries can be recovered (leases, heartbeat, recover)."""

    # ---------------------------------------------------------------- queues
    @abc.abstractmethod
    async def publish(self, queue: str, messages: Sequence[bytes]) -> None:
        """Append encoded messages to the tail of ``queue`` in one round-trip."""

    @abc.abstractmethod
    async def prepare_consumer(self, queues: Sequence[str], consumer: str) -> None:
        """Create whatever a consumer named ``consumer`` needs to fetch from ``queues``."""

    @abc.abstractmethod
    async def fetch(self, queue: str, count: int, timeout: float) -> list[Delivery]:
        """Take up to ``count`` messages from ``queue``.

        Returns at once when messages are waiting; otherwise blocks up to ``timeout`` seconds
        (0 = do not block) for the first one.
        """

    @abc.abstractmethod
    async def fetch_first(
        self, queues: Sequence[str], count: int, timeout: float
    ) -> list[Delivery]:
        """Take up to ``count`` messages from ``queues`` in the order given (priority levels).

        Earlier queues are drained first. When all are empty, blocks up to ``timeout`` seconds
        on all of them at once (0 = do not block) and returns what arrives first (a few
        messages at most, possibly from more than one queue).
        """

    async def acquire_rate(self, buckets: Sequence[tuple[str, float, float]]) -> tuple[bool, float]:
        """Take one token from each ``(key, rate per second, capacity)`` token bucket.

        Returns:
            ``(reserved, wait)``: with ``reserved`` the tokens are taken (possibly on credit)
            and the caller may start after ``wait`` seconds without asking again; without it
            nothing was taken and the caller should ask again after ``wait`` seconds.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support rate limits")

    async def claim_unique(self, items: Sequence[tuple[str, str, float]]) -> list[str | None]:
        """Claim unique-task keys: for each ``(key, task_id, ttl seconds)``, atomically set
        ``key`` to ``task_id`` for ``ttl`` seconds unless it is already held.

        Returns:
            Per item, ``None`` when this call claimed the key, else the id holding it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support unique tasks")

    async def acquire_lock(self, key: str, holder: str, limit: int, lease: float) -> float:
        """Take one of ``limit`` places of lock ``key`` for ``holder`` for ``lease`` seconds.

        Expired leases are dropped first; a holder already present renews its place.

        Returns:
            ``0.0`` when the place is taken, else seconds until the earliest lease expires.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support task locks")

    async def renew_locks(self, items: Sequence[tuple[str, str, float]]) -> int:
        """Renew ``(key, holder, lease seconds)`` places still held (a lapsed one is not
        taken back); return how many were renewed."""
        raise NotImplementedError(f"{type(self).__name__} does not support task locks")

    @abc.abstractmethod
    async def complete(self, completions: Sequence[Completion]) -> list[Completion]:
        """Apply completions; each one atomically, a batch in as few round-trips as possible.

        Fencing: a completion whose delivery (``token``, else ``fence``) is no longer leased
        to this consumer -- its lease lapsed and another worker recovered the message -- is
        stale: none of its writes (ack, record, retry, dead letter, requeue, ops) is applied,
        the check and the writes being one atomic step. Each stale completion adds 1 to the
        namespace's ``stale_completions`` counter (:meth:`counters`). Brokers without leases
        (fast mode) have nothing to check.

        Returns:
            The stale completions (not applied), in no particular order; usually empty.
        """

    async def heartbeat(self, queue: str, tokens: Sequence[bytes]) -> int:
        """Renew the leases of deliveries this consumer still owns; return how many it renewed.

        A lease another consumer has taken over is never taken back.
        """
        return 0

    async def recover(
        self, queue: str, min_idle: float, count: int, max_deliveries: int, record_ttl: int = 86400
    ) -> tuple[int, int]:
        """Put deliveries idle longer than ``min_idle`` seconds back on ``queue``.

        Those delivered ``max_deliveries`` times already are dead-lettered instead, with a
        record (state ``dead_lettered``) kept ``record_ttl`` seconds.

        Returns:
            ``(requeued, dead_lettered)`` counts.
        """
        return (0, 0)

    # --------------------------------------------------------------- schedule
    @abc.abstractmethod
    async def schedule(self, items: Sequence[Scheduled]) -> None:
        """Put messages on the schedule (keyed by task id: a later one replaces an earlier).

        Each item's due time is decided on the broker's clock (Redis ``TIME``): ``now +
        delay`` for a relative delay, or its absolute ``eta`` compared with that clock.
        """

    @abc.abstractmethod
    async def promote_due(self, limit: int) -> tuple[int, float | None, float]:
        """Move up to ``limit`` messages that are due by the broker's clock to their queues.

        Returns:
            ``(moved, next_eta, now)``: how many moved, the earliest due time still waiting
            (Unix seconds on the broker's clock, ``None`` when none waits), and the broker's
            clock when it looked. Sleep ``next_eta - now`` seconds, never ``next_eta -
            time.time()``: the caller's clock may differ from the broker's.
        """

    @abc.abstractmethod
    async def scheduled_count(self) -> int:
        """Number of messages on the schedule."""

    # --------------------------------------------------------------- periodic
    async def server_time(self) -> float:
        """The broker's clock (Unix seconds): what decides when anything is due.

        Redis ``TIME`` for the Redis brokers; this process's ``time.time()`` for in-process
        brokers (where producers, workers and schedulers share the process's clock).

        Raises:
            BrokerError: the broker could not be reached.
        """
        return time.time()

    async def claim_periodic(
        self, name: str, occurrence: float, message: bytes, queue: str
    ) -> bool:
        """Dispatch one occurrence of the periodic task ``name``, at most once.

        Atomically, on the broker's clock: refuse an ``occurrence`` (Unix seconds) later than
        that clock (not due yet); otherwise, when the stored last occurrence of ``name`` is
        missing or older, store ``occurrence`` and publish ``message`` to ``queue``. However
        many schedulers race, one of them wins. A stored occurrence later than the broker's
        clock means that clock was stepped back since it was claimed: an older occurrence is
        then accepted, so a periodic task does not stop for the length of the step.

        Returns:
            ``True`` when this call dispatched the occurrence.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support periodic tasks")

    async def periodic_last(self, names: Sequence[str]) -> dict[str, float]:
        """The last dispatched occurrence (Unix seconds) of each name that has one."""
        raise NotImplementedError(f"{type(self).__name__} does not support periodic tasks")

    # ----------------------------------------------------------- cancellation
    async def cancel(self, task_id: str, record: bytes, ttl: int) -> str:
        """Cancel a task and store ``record`` (state cancelled) for ``ttl`` seconds.

        Returns:
            ``"scheduled"`` (removed from the schedule: it never starts), ``"queued"`` or
            ``"pending"`` (marked revoked: a worker skips it), ``"running"`` (workers are told
            to cancel it), or ``"finished"`` (already in a final state: nothing changed).
        """
        raise NotImplementedError(f"{type(self).__name__} does not support cancellation")

    async def revoked(self) -> dict[str, float]:
        """Cancelled task ids still marked, with the Unix time their mark expires."""
        raise NotImplementedError(f"{type(self).__name__} does not support cancellation")

    def events(self) -> AsyncIterator[tuple[str, str]]:
        """Push notifications for workers: ``("revoke", task_id)`` and ``("schedule", eta)``
        (``("unknown", text)`` for anything else published there).

        The iterator ends (or raises BrokerError) when the connection is lost; callers
        resubscribe and resynchronise.
        """
        raise NotImplementedError(f"{type(self).__name__} has no event channel")

    # -------------------------------------------------------------- workflows
    async def workflow_state(self, workflow_id: str) -> dict[str, bytes] | None:
        """The fields of a workflow's state hash (``state``, ``result``, …), or ``None``."""
        raise NotImplementedError(f"{type(self).__name__} does not support workflows")

    async def wait_for_workflow(self, workflow_id: str, timeout: float) -> dict[str, bytes] | None:
        """Like :meth:`workflow_state`, returning once ``state`` is no longer ``running`` or
        after ``timeout`` seconds (pushed by the ``workflow_*`` ops, not polled)."""
        raise NotImplementedError(f"{type(self).__name__} does not support workflows")

    # --------------------------------------------------------------- progress
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

    # ---------------------------------------------------------------- records
    @abc.abstractmethod
    async def get_record(self, task_id: str) -> bytes | None:
        """The stored record of a task, or ``None``."""

    async def get_records(self, task_ids: Sequence[str]) -> list[bytes | None]:
        """The stored records of ``task_ids``, in order, ``None`` where there is none.

        A backend reads them in a few round trips (the Redis brokers: MGET in chunks); this
        default reads one after the other, never all at once.
        """
        return [await self.get_record(task_id) for task_id in task_ids]

    @abc.abstractmethod
    async def set_record(self, task_id: str, record: bytes, ttl: int) -> None:
        """Store a record for ``ttl`` seconds and wake anyone waiting for it."""

    async def reset_tasks(self, task_ids: Sequence[str]) -> None:
        """Forget what earlier tasks of these ids left (record, cancel mark, progress), in
        one atomic step: a task enqueued again under an explicit id starts afresh."""
        raise NotImplementedError(f"{type(self).__name__} cannot reset task ids")

    @abc.abstractmethod
    async def wait_for_record(self, task_id: str, timeout: float) -> bytes | None:
        """Return the record once one is stored, or ``None`` after ``timeout`` seconds."""

    # ----------------------------------------------------------- dead letters
    @abc.abstractmethod
    async def dead_letters(self, offset: int, limit: int) -> list[tuple[str, DeadLetterFields]]:
        """Dead letters, newest first, as ``(task_id, fields)``."""

    @abc.abstractmethod
    async def get_dead_letter(self, task_id: str) -> DeadLetterFields | None:
        """One dead letter, or ``None``."""

    @abc.abstractmethod
    async def dead_letter_count(self) -> int:
        """Number of stored dead letters."""

    @abc.abstractmethod
    async def replay_dead_letter(
        self,
        task_id: str,
        queue: str,
        message: bytes,
        kind: str = "",
        unique: tuple[str, float] | None = None,
    ) -> bool | str:
        """Atomically remove a dead letter and publish ``message`` to ``queue``.

        Args:
            task_id: the dead letter's task id.
            queue: physical queue to publish to.
            message: the encoded message.
            kind: ``"s"`` (stream) or ``"l"`` (list) to publish to; ``""``: the broker's own.
            unique: ``(unique key, ttl seconds)`` of a unique task: the key is claimed for
                ``task_id`` in the same atomic step, unless another task holds it.

        Returns ``True`` when replayed; ``False`` (and publishes nothing) when the dead letter
        no longer exists, so two concurrent replays publish once; or the id (str) of another
        task holding the unique key, in which case nothing changed (the dead letter stays).
        """

    @abc.abstractmethod
    async def purge_dead_letters(self) -> int:
        """Delete all dead letters; return how many."""

    # ------------------------------------------------------------- inspection
    @abc.abstractmethod
    async def queue_stats(self, queues: Sequence[str]) -> dict[str, dict[str, int]]:
        """Per queue: ``{"waiting": n, "in_flight": n}`` (in_flight is 0 without leases)."""

    @abc.abstractmethod
    async def known_queues(self) -> list[str]:
        """Queues that producers or workers have used in this namespace."""

    @abc.abstractmethod
    async def register_worker(self, worker_id: str, info: bytes, ttl: float) -> None:
        """Record a live worker for ``ttl`` seconds (refreshed by its maintenance loop)."""

    @abc.abstractmethod
    async def unregister_worker(self, worker_id: str) -> None:
        """Remove a worker's registration."""

    @abc.abstractmethod
    async def workers(self) -> dict[str, bytes]:
        """Live workers: id to the info they registered."""

    @abc.abstractmethod
    async def purge_queue(self, queue: str) -> int:
        """Delete waiting messages of ``queue``; return how many."""

    async def counters(self) -> dict[str, int]:
        """Namespace-wide event counters kept by the broker, e.g. ``{"stale_completions": 2}``
        (completions dropped by fencing, see :meth:`complete`); absent counters are 0."""
        return {}

    async def ping(self) -> None:
        """Check that the broker answers; raise BrokerError otherwise."""
        return

    async def memory_policy(self) -> tuple[str, int] | None:
        """The server's ``(maxmemory-policy, maxmemory in bytes)``, or ``None`` when the
        backend has no such setting or does not tell (see :mod:`blitzq.broker.eviction`)."""
        return None

    async def close(self) -> None:
        """Release connections. The broker may be used again afterwards (it reconnects)."""
        return
