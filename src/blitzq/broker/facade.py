"""The broker facade: one :class:`Transport` and one :class:`StateStore`, composed.

:class:`Broker` is the one object the queue, workers, scheduler and CLI call. It holds a
transport (how messages travel and are leased), a state store (everything else, and the
atomic completion), the :class:`~blitzq.broker.pairing.Pairing` that joins a completion's
writes with its ack, and the store's :class:`~blitzq.broker.state.DeadLetterLimits`; it
delegates each method to the one that owns it, explicitly: a method here is the transport's,
or the method of the same name and signature of the state role that owns it
(``self.state.records``, ``.scheduling``, ``.dead_letter_box``, ``.control``,
``.registry``: one call deep, the store forwards nothing). Calls of one role that only the
operator tools or one component make (the operations and browse roles: run-time periodic
entries, the autoscale setpoint, supervisor status, server facts, what the dashboard lists;
task liveness: ``trace_task``, ``keep_running``, ``cancel_mark``) are not repeated here:
their callers use the role object (``broker.state.operations.set_scale(...)``), so a new call
of that kind is written in its role alone. The few calls that combine both halves are its
own (``prepare_consumer``, ``queue_stats``, ``purge_queue``, and the relay after
``promote_due``, ``claim_periodic`` and ``replay_dead_letter``).

:class:`Broker` is never subclassed (``typing.final``): a backend's differences are the
objects it is composed of, not overrides. The named brokers (``ReliableRedisBroker``,
``FastRedisBroker``, ``SpreadRedisBroker``, ``AmqpBroker``, ...) are factory functions that
make the parts and return ``Broker(transport, state, pairing, dead_letter_limits=...)``.

The hot paths are not wrapped: ``publish``, ``fetch`` and ``fetch_first`` are the transport's
own bound methods, and ``complete`` is the pairing's (the state store's own for a fused pair)
-- set on the instance when it is made -- so a call costs what the backend's method costs,
with no frame in between.

Pairing (:mod:`blitzq.broker.pairing`, chosen once at composition). When the state store
acknowledges the transport's deliveries in the same atomic step as its writes
(:meth:`StateStore.acks`: the Redis state store with a Redis transport on the same
connection, where ``complete.lua`` XACKs the stream entry with the record write and fences on
its lease), ``complete`` is the store's (``Fused``). Otherwise (a RabbitMQ transport with the
Redis state store) ``complete`` applies the completions in the store, then acks the
deliveries whose completion was applied on the transport (``CommitThenAck``):
at-least-once, see :meth:`StateStore.complete` for what ``token`` and fencing mean then.
Such a store was made with an outbox (:attr:`StateStore.outbox`) and :attr:`Broker.relay`
publishes what it writes into queues on the transport (:mod:`blitzq.broker.outbox`): right
after the facade's own ``promote_due``, ``claim_periodic``, ``replay_dead_letter`` and
``complete``, and in every worker's relay loop.

Every pairing passes the contract suite (``tests/contract/``) unchanged; docs/architecture.md
("Adding a broker") says which half a new backend implements.
"""

from __future__ import annotations

from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    Sequence,
)
from typing import Any, Protocol, final

from .outbox import Relay
from .pairing import CompleteFn, Pairing, pairing_for
from .state import DeadLetterFields, DeadLetterLimits, Scheduled, StateStore, UniqueSend
from .transport import Delivery, Guarantee, Transport
from .values import Completion

#: Appends encoded messages to a queue (see :meth:`Transport.publish`).
PublishFn = Callable[[str, Sequence[bytes]], Awaitable[None]]
#: Takes up to ``count`` messages of one queue (see :meth:`Transport.fetch`).
FetchFn = Callable[[str, int, float], Awaitable[list[Delivery]]]


class FetchFirstFn(Protocol):
    """Takes up to ``count`` messages from the first of ``queues`` that has any (see
    :meth:`Transport.fetch_first`)."""

    def __call__(
        self, queues: Sequence[str], count: int, timeout: float, *, look_first: bool = True
    ) -> Awaitable[list[Delivery]]:
        """See :meth:`Transport.fetch_first`."""
        ...


