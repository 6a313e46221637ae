"""The Redis state store: role objects over one connection, and the atomic completion.

:class:`RedisStateStore` is the :class:`~blitzq.broker.state.StateStore` of every Redis
deployment. It holds one :class:`~.connection.RedisConnection` and one small object per role,
each taking that connection:

============================  =====================================================
``records`` (records.py)      records and their waits, workflow state, progress,
                              task liveness (trace, keep running)
``scheduling`` (schedule.py)  the schedule and its promotion, periodic claims
``dead_letter_box``           dead letters: list, read, count, replay, purge
(dead_letters.py)
``control``                   rate limits, unique keys, locks, cancel marks, events
(control_state.py)
``registry`` (registry.py)    known queues, live workers, paused queues, shutdown
                              requests, counters, memory policy
``operations``                run-time periodic entries, the autoscale setpoint,
(operator_state.py)           supervisor status, server facts
============================  =====================================================

and applies a batch of completions itself (:meth:`RedisStateStore.complete`, one
``complete.lua`` call; the batch encoding is ``completion.py``). Each method of the seam is
delegated to its role explicitly below. The logic is the Lua in ``lua/``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from typing import Any

from ...exceptions import ConfigurationError
from ...limits import NOTIFY_INLINE_MAX
from ..outbox import Outbox
from ..state import StateStore
from ..transport import Transport
from ..values import Completion, DeadLetterFields, Scheduled
from .browse import RedisBrowse
from .client import translate_errors
from .completion import encode_batch, encode_entries
from .connection import LeaseIdentity, RedisConnection, RedisPart
from .control_state import RedisControl
from .dead_letters import RedisDeadLetters
from .keys import GROUP
from .operator_state import RedisOperatorState
from .outbox import RedisOutbox
from .records import RedisRecords
from .registry import RedisRegistry
from .schedule import RedisSchedule
from .sentinel import ReplicatedRedis, durable_writes

__all__ = ["RedisStateStore"]


class RedisStateStore(StateStore):
    """The Redis state store on a connection it may share with a Redis transport.

    Both choices are made here, once: whose leases it fences on, and whether it writes into
    the transport's queues or into its outbox.

    Args:
        conn: the :class:`~.connection.RedisConnection` (its ``kind`` says where the
            store's writes into queues go without an outbox).
        lease: the :class:`~.connection.LeaseIdentity` of the streams transport on ``conn``
            whose deliveries this store acks: completions and progress are fenced on its
            leases (``None``: nothing is fenced; a lists transport has no leases).
        outbox: write every message the store puts into a queue to that queue's outbox
            (kind ``"o"``, ``{ns}:outbox:<queue>``), for a transport the store does not ack
            (RabbitMQ, another connection, the spread layout), which the pairing's relay
            publishes on; such a store fences nothing (``lease`` is ignored).

    Attributes:
        conn: the connection; ``keys`` and ``client`` are its own.
        kind: where the store's scripts write messages into queues: the connection's kind
            (``"s"``, ``"l"``), or ``"o"`` (made with an outbox).
        lease: the lease identity it fences on, or ``None``.
        outbox: its :class:`~.outbox.RedisOutbox` when made with ``outbox=True``, else
            ``None``.
        records, scheduling, dead_letter_box, control, registry, operations: the role
            objects (see the module docstring).
    """

    def __init__(
        self, conn: RedisConnection, *, lease: LeaseIdentity | None = None, outbox: bool = False
    ) -> None:
        self.conn = conn
        self.keys = conn.keys
        self.client: Any = conn.client
        self.scripts = conn.scripts
        self.lease = None if outbox else lease
        self.kind = "o" if outbox else conn.kind
        self.outbox: Outbox | None = self.make_outbox() if outbox else None
        self.records = RedisRecords(conn, self.kind, self.lease)
        self.scheduling = RedisSchedule(conn, self.kind)
        self.dead_letter_box = RedisDeadLetters(conn, self.kind)
        self.control = RedisControl(conn)
        self.registry = RedisRegistry(conn)
        self.operations = RedisOperatorState(conn)
        self.browse = RedisBrowse(conn)

    def make_outbox(self) -> Outbox:
        """The outbox of a store made with ``outbox=True`` (a :class:`~.outbox.RedisOutbox`)."""
        return RedisOutbox(self.conn)

    @property
    def pool_size(self) -> int | None:
        """Most connections the store's client opens (``max_connections``), ``None`` when
        unknown."""
        return self.conn.pool_size

    def acks(self, transport: Transport) -> bool:
        """``True`` for a Redis transport on this store's connection, the store made without
        an outbox: ``complete.lua`` acks (XACK + XDEL) and fences its stream entries in the
        same script as the writes.

        Raises:
            ConfigurationError: the transport holds leases (streams) and this store was not
                given its :class:`~.connection.LeaseIdentity`: it could not fence on them.
        """
        if self.outbox is not None or not isinstance(transport, RedisPart):
            return False
        if transport.conn is not self.conn:
            return False
        if getattr(transport, "lease", None) is not self.lease:
            raise ConfigurationError(
                "a Redis state store on a streams transport's connection fences on that "
                "transport's leases: make it with RedisStateStore(conn, lease=transport.lease)"
            )
        return True

    @property
    def replicated(self) -> bool:  # type: ignore[override]
        """``True`` on ``redis+sentinel://`` (asynchronous replication: see
        :meth:`complete_durably`)."""
        return isinstance(self.conn.client, ReplicatedRedis)

    # ------------------------------------------------------------ completions
    async def complete_durably(self, completions: Sequence[Completion]) -> list[Completion]:
        """:meth:`complete`, each write waited for by the primary's replicas that exist (at
        least one, ``wait_replicas`` if more) on a ``redis+sentinel://`` store
        (``sentinel.py``: ``WAIT``; ``BrokerError`` when fewer acknowledged in time); as
        :meth:`complete` on a server without Sentinel."""
        token = durable_writes.set(True)
        try:
            return await self.complete(completions)
        finally:
            durable_writes.reset(token)

    @translate_errors
    async def complete(self, completions: Sequence[Completion]) -> list[Completion]:
        """Apply a batch of completions in one Lua call (one round-trip, atomic).

        The batch travels as one MessagePack argument (:func:`~.completion.encode_batch`)
        that the script unpacks with ``cmsgpack``. Stream completions are fenced in the
        script (see :meth:`Broker.complete`); the stale ones are returned.
        """
        if not completions:
            return []
        entries = encode_batch(completions, self.kind)
        if not entries:
            return []
        keys, conn = self.keys, self.conn
        stale = await self.scripts.call(
            "complete",
            keys=[keys.schedule, keys.schedule_data, keys.dead_letters],
            args=[
                keys.prefix,
                GROUP,
                conn.dead_letter_cap,
                encode_entries(entries),
                conn.dead_letter_ttl,
                conn.dead_letter_max_bytes,
                NOTIFY_INLINE_MAX,
                self.lease.consumer if self.lease is not None else "",
            ],
        )
        if not stale:
            return []
        wanted = {(q.decode(), bytes(t)) for q, t in stale}
        return [c for c in completions if (c.queue, c.token or c.fence) in wanted]

    # ---------------------------------------------- control: rate, unique, lock
    async def acquire_rate(self, buckets: Sequence[tuple[str, float, float]]) -> tuple[bool, float]:
        """See :meth:`.RedisControl.acquire_rate`."""
        return await self.control.acquire_rate(buckets)

    async def claim_unique(self, items: Sequence[tuple[str, str, float]]) -> list[str | None]:
        """See :meth:`.RedisControl.claim_unique`."""
        return await self.control.claim_unique(items)

    async def acquire_lock(self, key: str, holder: str, limit: int, lease: float) -> float:
        """See :meth:`.RedisControl.acquire_lock`."""
        return await self.control.acquire_lock(key, holder, limit, lease)

    async def renew_locks(self, items: Sequence[tuple[str, str, float]]) -> int:
        """See :meth:`.RedisControl.renew_locks`."""
        return await self.control.renew_locks(items)

    # ---------------------------------------------------- control: cancellation
    async def cancel(self, task_id: str, record: bytes, ttl: int) -> str:
        """See :meth:`.RedisControl.cancel`."""
        return await self.control.cancel(task_id, record, ttl)

    async def revoked(self) -> dict[str, float]:
        """See :meth:`.RedisControl.revoked`."""
        return await self.control.revoked()

    async def cancel_mark(self, task_id: str) -> float | None:
        """See :meth:`.RedisControl.cancel_mark`."""
        return await self.control.cancel_mark(task_id)

    def events(self) -> AsyncIterator[tuple[str, str]]:
        """See :meth:`.RedisControl.events`."""
        return self.control.events()

    # ---------------------------------------------------------------- schedule
    async def schedule(self, items: Sequence[Scheduled]) -> None:
        """See :meth:`.RedisSchedule.schedule`."""
        await self.scheduling.schedule(items)

    async def promote_due(self, limit: int, ahead: float = 0.0) -> tuple[int, float | None, float]:
        """See :meth:`.RedisSchedule.promote_due`."""
        return await self.scheduling.promote_due(limit, ahead)

    async def scheduled_count(self) -> int:
        """See :meth:`.RedisSchedule.scheduled_count`."""
        return await self.scheduling.scheduled_count()

    async def scheduled_entry(self, task_id: str) -> tuple[float, str, bytes] | None:
        """See :meth:`.RedisSchedule.scheduled_entry`."""
        return await self.scheduling.scheduled_entry(task_id)

    async def server_time(self) -> float:
        """See :meth:`.RedisSchedule.server_time`."""
        return await self.scheduling.server_time()

    async def claim_periodic(
        self, name: str, occurrence: float, message: bytes, queue: str, until: float | None = None
    ) -> bool:
        """See :meth:`.RedisSchedule.claim_periodic`."""
        return await self.scheduling.claim_periodic(name, occurrence, message, queue, until)

    async def periodic_last(self, names: Sequence[str]) -> dict[str, float]:
        """See :meth:`.RedisSchedule.periodic_last`."""
        return await self.scheduling.periodic_last(names)

    # ----------------------------------------------------------------- records
    async def get_record(self, task_id: str) -> bytes | None:
        """See :meth:`.RedisRecords.get_record`."""
        return await self.records.get_record(task_id)

    async def get_records(self, task_ids: Sequence[str]) -> list[bytes | None]:
        """See :meth:`.RedisRecords.get_records`."""
        return await self.records.get_records(task_ids)

    async def record_ids(self, limit: int) -> tuple[list[str], bool]:
        """See :meth:`.RedisRecords.record_ids`."""
        return await self.records.record_ids(limit)

    async def set_record(self, task_id: str, record: bytes, ttl: int) -> None:
        """See :meth:`.RedisRecords.set_record`."""
        await self.records.set_record(task_id, record, ttl)

    async def reset_tasks(self, task_ids: Sequence[str]) -> None:
        """See :meth:`.RedisRecords.reset_tasks`."""
        await self.records.reset_tasks(task_ids)

    async def wait_for_record(
        self, task_id: str, timeout: float, since: object | None = None
    ) -> bytes | None:
        """See :meth:`.RedisRecords.wait_for_record`."""
        return await self.records.wait_for_record(task_id, timeout, since)

    def result_token(self) -> object | None:
        """See :meth:`.RedisRecords.result_token`."""
        return self.records.result_token()

    async def trace_task(self, task_id: str, queue: str) -> bool | None:
        """See :meth:`.RedisRecords.trace_task`."""
        return await self.records.trace_task(task_id, queue)

    async def keep_running(self, task_ids: Sequence[str], ttl: int) -> int:
        """See :meth:`.RedisRecords.keep_running`."""
        return await self.records.keep_running(task_ids, ttl)

    async def workflow_state(self, workflow_id: str) -> dict[str, bytes] | None:
        """See :meth:`.RedisRecords.workflow_state`."""
        return await self.records.workflow_state(workflow_id)

    async def wait_for_workflow(self, workflow_id: str, timeout: float) -> dict[str, bytes] | None:
        """See :meth:`.RedisRecords.wait_for_workflow`."""
        return await self.records.wait_for_workflow(workflow_id, timeout)

    async def set_progress(
        self, task_id: str, data: bytes, at: float, ttl: int, fence: tuple[str, bytes] | None = None
    ) -> bool:
        """See :meth:`.RedisRecords.set_progress`."""
        return await self.records.set_progress(task_id, data, at, ttl, fence)

    async def get_progress(self, task_id: str) -> bytes | None:
        """See :meth:`.RedisRecords.get_progress`."""
        return await self.records.get_progress(task_id)

    def watch_progress(self, task_id: str) -> AsyncGenerator[tuple[str, bytes], None]:
        """See :meth:`.RedisRecords.watch_progress`."""
        return self.records.watch_progress(task_id)

    # ------------------------------------------------------------ dead letters
    async def dead_letters(self, offset: int, limit: int) -> list[tuple[str, DeadLetterFields]]:
        """See :meth:`.RedisDeadLetters.dead_letters`."""
        return await self.dead_letter_box.dead_letters(offset, limit)

    async def get_dead_letter(self, task_id: str) -> DeadLetterFields | None:
        """See :meth:`.RedisDeadLetters.get_dead_letter`."""
        return await self.dead_letter_box.get_dead_letter(task_id)

    async def dead_letter_count(self) -> int:
        """See :meth:`.RedisDeadLetters.dead_letter_count`."""
        return await self.dead_letter_box.dead_letter_count()

    async def replay_dead_letter(
        self,
        task_id: str,
        queue: str,
        message: bytes,
        kind: str = "",
        unique: tuple[str, float] | None = None,
        failed_at: float | None = None,
    ) -> bool | str:
        """See :meth:`.RedisDeadLetters.replay_dead_letter`."""
        box = self.dead_letter_box
        return await box.replay_dead_letter(task_id, queue, message, kind, unique, failed_at)

    async def purge_dead_letters(self) -> int:
        """See :meth:`.RedisDeadLetters.purge_dead_letters`."""
        return await self.dead_letter_box.purge_dead_letters()

    async def delete_dead_letters(self, task_ids: Sequence[str]) -> int:
        """See :meth:`.RedisDeadLetters.delete_dead_letters`."""
        return await self.dead_letter_box.delete_dead_letters(task_ids)

    # ---------------------------------------------------------------- registry
    async def known_queues(self) -> list[str]:
        """See :meth:`.RedisRegistry.known_queues`."""
        return await self.registry.known_queues()

    async def remember_queues(self, queues: Sequence[str]) -> None:
        """See :meth:`.RedisRegistry.remember_queues`."""
        await self.registry.remember_queues(queues)

    async def register_worker(self, worker_id: str, info: bytes, ttl: float) -> None:
        """See :meth:`.RedisRegistry.register_worker`."""
        await self.registry.register_worker(worker_id, info, ttl)

    async def unregister_worker(self, worker_id: str) -> None:
        """See :meth:`.RedisRegistry.unregister_worker`."""
        await self.registry.unregister_worker(worker_id)

    async def workers(self) -> dict[str, bytes]:
        """See :meth:`.RedisRegistry.workers`."""
        return await self.registry.workers()

    async def lapsed_workers(self, limit: int = 100) -> dict[str, bytes]:
        """See :meth:`.RedisRegistry.lapsed_workers`."""
        return await self.registry.lapsed_workers(limit)

    async def set_paused(self, queue: str, paused: bool) -> bool:
        """See :meth:`.RedisRegistry.set_paused`."""
        return await self.registry.set_paused(queue, paused)

    async def paused_queues(self) -> set[str]:
        """See :meth:`.RedisRegistry.paused_queues`."""
        return await self.registry.paused_queues()

    async def request_shutdown(self, worker_id: str) -> None:
        """See :meth:`.RedisRegistry.request_shutdown`."""
        await self.registry.request_shutdown(worker_id)

    async def request_resize(self, worker_id: str, concurrency: int) -> None:
        """See :meth:`.RedisRegistry.request_resize`."""
        await self.registry.request_resize(worker_id, concurrency)

    async def take_resize(self, worker_id: str) -> int | None:
        """See :meth:`.RedisRegistry.take_resize`."""
        return await self.registry.take_resize(worker_id)

    async def counters(self) -> dict[str, int]:
        """See :meth:`.RedisRegistry.counters`."""
        return await self.registry.counters()

    async def memory_policy(self) -> tuple[str, int] | None:
        """See :meth:`.RedisRegistry.memory_policy`."""
        return await self.registry.memory_policy()

    # -------------------------------------------------------------- operations
    async def runtime_periodic(self) -> dict[str, bytes]:
        """See :meth:`.RedisOperatorState.runtime_periodic`."""
        return await self.operations.runtime_periodic()

    async def set_runtime_periodic(self, name: str, definition: bytes) -> None:
        """See :meth:`.RedisOperatorState.set_runtime_periodic`."""
        await self.operations.set_runtime_periodic(name, definition)

    async def remove_runtime_periodic(self, name: str) -> bool:
        """See :meth:`.RedisOperatorState.remove_runtime_periodic`."""
        return await self.operations.remove_runtime_periodic(name)

    async def set_scale(self, minimum: int, maximum: int, group: str | None = None) -> None:
        """See :meth:`.RedisOperatorState.set_scale`."""
        await self.operations.set_scale(minimum, maximum, group)

    async def clear_scale(self, group: str | None = None) -> bool:
        """See :meth:`.RedisOperatorState.clear_scale`."""
        return await self.operations.clear_scale(group)

    async def scale(self, group: str | None = None) -> tuple[int, int, float] | None:
        """See :meth:`.RedisOperatorState.scale`."""
        return await self.operations.scale(group)

    async def setpoint(self, group: str | None = None) -> dict[str, str] | None:
        """See :meth:`.RedisOperatorState.setpoint`."""
        return await self.operations.setpoint(group)

    async def publish_supervisor(self, supervisor_id: str, status: bytes, ttl: float) -> None:
        """See :meth:`.RedisOperatorState.publish_supervisor`."""
        await self.operations.publish_supervisor(supervisor_id, status, ttl)

    async def unpublish_supervisor(self, supervisor_id: str) -> None:
        """See :meth:`.RedisOperatorState.unpublish_supervisor`."""
        await self.operations.unpublish_supervisor(supervisor_id)

    async def supervisors(self) -> dict[str, bytes]:
        """See :meth:`.RedisOperatorState.supervisors`."""
        return await self.operations.supervisors()

    async def server_info(self) -> dict[str, str]:
        """See :meth:`.RedisOperatorState.server_info`."""
        return await self.operations.server_info()

    # --------------------------------------------------------------- lifecycle
    async def ping(self) -> None:
        """Raise BrokerError unless the server answers PING."""
        await self.conn.ping()

    async def close(self) -> None:
        """Close the shared connection (see :meth:`.RedisConnection.close`)."""
        await self.conn.close()

    # ------------------------------------------------------------------ browse
    async def ended_tasks(
        self, queues: Sequence[str], before: float | None, after: float | None, limit: int
    ) -> list[tuple[float, str, str]]:
        """See :meth:`.RedisBrowse.ended_tasks`."""
        return await self.browse.ended_tasks(queues, before, after, limit)

    async def add_ended(
        self, queue: str, members: Sequence[str], now: float, cap: int, ttl: int
    ) -> None:
        """See :meth:`.RedisBrowse.add_ended`."""
        await self.browse.add_ended(queue, members, now, cap, ttl)

    async def scheduled_tasks(
        self, after: float | None, limit: int
    ) -> list[tuple[float, str, bytes]]:
        """See :meth:`.RedisBrowse.scheduled_tasks`."""
        return await self.browse.scheduled_tasks(after, limit)

    async def waiting_messages(self, queue: str, offset: int, limit: int) -> list[bytes]:
        """See :meth:`.RedisBrowse.waiting_messages`."""
        return await self.browse.waiting_messages(queue, offset, limit)

    async def add_sample(
        self, slot: int, counts: Mapping[str, int], gauges: Mapping[str, int], ttl: int
    ) -> None:
        """See :meth:`.RedisBrowse.add_sample`."""
        await self.browse.add_sample(slot, counts, gauges, ttl)

    async def samples(self, slots: Sequence[int]) -> list[dict[str, int]]:
        """See :meth:`.RedisBrowse.samples`."""
        return await self.browse.samples(slots)

    async def paused_periodic(self) -> set[str]:
        """See :meth:`.RedisBrowse.paused_periodic`."""
        return await self.browse.paused_periodic()

    async def set_periodic_paused(self, name: str, paused: bool) -> bool:
        """See :meth:`.RedisBrowse.set_periodic_paused`."""
        return await self.browse.set_periodic_paused(name, paused)
