"""The outbox relay: how a state store's writes into queues reach a foreign transport.

A state store writes messages into queues itself, atomically with its state changes: due
delays and retries (:meth:`~blitzq.broker.state.ScheduleState.promote_due`), requeues and the
``Publish`` / ``WorkflowStep`` / chord effects of a completion, dead-letter replays and
periodic claims. Paired with its own transport (fused: the Redis store and a Redis transport
on one connection) those writes *are* publishes. Paired with a transport it does not ack
(:meth:`~blitzq.broker.state.StateStore.acks` is ``False``: RabbitMQ, or a Redis transport on
another connection) they would land where that transport never reads.

Such a store is made with an :class:`Outbox`
(:attr:`~blitzq.broker.state.StateStore.outbox`, e.g. ``RedisStateStore(conn,
outbox=True)``): it writes those messages into per-queue outbox lists, in the same atomic
step as before, and a :class:`Relay` moves them to :meth:`Transport.publish
<blitzq.broker.transport.Transport.publish>`:

1. **take** -- atomically move a batch from the head of one queue's outbox to the relay's own
   taken list, with a lease (:meth:`Outbox.take`);
2. **publish** -- hand the batch to the transport, which returns once it has it (a RabbitMQ
   transport: publisher confirms);
3. **release** -- delete the taken list (:meth:`Outbox.release`).

A relay that dies between 1 and 3 leaves its batch taken; once its lease lapses any relay
puts the batch back at the head of its outbox (:meth:`Outbox.restore`) and it is published
again. Delivery through the relay is therefore **at-least-once**: a message is never lost
between the store and the transport, and is published twice when a relay published a batch
and died (or its lease lapsed) before releasing it, or when a publish failed after the
transport took part of the batch. A relay whose publish fails keeps its batch and publishes
it first on its next pass.

Who relays, so that users do nothing (:class:`~blitzq.broker.Broker` wires it):

- the facade, right after an operation that wrote into queues -- ``promote_due`` (something
  moved), ``claim_periodic`` (claimed), ``replay_dead_letter`` (replayed) and ``complete`` (a
  requeue or a publishing effect) -- through :meth:`Relay.pushed`: when a relay loop runs in
  this process (a worker) it is woken, otherwise (a producer, the scheduler, the CLI) the
  queues are relayed inline, and a failure there is logged, not raised (the messages wait in
  the outbox for a worker);
- every worker runs :meth:`Relay.run` as a background loop: it relays what this process
  pushed as soon as it is woken, and every :data:`SWEEP` seconds every queue with messages in
  its outbox (what a process that died before relaying left behind) and the batches of relays
  whose lease lapsed; while its sweeps find nothing the wait between them doubles, up to
  :data:`SWEEP_IDLE` seconds (an idle worker's relay costs a few commands per 10 s).

A relay whose own wait came back late by a quarter of the lease or more (this process, or its
whole host, was paused: :class:`~blitzq.stall_clock.StallClock`) puts back no other relay's
batch in the sweep right after: relays paused with it were most likely publishing, and finish
and release their batches at once when they resume. The next sweep, :data:`SWEEP` later,
puts back what is still lapsed.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterable, Sequence

from ..exceptions import BrokerError
from ..log_episodes import Episode
from ..stall_clock import StallClock
from .transport import Transport

logger = logging.getLogger("blitzq.broker")

#: Seconds between two sweeps of a relay loop (every queue's outbox, lapsed leases) after
#: a sweep that found something to do; each sweep that finds nothing doubles the wait, up to
#: :data:`SWEEP_IDLE` (an idle worker sweeps about every 10 s).
SWEEP = 1.0
SWEEP_IDLE = 10.0
#: Messages a relay takes per batch (one publish call).
BATCH = 500
#: Seconds a relay's lease on its taken batch lasts (renewed by each take).
LEASE = 60.0
#: Seconds a relay loop waits after a failed pass (doubling up to :data:`RETRY_MAX`).
RETRY_MIN = 0.5
RETRY_MAX = 10.0


class Outbox(abc.ABC):
    """The store side of a relay: messages a state store wrote into queues for a transport it
    does not feed, and the batches relays have taken from them.

    Every method is a coroutine that raises :class:`~blitzq.exceptions.BrokerError` when the
    store cannot be reached.
    """

    @abc.abstractmethod
    async def take(
        self, relay: str, queue: str, count: int, lease: float
    ) -> tuple[str, list[bytes]] | None:
        """Atomically move up to ``count`` messages from the head of ``queue``'s outbox to
        the batch held by relay ``relay``, leased for ``lease`` seconds.

        A batch the relay took before and has not released is returned again instead
        (whatever its queue), with its lease renewed.

        Returns:
            ``(queue, messages)`` of the batch, or ``None`` when nothing was taken.
        """

    @abc.abstractmethod
    async def release(self, relay: str) -> None:
        """Forget the batch held by ``relay`` (it was published) and its lease."""

    @abc.abstractmethod
    async def pending(self) -> list[str]:
        """Queues whose outbox may hold messages."""

    @abc.abstractmethod
    async def restore(self, count: int) -> int:
        """Put the batches of up to ``count`` relays whose lease lapsed back at the head of
        their outboxes, in order; return how many messages were put back."""

    @abc.abstractmethod
    async def waiting(self, queues: Sequence[str]) -> dict[str, int]:
        """Messages in the outbox of each of ``queues`` (not counting taken batches)."""

    @abc.abstractmethod
    async def purge(self, queue: str) -> int:
        """Delete the messages in ``queue``'s outbox (not a batch a relay has taken);
        return how many."""


class Relay:
    """Moves an :class:`Outbox`'s messages to a transport, at-least-once (module docstring).

    Args:
        outbox: the state store's outbox.
        transport: the transport to publish to.
        batch: messages per take (one publish call), 1 to 1000.
        lease: seconds a taken batch stays this relay's before another relay may put it back;
            longer than any publish of one batch takes.

    Attributes:
        id: this relay's id (random: one per broker, so per process and event loop).
        relayed: messages published so far.

    Raises:
        ValueError: ``batch`` or ``lease`` out of range.
    """

    def __init__(
        self, outbox: Outbox, transport: Transport, *, batch: int = BATCH, lease: float = LEASE
    ) -> None:
        if not 1 <= batch <= 1000:
            raise ValueError(f"batch must be 1 to 1000 messages, got {batch!r}")
        if not lease > 0:
            raise ValueError(f"lease must be a positive number of seconds, got {lease!r}")
        self.outbox = outbox
        self.transport = transport
        self.batch = batch
        self.lease = lease
        self.id = uuid.uuid4().hex
        self.relayed = 0
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._wanted: set[str] = set()
        self._everything = False
        self._loops = 0
        #: Failed passes of :meth:`run`, logged once while the failure lasts.
        self.failures = Episode(logger, "outbox relay")

    async def drain(self, queues: Iterable[str] | None = None) -> int:
        """Relay every message waiting in the outbox of ``queues`` (``None``: of every queue
        whose outbox holds messages), until those outboxes are empty.

        One pass at a time per relay (a lock): the taken batch is this relay's.

        Returns:
            How many messages were published.

        Raises:
            BrokerError: the store or the transport failed; a batch taken and not published
                is published first by this relay's next pass (or restored by another relay
                once the lease lapses).
        """
        async with self._lock:
            names = await self.outbox.pending() if queues is None else list(queues)
            moved = 0
            for queue in names:
                while True:
                    taken = await self.outbox.take(self.id, queue, self.batch, self.lease)
                    if taken is None:
                        break
                    target, messages = taken
                    await self.transport.publish(target, messages)
                    await self.outbox.release(self.id)
                    moved += len(messages)
                    self.relayed += len(messages)
                    if target == queue and len(messages) < self.batch:
                        break
            return moved

    async def pushed(self, queues: Iterable[str] | None = None) -> None:
        """The store just wrote into the outbox of ``queues`` (``None``: unknown queues).

        With a relay loop running in this process (:meth:`run`, a worker) the loop is woken
        and relays them; otherwise they are relayed now. A failure is logged, never raised:
        the write that preceded it is committed, and the messages wait in the outbox (and
        this relay's taken batch) for the next pass of any relay.
        """
        if self._loops:
            if queues is None:
                self._everything = True
            else:
                self._wanted.update(queues)
            self._wake.set()
            return
        try:
            await self.drain(queues)
        except BrokerError as exc:
            logger.warning("outbox relay: %s; a worker's relay will publish the rest", exc)

    async def run(self) -> None:
        """Relay for good (a worker's background loop; cancel it to stop).

        Woken by :meth:`pushed`, it relays the queues named there; every :data:`SWEEP`
        seconds it also puts back the batches of relays whose lease lapsed and relays every
        queue whose outbox holds messages, less often while those sweeps find nothing (the
        wait doubles up to :data:`SWEEP_IDLE`; a sweep that finds work, or a wake-up with
        queues to relay, brings it back to :data:`SWEEP`). A failed pass is logged and tried
        again after a backoff (:data:`RETRY_MIN` doubling to :data:`RETRY_MAX`).
        """
        self._loops += 1
        try:
            loop = asyncio.get_running_loop()
            next_sweep = 0.0
            interval = SWEEP  # doubled by each sweep that found nothing (SWEEP_IDLE at most)
            backoff = RETRY_MIN
            stall = StallClock(self.lease / 4)
            restore_from = 0.0  # loop time before which lapsed batches stay (after a pause)
            while True:
                self._wake.clear()
                sweep = loop.time() >= next_sweep or self._everything
                wanted, self._wanted, self._everything = self._wanted, set(), False
                try:
                    if sweep:
                        next_sweep = loop.time() + interval
                        paused = loop.time() < restore_from
                        restored = 0 if paused else await self.outbox.restore(100)
                        if restored:
                            logger.warning(
                                "outbox relay: put back %d message(s) of relays whose lease "
                                "lapsed (published again unless the hand-off is idempotent)",
                                restored,
                            )
                        found = await self.drain() + restored
                        interval = SWEEP if found or paused else min(interval * 2, SWEEP_IDLE)
                    elif wanted:
                        await self.drain(sorted(wanted))
                        interval = SWEEP
                        next_sweep = min(next_sweep, loop.time() + SWEEP)
                    backoff = RETRY_MIN
                    self.failures.cleared()
                except BrokerError as exc:  # tried again after the backoff
                    self.failures.failed(exc)
                    self._wanted |= wanted
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, RETRY_MAX)
                    continue
                except Exception:  # a bug must not stop the relay for good
                    logger.exception("outbox relay pass failed")
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, RETRY_MAX)
                    continue
                if self._wake.is_set():
                    continue
                timeout = max(0.0, next_sweep - loop.time())
                stall.expect(timeout)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=timeout)
                if stall.stalled():  # paused: other relays get a sweep's time to release
                    restore_from = loop.time() + SWEEP
        finally:
            self._loops -= 1


__all__ = ["BATCH", "LEASE", "SWEEP", "SWEEP_IDLE", "Outbox", "Relay"]