#: Applies a batch of completions and takes up to ``count`` messages from the first of
#: ``queues`` that has any, without blocking, in one round trip; calls its last argument
#: once with the stale completions, or ``None`` when they are not known to be applied (see
#: :attr:`Broker.carry`).
CarryFn = Callable[
    [Sequence[str], int, Sequence[Completion], Callable[[list[Completion] | None], None]],
    Awaitable[list[Delivery]],
]


@final
class Broker:
    """A transport and a state store behind one object (see the module docstring).

    Args:
        transport: delivers the messages (publish, fetch, ack, leases).
        state: keeps everything else and applies completions atomically.
        pairing: how a completion's writes and its ack are joined
            (:mod:`blitzq.broker.pairing`); ``None``: chosen by
            :func:`~blitzq.broker.pairing.pairing_for`.
        dead_letter_limits: the store's dead-letter bounds, settable while the broker runs
            (``None``: the store has none to set).

    Attributes:
        transport: the transport given.
        state: the state store given.
        guarantee: the transport's :class:`Guarantee` (an instance attribute: a deployment
            may weaken it, as ``memory://`` does to ``EPHEMERAL``).
        supports_recovery: whether abandoned deliveries can be recovered (leases).
        count_note: what :meth:`queue_stats`' ``waiting`` counts when it is not tasks
            (RabbitMQ: a ready pack of tasks counts once); ``None``: tasks.
        pairing: the :class:`~blitzq.broker.pairing.Pairing` chosen.
        relay: the pairing's :class:`~blitzq.broker.outbox.Relay` from the store's outbox to
            the transport (a store that does not ack its deliveries); ``None`` for a fused
            pair.
        dead_letter_limits: the :class:`~blitzq.broker.state.DeadLetterLimits` given.
    """

    publish: PublishFn
    """Append encoded messages to a queue: the transport's own :meth:`Transport.publish`."""
    fetch: FetchFn
    """Take messages from one queue: the transport's own :meth:`Transport.fetch`."""
    fetch_first: FetchFirstFn
    """Take messages from the first queue that has any: the transport's own
    :meth:`Transport.fetch_first`."""
    complete: CompleteFn
    """Apply a batch of completions and ack their deliveries; return the stale ones (not
    applied). The pairing's (:attr:`pairing`): the store's own ``complete`` when it acks the
    transport's deliveries (:meth:`StateStore.acks`), else commit in the store, then ack on
    the transport (:class:`~blitzq.broker.pairing.CommitThenAck`). See
    :meth:`StateStore.complete` for fencing and what ``token`` means."""

    fast_lane: Transport | None = None
    """An at-most-once transport beside the main one, for the tasks declared
    ``@queue.task(mode="fast")`` of a reliable Queue (:meth:`add_fast_lane`); ``None``: the
    broker has none, and such tasks travel the main transport."""

    carry: CarryFn | None = None
    """Completions and a non-blocking fetch in one round trip (fast mode on one server:
    ``broker/redis/carrying.py``), which the worker's fetch loops use to send the flusher's
    waiting batch with their next fetch; ``None``: the broker has none."""

    task_ids: Callable[[str], str] | None = None
    """Makes the id of a task sent to a physical queue when the caller chose none; ``None``:
    :func:`~blitzq.routing.new_task_id` (24 characters, 120 random bits). The spread layout
    of a Redis Cluster homes ids on their queue's slot
    (:func:`~blitzq.broker.redis.homes.homed_id`)."""

    def __init__(
        self,
        transport: Transport,
        state: StateStore,
        pairing: Pairing | None = None,
        *,
        dead_letter_limits: DeadLetterLimits | None = None,
    ) -> None:
        self.transport = transport
        self.state = state
        self.guarantee: Guarantee = transport.guarantee
        self.supports_recovery: bool = transport.supports_recovery
        self.count_note: str | None = transport.count_note
        # The hot paths: the components' bound methods themselves, one call deep.
        self.publish = transport.publish
        #: Publish the messages of a fast-declared task: :attr:`fast_lane`'s, else the main
        #: transport's ``publish``.
        self.publish_fast: PublishFn = transport.publish
        self.fetch = transport.fetch
        self.fetch_first = transport.fetch_first
        self.result_token: Callable[[], object | None] = state.records.result_token
        self.pairing = pairing_for(transport, state) if pairing is None else pairing
        self.complete = self.pairing.complete
        self.relay: Relay | None = self.pairing.relay
        self.dead_letter_limits = dead_letter_limits

    def add_fast_lane(self, lane: Transport) -> None:
        """Give the broker an at-most-once ``lane`` for fast-declared tasks: their messages
        are published there (:attr:`publish_fast`) and workers fetch from it too. The lane
        shares the broker's connection and state store; it is never closed on its own."""
        self.fast_lane = lane
        self.publish_fast = lane.publish

    # ============================================================ transport
    async def prepare_consumer(self, queues: Sequence[str], consumer: str) -> None:
        """:meth:`Transport.prepare_consumer`, then :meth:`RegistryState.remember_queues`."""
        await self.transport.prepare_consumer(queues, consumer)
        await self.state.registry.remember_queues(queues)

    async def heartbeat(self, queue: str, tokens: Sequence[bytes]) -> int:
        """See :meth:`Transport.heartbeat`."""
        return await self.transport.heartbeat(queue, tokens)

    async def recover(
        self,
        queue: str,
        min_idle: float,
        count: int,
        max_deliveries: int,
        record_ttl: int = 86400,
        holders: Mapping[str, float] | None = None,
    ) -> tuple[int, int]:
        """See :meth:`Transport.recover`."""
        return await self.transport.recover(
            queue, min_idle, count, max_deliveries, record_ttl, holders
        )

    async def prune_consumers(self, queue: str, idle: float) -> int:
        """See :meth:`Transport.prune_consumers`."""
        return await self.transport.prune_consumers(queue, idle)

    async def wrong_type_keys(self, queues: Sequence[str]) -> dict[str, str]:
        """See :meth:`Transport.wrong_type_keys`; with a :attr:`fast_lane`, its keys too."""
        found = await self.transport.wrong_type_keys(queues)
        if self.fast_lane is not None:
            found.update(await self.fast_lane.wrong_type_keys(queues))
        return found

    def holding(self) -> dict[str, Any] | None:
        """See :meth:`Transport.holding`."""
        return self.transport.holding()

    async def queue_stats(self, queues: Sequence[str]) -> dict[str, dict[str, int]]:
        """See :meth:`Transport.queue_stats`; with a relay, ``waiting`` also counts the
        messages in each queue's outbox (not yet on the transport), and with a
        :attr:`fast_lane` those waiting on the lane."""
        stats = await self.transport.queue_stats(queues)
        if self.relay is not None and queues:
            for queue, n in (await self.relay.outbox.waiting(queues)).items():
                stats[queue]["waiting"] += n
        if self.fast_lane is not None and queues:
            for queue, lane in (await self.fast_lane.queue_stats(queues)).items():
                stats[queue]["waiting"] += lane["waiting"]
        return stats

    async def oldest_waiting(self, queues: Sequence[str]) -> dict[str, float]:
        """See :meth:`Transport.oldest_waiting`."""
        return await self.transport.oldest_waiting(queues)

    async def purge_queue(self, queue: str) -> int:
        """See :meth:`Transport.purge_queue`; with a relay, the queue's outbox too, and with
        a :attr:`fast_lane` the queue's messages there."""
        purged = await self.transport.purge_queue(queue)
        if self.relay is not None:
            purged += await self.relay.outbox.purge(queue)
        if self.fast_lane is not None:
            purged += await self.fast_lane.purge_queue(queue)
        return purged

    # ====================================================== rate, unique, lock
    async def acquire_rate(self, buckets: Sequence[tuple[str, float, float]]) -> tuple[bool, float]:
        """See :meth:`ControlState.acquire_rate`."""
        return await self.state.control.acquire_rate(buckets)

    async def claim_unique(self, items: Sequence[tuple[str, str, float]]) -> list[str | None]:
        """See :meth:`ControlState.claim_unique`."""
        return await self.state.control.claim_unique(items)

    async def enqueue_unique(self, items: Sequence[UniqueSend]) -> list[str | None]:
        """See :meth:`ControlState.enqueue_unique`; then, with a foreign transport, the
        relay of the queues whose messages the store wrote to its outbox (a duplicate
        relays nothing: the message of its holder, if still in the outbox, is the workers'
        relay loops' to publish, within a sweep).

        A message the store writes to its own queues goes through neither :attr:`publish`
        nor :attr:`publish_fast`: it is written with its claim, in the store's step.
        """
        holders = await self.state.control.enqueue_unique(items)
        if self.relay is not None:
            queues = {
                item.queue
                for item, holder in zip(items, holders, strict=True)
                if holder is None and item.delay is None and item.eta is None
            }
            if queues:
                await self.relay.pushed(sorted(queues))
        return holders

    async def acquire_lock(self, key: str, holder: str, limit: int, lease: float) -> float:
        """See :meth:`ControlState.acquire_lock`."""
        return await self.state.control.acquire_lock(key, holder, limit, lease)

    async def renew_locks(self, items: Sequence[tuple[str, str, float]]) -> int:
        """See :meth:`ControlState.renew_locks`."""
        return await self.state.control.renew_locks(items)

    # ============================================================== schedule
    async def schedule(self, items: Sequence[Scheduled]) -> None:
        """See :meth:`ScheduleState.schedule`."""
        await self.state.scheduling.schedule(items)

    async def promote_due(self, limit: int, ahead: float = 0.0) -> tuple[int, float | None, float]:
        """See :meth:`ScheduleState.promote_due`; then the relay, when something moved."""
        promoted = await self.state.scheduling.promote_due(limit, ahead)
        if promoted[0] and self.relay is not None:
            await self.relay.pushed()
        return promoted

    async def scheduled_count(self) -> int:
        """See :meth:`ScheduleState.scheduled_count`."""
        return await self.state.scheduling.scheduled_count()

    async def scheduled_for(self, queues: Sequence[str], purge: bool = False) -> int:
        """See :meth:`ScheduleState.scheduled_for`."""
        return await self.state.scheduling.scheduled_for(queues, purge)

    async def scheduled_entry(self, task_id: str) -> tuple[float, str, bytes] | None:
        """See :meth:`ScheduleState.scheduled_entry`."""
        return await self.state.scheduling.scheduled_entry(task_id)

    async def server_time(self) -> float:
        """See :meth:`ScheduleState.server_time`."""
        return await self.state.scheduling.server_time()

    async def claim_periodic(
        self, name: str, occurrence: float, message: bytes, queue: str, until: float | None = None
    ) -> bool:
        """See :meth:`ScheduleState.claim_periodic`; then the relay, when claimed."""
        claimed = await self.state.scheduling.claim_periodic(
            name, occurrence, message, queue, until
        )
        if claimed and self.relay is not None:
            await self.relay.pushed([queue])
        return claimed

    async def periodic_last(self, names: Sequence[str]) -> dict[str, float]:
        """See :meth:`ScheduleState.periodic_last`."""
        return await self.state.scheduling.periodic_last(names)

    # ========================================================== cancellation
    async def cancel(self, task_id: str, record: bytes, ttl: int, announce: bool = True) -> str:
        """See :meth:`ControlState.cancel`."""
        return await self.state.control.cancel(task_id, record, ttl, announce)

    async def announce_revoked(self, task_ids: Sequence[str]) -> None:
        """See :meth:`ControlState.announce_revoked`."""
        await self.state.control.announce_revoked(task_ids)

    async def revoked(self) -> dict[str, float]:
        """See :meth:`ControlState.revoked`."""
        return await self.state.control.revoked()

    def events(self) -> AsyncIterator[tuple[str, str]]:
        """See :meth:`ControlState.events`."""
        return self.state.control.events()

    # ============================================================= workflows
    async def workflow_state(self, workflow_id: str) -> dict[str, bytes] | None:
        """See :meth:`RecordsState.workflow_state`."""
        return await self.state.records.workflow_state(workflow_id)

    async def wait_for_workflow(self, workflow_id: str, timeout: float) -> dict[str, bytes] | None:
        """See :meth:`RecordsState.wait_for_workflow`."""
        return await self.state.records.wait_for_workflow(workflow_id, timeout)

    # ============================================================== progress
    async def set_progress(
        self,
        task_id: str,
        data: bytes,
        at: float,
        ttl: int,
        fence: tuple[str, bytes] | None = None,
    ) -> bool:
        """See :meth:`RecordsState.set_progress`."""
        return await self.state.records.set_progress(task_id, data, at, ttl, fence)

    async def get_progress(self, task_id: str) -> bytes | None:
        """See :meth:`RecordsState.get_progress`."""
        return await self.state.records.get_progress(task_id)

    def watch_progress(self, task_id: str) -> AsyncGenerator[tuple[str, bytes], None]:
        """See :meth:`RecordsState.watch_progress`."""
        return self.state.records.watch_progress(task_id)

    # =============================================================== records
    async def get_record(self, task_id: str) -> bytes | None:
        """See :meth:`RecordsState.get_record`."""
        return await self.state.records.get_record(task_id)

    async def get_records(self, task_ids: Sequence[str]) -> list[bytes | None]:
        """See :meth:`RecordsState.get_records`."""
        return await self.state.records.get_records(task_ids)

    async def count_solo_start(self, task_id: str, ttl: int) -> int:
        """See :meth:`RecordsState.count_solo_start`."""
        return await self.state.records.count_solo_start(task_id, ttl)

    async def record_ids(self, limit: int) -> tuple[list[str], bool]:
        """See :meth:`RecordsState.record_ids`."""
        return await self.state.records.record_ids(limit)

    async def set_record(self, task_id: str, record: bytes, ttl: int) -> None:
        """See :meth:`RecordsState.set_record`."""
        await self.state.records.set_record(task_id, record, ttl)

    async def reset_tasks(
        self, task_ids: Sequence[str], owners: Mapping[str, str] | None = None, ttl: int = 0
    ) -> None:
        """See :meth:`RecordsState.reset_tasks`."""
        await self.state.records.reset_tasks(task_ids, owners, ttl)

    async def wait_for_record(
        self, task_id: str, timeout: float, since: object | None = None
    ) -> bytes | None:
        """See :meth:`RecordsState.wait_for_record`."""
        return await self.state.records.wait_for_record(task_id, timeout, since)

    # ========================================================== dead letters
    async def dead_letters(self, offset: int, limit: int) -> list[tuple[str, DeadLetterFields]]:
        """See :meth:`DeadLetterState.dead_letters`."""
        return await self.state.dead_letter_box.dead_letters(offset, limit)

    async def get_dead_letter(self, task_id: str) -> DeadLetterFields | None:
        """See :meth:`DeadLetterState.get_dead_letter`."""
        return await self.state.dead_letter_box.get_dead_letter(task_id)

    async def dead_letter_count(self) -> int:
        """See :meth:`DeadLetterState.dead_letter_count`."""
        return await self.state.dead_letter_box.dead_letter_count()

    async def replay_dead_letter(
        self,
        task_id: str,
        queue: str,
        message: bytes,
        kind: str = "",
        unique: tuple[str, float] | None = None,
        failed_at: float | None = None,
    ) -> bool | str:
        """See :meth:`DeadLetterState.replay_dead_letter`; then the relay, when replayed."""
        done = await self.state.dead_letter_box.replay_dead_letter(
            task_id, queue, message, kind, unique, failed_at
        )
        if done is True and self.relay is not None:
            await self.relay.pushed([queue])
        return done

    async def purge_dead_letters(self) -> int:
        """See :meth:`DeadLetterState.purge_dead_letters`."""
        return await self.state.dead_letter_box.purge_dead_letters()

    async def delete_dead_letters(self, task_ids: Sequence[str]) -> int:
        """See :meth:`DeadLetterState.delete_dead_letters`."""
        return await self.state.dead_letter_box.delete_dead_letters(task_ids)

    # ============================================================ inspection
    async def known_queues(self) -> list[str]:
        """See :meth:`RegistryState.known_queues`."""
        return await self.state.registry.known_queues()

    async def remember_queues(self, queues: Sequence[str]) -> None:
        """See :meth:`RegistryState.remember_queues`."""
        await self.state.registry.remember_queues(queues)

    async def register_worker(
        self,
        worker_id: str,
        info: bytes,
        ttl: float,
        counts: tuple[int, int] = (0, 0),
        base: tuple[int, int] = (0, 0),
        visibility_timeout: float | None = None,
        queues: Sequence[str] = (),
    ) -> None:
        """See :meth:`RegistryState.register_worker`."""
        await self.state.registry.register_worker(
            worker_id, info, ttl, counts, base, visibility_timeout, queues
        )

    async def unregister_worker(self, worker_id: str, counts: tuple[int, int] = (0, 0)) -> None:
        """See :meth:`RegistryState.unregister_worker`."""
        await self.state.registry.unregister_worker(worker_id, counts)

    async def workers(self) -> dict[str, bytes]:
        """See :meth:`RegistryState.workers`."""
        return await self.state.registry.workers()

    async def lapsed_workers(self, limit: int = 100) -> dict[str, bytes]:
        """See :meth:`RegistryState.lapsed_workers`."""
        return await self.state.registry.lapsed_workers(limit)

    async def worker_timeouts(self, above: float) -> dict[str, float]:
        """See :meth:`RegistryState.worker_timeouts`."""
        return await self.state.registry.worker_timeouts(above)

    async def set_paused(self, queue: str, paused: bool) -> bool:
        """See :meth:`RegistryState.set_paused`."""
        return await self.state.registry.set_paused(queue, paused)

    async def paused_queues(self) -> set[str]:
        """See :meth:`RegistryState.paused_queues`."""
        return await self.state.registry.paused_queues()

    async def request_shutdown(self, worker_id: str) -> None:
        """See :meth:`RegistryState.request_shutdown`."""
        await self.state.registry.request_shutdown(worker_id)

    async def request_resize(self, worker_id: str, concurrency: int) -> None:
        """See :meth:`RegistryState.request_resize`."""
        await self.state.registry.request_resize(worker_id, concurrency)

    async def take_resize(self, worker_id: str) -> int | None:
        """See :meth:`RegistryState.take_resize`."""
        return await self.state.registry.take_resize(worker_id)

    async def counters(self) -> dict[str, int]:
        """See :meth:`RegistryState.counters`."""
        return await self.state.registry.counters()

    async def memory_policy(self) -> tuple[str, int] | None:
        """See :meth:`RegistryState.memory_policy`."""
        return await self.state.registry.memory_policy()

    async def memory_use(self) -> tuple[int, int] | None:
        """See :meth:`RegistryState.memory_use`."""
        return await self.state.registry.memory_use()

    # ============================================================ lifecycle
    async def ping(self) -> None:
        """Check that the transport and the state store answer.

        Raises:
            BrokerError: either could not be reached.
        """
        await self.transport.ping()
        await self.state.ping()

    async def close(self) -> None:
        """Close the transport, then the state store (both may be used again afterwards:
        they reconnect)."""
        try:
            await self.transport.close()
        finally:
            await self.state.close()
