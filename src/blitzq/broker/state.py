"""The state-store seam: everything about a task except moving its message.

A state store keeps task records and results (and the waits on them), the schedule (with its
promotion on the store's clock), periodic claims, cancel marks, dead letters, workflow,
unique-key, lock, rate-limit and progress state, the queue and worker registries, and applies
a :class:`Completion` -- its ack, record, retry, dead letter, requeue and typed effects
(:mod:`blitzq.broker.ops`) -- atomically (:meth:`StateStore.complete`).

The Redis state store is its Lua scripts (``redis/lua/``). It pairs with the Redis transports
(streams or lists) on the same connection, where a completion's ack is one more write of the
same script (:meth:`StateStore.acks` answers ``True``), and is meant to pair with a RabbitMQ
transport (:mod:`blitzq.broker.transport`) too: then the facade :class:`~blitzq.broker.Broker`
applies the state effects here and acks on the transport afterwards. What the store writes
into queues -- a promotion of the schedule, a ``publish`` effect, a requeue, a replay, a
periodic claim -- goes to the queues of the kind its connection names (a stream or a list);
paired with a transport it does not ack, the facade switches it to its outbox
(:meth:`StateStore.use_outbox`), from which a relay publishes those messages on the
transport (:mod:`blitzq.broker.outbox`). Every method is a coroutine that raises
:class:`~blitzq.exceptions.BrokerError` when the server cannot be reached.
"""

from __future__ import annotations

import abc
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from .liveness import LivenessState
from .operations import OperationsState
from .outbox import Outbox
from .transport import Transport
from .values import Completion, DeadLetterFields, Scheduled

__all__ = ["Completion", "DeadLetterFields", "Scheduled", "StateStore"]


