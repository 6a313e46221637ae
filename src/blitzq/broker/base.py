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
        eta: Unix time (seconds) the rescheduled message becomes due.
        dead_letter: fields of a dead letter to store, or ``None``.
        requeue: encoded message to put back at the head of ``queue`` now, or ``None``.
        ops: further operations applied in the same atomic step, each a tuple whose first
            item names the operation (see :data:`COMPLETION_OPS`); items are str, int,
            float or bytes.
    """

    queue: str
    token: bytes | None
    task_id: str
    record: bytes | None = None
    record_ttl: int = 0
    reschedule: bytes | None = None
    eta: float = 0.0
    dead_letter: DeadLetterFields | None = None
    requeue: bytes | None = None
    ops: tuple[tuple[Any, ...], ...] = ()


#: Operations a Completion may carry in ``ops``, by name, with their items:
#:
#: - ``("publish", kind, queue, message)``: publish ``message`` (bytes) to ``queue``, where
#:   ``kind`` is ``"s"`` or ``"l"`` as the broker's own, or ``""`` for the broker's mode.
#:
#: Features add theirs here, in ``lua/complete.lua`` and in ``MemoryBroker._OPS``.
COMPLETION_OPS: dict[str, str] = {
    "publish": "publish a message to a queue together with the completion",
    # Workflows (blitzq.workflow): the state hash of a workflow and its chord joins.
    "workflow_start": "(id, steps, ttl, now): create a running workflow's state",
    "workflow_step": "(id, kind, queue, message): publish a step unless the workflow ended",
    "workflow_done": "(id, result, ttl, now): a running workflow succeeded; notify waiters",
    "workflow_fail": "(id, state, error_type, error, step, ttl, now): end it failed/cancelled",
    "chord": "(id, join, index, size, result, ttl, kind, queue, head, tail, now, splice, "
    "result_ttl): record a "
    "member's result once; the last one publishes head + results + tail exactly once "
    "(queue '': the list becomes the workflow's result)",
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
    """

    message: bytes
    reason: str
    error: str
    task: str
    queue: str
    failed_at: float


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
    async def complete(self, completions: Sequence[Completion]) -> None:
        """Apply completions; each one atomically, a batch in as few round-trips as possible."""

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
    async def schedule(self, items: Sequence[tuple[str, str, bytes, float]]) -> None:
        """Put ``(task_id, queue, message, eta)`` items on the schedule (eta: Unix seconds)."""

    @abc.abstractmethod
    async def promote_due(self, now: float, limit: int) -> tuple[int, float | None]:
        """Move up to ``limit`` due scheduled messages to their queues.

        Returns:
            ``(moved, next_eta)``: how many moved, and the earliest due time still waiting.
        """

    @abc.abstractmethod
    async def scheduled_count(self) -> int:
        """Number of messages on the schedule."""

    # --------------------------------------------------------------- periodic
    async def claim_periodic(
        self, name: str, occurrence: float, message: bytes, queue: str
    ) -> bool:
        """Dispatch one occurrence of the periodic task ``name``, at most once.

        Atomically: when the stored last occurrence of ``name`` is missing or older than
        ``occurrence`` (Unix seconds), store ``occurrence`` and publish ``message`` to
        ``queue``; otherwise do nothing. However many schedulers race, one of them wins.

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
    async def set_progress(self, task_id: str, data: bytes, at: float, ttl: int) -> bool:
        """Store a task's progress update ``data`` made at Unix time ``at`` for ``ttl``
        seconds and publish it to watchers, unless a newer update is stored already.

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

    @abc.abstractmethod
    async def set_record(self, task_id: str, record: bytes, ttl: int) -> None:
        """Store a record for ``ttl`` seconds and wake anyone waiting for it."""

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
    async def replay_dead_letter(self, task_id: str, queue: str, message: bytes) -> bool:
        """Atomically remove a dead letter and publish ``message`` to ``queue``.

        Returns ``False`` (and publishes nothing) when the dead letter no longer exists, so two
        concurrent replays publish once.
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

    async def ping(self) -> None:
        """Check that the broker answers; raise BrokerError otherwise."""
        return

    async def close(self) -> None:
        """Release connections. The broker may be used again afterwards (it reconnects)."""
        return