class StateStore(OperationsState, LivenessState):
    """Task state and completion effects. See the module docstring."""

    def acks(self, transport: Transport) -> bool:
        """Whether :meth:`complete` acknowledges ``transport``'s deliveries itself, in the
        same atomic step as its writes (and fences on their leases).

        ``True`` lets the facade call :meth:`complete` alone; ``False`` (the default) has it
        call :meth:`Transport.ack` after :meth:`complete` (see :mod:`blitzq.broker.transport`).
        """
        return False

    def use_outbox(self) -> Outbox | None:
        """Write every message this store puts into queues to its outbox from now on, and
        return that outbox (:mod:`blitzq.broker.outbox`).

        The facade calls it once, for a transport the store does not ack (:meth:`acks` is
        ``False``), and relays the outbox to that transport. ``None`` (the default): the
        store writes nothing into queues itself, so there is nothing to relay.
        """
        return None

    # ------------------------------------------------- rate, unique, lock state
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

    # ------------------------------------------------------------ completions
    @abc.abstractmethod
    async def complete(self, completions: Sequence[Completion]) -> list[Completion]:
        """Apply completions; each one atomically, a batch in as few round-trips as possible.

        Fencing: a completion whose delivery (``token``, else ``fence``) is no longer leased
        to this consumer -- its lease lapsed and another worker recovered the message -- is
        stale: none of its writes (ack, record, retry, dead letter, requeue, ops) is applied,
        the check and the writes being one atomic step. Each stale completion adds 1 to the
        namespace's ``stale_completions`` counter (:meth:`counters`). Brokers without leases
        (fast mode) have nothing to check.

        ``token`` and fencing with a transport whose ack is separate (:meth:`acks` is
        ``False``, e.g. RabbitMQ): ``token`` is the transport's delivery tag, which the
        facade acks after this call; the store does not ack it and cannot see its lease, so
        it fences nothing (returns no stale completion) unless it keeps a lease of its own
        for the delivery. Effects are then at-least-once: a message redelivered after a
        crash between commit and ack completes again, so effects must be idempotent per
        task id (records are overwritten, chord members counted once, unique and lock
        releases compare the holder).

        Returns:
            The stale completions (not applied), in no particular order; usually empty.
        """

    # --------------------------------------------------------------- schedule
    @abc.abstractmethod
    async def schedule(self, items: Sequence[Scheduled]) -> None:
        """Put messages on the schedule (keyed by task id: a later one replaces an earlier).

        Each item's due time is decided on the broker's clock (Redis ``TIME``): ``now +
        delay`` for a relative delay, or its absolute ``eta`` compared with that clock.
        """

    @abc.abstractmethod
    async def promote_due(self, limit: int, ahead: float = 0.0) -> tuple[int, float | None, float]:
        """Move up to ``limit`` messages that are due by the broker's clock to their queues.

        ``ahead`` (seconds, default 0): also move those due within that many seconds of the
        broker's clock. Only the eager test mode (:mod:`blitzq.testing`) passes it, to run
        delays and retries in virtual time; workers and schedulers never do.

        Returns:
            ``(moved, next_eta, now)``: how many moved, the earliest due time still waiting
            (Unix seconds on the broker's clock, ``None`` when none waits), and the broker's
            clock when it looked. Sleep ``next_eta - now`` seconds, never ``next_eta -
            time.time()``: the caller's clock may differ from the broker's.
        """

    @abc.abstractmethod
    async def scheduled_count(self) -> int:
        """Number of messages on the schedule."""

    @abc.abstractmethod
    async def scheduled_entry(self, task_id: str) -> tuple[float, str, bytes] | None:
        """Where ``task_id`` waits on the schedule: ``(due, queue, message)`` -- the due time
        (Unix seconds, the broker's clock), the physical queue it will be published to, and
        the encoded message -- or ``None`` when it is not on the schedule."""

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
        self, name: str, occurrence: float, message: bytes, queue: str, until: float | None = None
    ) -> bool:
        """Dispatch one occurrence of the periodic task ``name``, at most once.

        Atomically, on the broker's clock: refuse an ``occurrence`` (Unix seconds) later than
        that clock (not due yet), or when that clock has reached ``until`` (Unix seconds;
        ``None``: no limit), the moment the occurrence stops being the one to dispatch (a
        newer one came due); otherwise, when the stored last occurrence of ``name`` is
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
        after ``timeout`` seconds (pushed by the ``WorkflowDone`` / ``WorkflowFail`` effects,
        not polled)."""
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

    async def reset_tasks(self, task_ids: Sequence[str]) -> None:
        """Forget what earlier tasks of these ids left (record, cancel mark, progress), in
        one atomic step: a task enqueued again under an explicit id starts afresh."""
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
        failed_at: float | None = None,
    ) -> bool | str:
        """Atomically remove a dead letter and publish ``message`` to ``queue``.

        Args:
            task_id: the dead letter's task id.
            queue: physical queue to publish to.
            message: the encoded message.
            kind: ``"s"`` (stream) or ``"l"`` (list) to publish to; ``""``: the broker's own.
            unique: ``(unique key, ttl seconds)`` of a unique task: the key is claimed for
                ``task_id`` in the same atomic step, unless another task holds it.
            failed_at: the failure time (Unix seconds) of the dead letter the caller read;
                ``None``: whichever is stored. A dead letter of ``task_id`` stored since
                (replayed by another caller, failed again) is not the one read: it stays.

        Returns ``True`` when replayed; ``False`` (and publishes nothing) when the dead letter
        no longer exists or is not the one that failed at ``failed_at``, so concurrent
        replays of one dead letter publish it once; or the id (str) of another task holding
        the unique key, in which case nothing changed (the dead letter stays).
        """

    @abc.abstractmethod
    async def purge_dead_letters(self) -> int:
        """Delete all dead letters; return how many."""

    async def delete_dead_letters(self, task_ids: Sequence[str]) -> int:
        """Delete the dead letters of ``task_ids`` (a filtered purge); return how many
        existed."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete single dead letters")

    # ------------------------------------------------------------- inspection
    @abc.abstractmethod
    async def known_queues(self) -> list[str]:
        """Queues that producers or workers have used in this namespace."""

    async def remember_queues(self, queues: Sequence[str]) -> None:
        """Add queue names to the registry of known queues (:meth:`known_queues`).

        The registry only serves inspection: a store may log rather than raise when it
        cannot write it. The default does nothing (a store whose transport lists its queues).
        """
        return

    @abc.abstractmethod
    async def register_worker(self, worker_id: str, info: bytes, ttl: float) -> None:
        """Record a live worker for ``ttl`` seconds (refreshed by its maintenance loop)."""

    @abc.abstractmethod
    async def unregister_worker(self, worker_id: str) -> None:
        """Remove a worker's registration."""

    @abc.abstractmethod
    async def workers(self) -> dict[str, bytes]:
        """Live workers: id to the info they registered."""

    async def set_paused(self, queue: str, paused: bool) -> bool:
        """Pause or resume ``queue`` for every worker; whether the state changed.

        Raises:
            NotImplementedError: a store without queue control.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot pause queues")

    async def paused_queues(self) -> set[str]:
        """The paused queue names (none where pausing is not supported)."""
        return set()

    async def request_shutdown(self, worker_id: str) -> None:
        """Ask a worker to shut down gracefully.

        Raises:
            NotImplementedError: a store without a control channel.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot reach workers")

    async def counters(self) -> dict[str, int]:
        """Namespace-wide event counters kept by the broker, e.g. ``{"stale_completions": 2}``
        (completions dropped by fencing, see :meth:`complete`); absent counters are 0."""
        return {}

    async def ping(self) -> None:
        """Check that the store answers; raise BrokerError otherwise."""
        return

    async def memory_policy(self) -> tuple[str, int] | None:
        """The server's ``(maxmemory-policy, maxmemory in bytes)``, or ``None`` when the
        backend has no such setting or does not tell (see :mod:`blitzq.broker.eviction`)."""
        return None

    async def close(self) -> None:
        """Release connections. The store may be used again afterwards (it reconnects)."""
        return
