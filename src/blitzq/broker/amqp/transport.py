"""The RabbitMQ transport: quorum queues, publisher confirms, manual acks (at-least-once).

:class:`AmqpTransport` is a :class:`~blitzq.broker.transport.Transport` on RabbitMQ through
aio-pika, paired with the Redis state store (``broker.py``). How it meets the contract:

- **publish**: every message is published persistent and ``mandatory`` on a channel in
  publisher-confirm mode, the batch in flight at once; the call returns once RabbitMQ
  confirmed every message. A ``basic.nack``, a ``basic.return`` (no such queue) or a lost
  channel raises :class:`~blitzq.exceptions.BrokerError`: a publish is never lost silently.
- **packs**: a publish of many messages to one queue travels as several tasks per AMQP
  message (``packs.py``); each task of a received pack is a delivery of its own, the message
  acked once every one of them is settled; a pack delivered again is split
  (``redelivered.py``).
- **fetch**: one consumer (``basic.consume``, manual ack) per consumed queue, on a channel of
  its own whose prefetch (``basic.qos``) is the ``count`` of the first fetch -- the worker's
  free slots when it starts, i.e. its concurrency -- unless ``prefetch`` is given. What the
  consumer received waits in a local buffer (taken off aiormq's frame queue as read,
  ``tap.py``); a consumer's first fetch tops it up with ``basic.get`` (a message published
  before it is seen at once, in priority order), later ones only when nothing is buffered
  (see :meth:`AmqpTransport._take_first`). ``fetch_first``
  drains the levels in order and, when all are empty, waits on all of them at once: a
  message on any level, or the connection closing, wakes it. ``Delivery.token`` is
  ``<instance>.<epoch>.<channel>.<delivery tag>`` (the instance drawn by each transport: two
  processes' custody entries never share a name; a task of a pack adds ``.<n>``, a counter
  of the transport's: the tasks of a pack share its delivery tag), then ``/<digest>``, a
  digest of the message's body that names its copy for fencing (``redelivered.py``);
  ``deliveries`` is the quorum queue's ``x-delivery-count`` + 1 (+ the deliveries before a
  custody recovery, ``custody.py``), counting for a redelivery only the returns of messages
  a worker took (``redelivered.py``).
- **ack / nack**: ``basic.ack`` of the held delivery (a token whose connection closed since
  is skipped: RabbitMQ redelivers that message); ``nack`` (a hand-back) publishes the message
  again, confirmed, then acks it, so the quorum queue's delivery count is not spent.
- **reconnects**: the next fetch re-opens a closed connection (``channels.py``) or channel.
- **pause**: a paused queue's consumer is cancelled and what it received handed back
  (``pausing.py``); fetches skip the queue until :meth:`AmqpTransport.resume`.
- **long tasks**: a delivery held longer than the visibility timeout is handed to the state
  store's custody (``custody.py``), so RabbitMQ's ``consumer_timeout`` never fires on it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiormq.abc import DeliveredMessage

from ..factory import amqp_pack
from ..transport import Delivery, Guarantee, Transport
from . import inspection
from .channels import FAILURES, AmqpLink, delivery_count, guarded, translate
from .deliveries import Consumer, Held, Received
from .injected import Borrowed
from .liveness import Mark
from .packs import DEFAULT_MAX_PACK, PACK_HEADER, VERSION, pack_size, packed
from .pausing import stop_consuming
from .publishing import marked, publish_confirmed
from .redelivered import copy_digest, skip_committed, split_pack
from .settling import ack_held, nack_held
from .tap import tap

if TYPE_CHECKING:
    from .custody import Custody

logger = logging.getLogger("blitzq.broker.amqp")

#: Seconds to wait for a channel to close.
CLOSE_TIMEOUT = 5.0
#: A consumer's prefetch is this many times the worker's free slots at its first fetch
#: (unless ``prefetch`` is given): the next messages are already here when slots free up,
#: instead of one round trip (ack, then delivery) behind.
PREFETCH_FACTOR = 2
#: AMQP headers of a pack (:mod:`.packs`).
_PACK_HEADERS = {PACK_HEADER: VERSION}


async def _close_quietly(consumer: Consumer) -> None:
    """Close ``consumer``'s channel (what it held goes back to its queue, if any)."""
    try:
        await asyncio.wait_for(consumer.channel.close(), CLOSE_TIMEOUT)
    except Exception as exc:  # closing already, or the connection is gone
        logger.debug("closing the channel of %s: %s", consumer.name, exc)


class AmqpTransport(Transport):
    """At-least-once delivery on RabbitMQ quorum queues (see the module docstring).

    Args:
        url: ``amqp://user:password@host:port/vhost`` (``amqps://`` for TLS).
        namespace: prefix of the queue names (``<namespace>.<queue>``).
        max_deliveries: deliveries of one message before it is dead-lettered (the queues'
            ``x-delivery-limit`` is one less: RabbitMQ counts returns).
        prefetch: unacked messages RabbitMQ sends each consumer ahead; ``None``: the
            ``count`` of the first fetch of that queue (a worker's free slots).
        custody: the state store's custody of long-held deliveries (``custody.py``); without
            it nothing is handed over and :meth:`recover` only reports ``(0, 0)``.
        heartbeat: AMQP heartbeat timeout, seconds (``None``: 60; ``?heartbeat=`` wins).
        borrowed: the application's connection or pool to publish on instead of one of the
            transport's own (``Queue(amqp_connection=...)``, :mod:`.injected`; producers
            only).
        max_pack: tasks per AMQP message at most in a bulk publish (:mod:`.packs`; 1: no
            packs); ``None``: the URL's ``?pack=``, else :data:`.packs.DEFAULT_MAX_PACK`.

    Raises:
        ConfigurationError: a ``?pack=`` in ``url`` that is not an integer in 1-1000.
    """

    guarantee = Guarantee.AT_LEAST_ONCE
    supports_recovery = True
    recovers_on_silence = True  # missed heartbeats: RabbitMQ redelivers to other workers
    hands_back = True  # nack: republish with confirms, then ack (no delivery spent)
    fenced_by_takes = True  # redeliveries noted as takes; completions fenced on them
    count_note = inspection.COUNT_NOTE  # a ready pack counts once in waiting

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        max_deliveries: int = 5,
        prefetch: int | None = None,
        custody: Custody | None = None,
        heartbeat: int | None = None,
        borrowed: Borrowed | None = None,
        max_pack: int | None = None,
    ) -> None:
        self.link = AmqpLink(url, namespace, max_deliveries, heartbeat, borrowed)
        if max_pack is None:
            max_pack = amqp_pack(url) or DEFAULT_MAX_PACK
        self.max_pack = max_pack
        self._parts = itertools.count()  # a pack's tasks share a delivery tag: told apart
        self.prefetch = prefetch
        self.custody = custody
        self.held: dict[bytes, Held] = {}
        self._instance = os.urandom(6).hex().encode()  # tokens name shared custody entries
        self.mark = Mark()  # told in the registration: is this connection open (liveness.py)
        self.consumers: dict[str, Consumer] = {}  # by physical queue
        self.paused: set[str] = set()  # physical queues not consumed (pause())
        self._waiters: set[asyncio.Event] = set()  # one per fetch waiting for a message
        self._idle_wait: asyncio.Event | None = None  # the block_first in flight (unblock)
        self._unblocked = False
        self._scanned = False  # occupied() answered every queue once
        self.link.listeners.append(self._wake)  # a closed connection: reconnect at once

    # --------------------------------------------------------------- publish
    async def publish(self, queue: str, messages: Sequence[bytes]) -> None:
        """Publish ``messages`` to ``queue`` and wait for RabbitMQ's confirms. A publish of
        many messages (``2 * packs.SPREAD`` or more) travels in packs of up to ``max_pack``
        of them per AMQP message (:mod:`.packs`); fewer, one AMQP message each.

        Raises:
            BrokerError: a message was not confirmed (nacked, returned, channel lost, or no
                confirm in :data:`.publishing.CONFIRM_TIMEOUT` s; then its outcome is
                unknown, as it says).
            ConfigurationError: the queue exists with other arguments.
        """
        size = pack_size(len(messages), self.max_pack)
        if size > 1:
            await self._publish_packed(queue, packed(messages, size))
        else:
            await self.publish_with(queue, messages, 0)

    @guarded
    async def _publish_packed(self, queue: str, packs: Sequence[bytes]) -> None:
        """Publish pack bodies (:mod:`.packs`) to ``queue``, marked as packs."""
        await publish_confirmed(self.link, queue, packs, _PACK_HEADERS)

    @guarded
    async def publish_with(
        self, queue: str, messages: Sequence[bytes], deliveries: int, backstops: int = 0
    ) -> None:
        """:meth:`publish`, the messages marked as delivered ``deliveries`` times before, and
        as dead-lettered ``backstops`` times by RabbitMQ's delivery limit
        (``custody.BACKSTOP_ROUNDS``)."""
        await publish_confirmed(self.link, queue, messages, marked(deliveries, backstops))

    # ------------------------------------------------------------- consuming
    @guarded
    async def prepare_consumer(self, queues: Sequence[str], consumer: str) -> None:
        """Declare the queues (consumption itself starts with the first fetch)."""
        for queue in queues:
            await self.link.declare(queue)

    async def _consumer(self, queue: str, count: int) -> Consumer:
        """The running consumer of ``queue``, (re)started when missing, its channel closed,
        or RabbitMQ cancelled it (``basic.cancel``: the queue was deleted; it is declared
        again and consumed on a new channel)."""
        consumer = self.consumers.get(queue)
        if consumer is not None and self._alive(consumer):
            if consumer.unconfirmed():  # the loop may have stalled past the heartbeat (SIGSTOP)
                await consumer.confirm()
            if consumer.stopped:  # its queue was paused: consume on its channel again
                await self._consume(consumer)
                consumer.stopped = consumer.asked = False
            return consumer
        name = self.link.name(queue)
        if consumer is not None and consumer.cancelled:
            # The queue was deleted (and maybe declared again): a channel keeps state about
            # the queue it consumed, so the old one is closed and a new one consumes.
            logger.warning("RabbitMQ cancelled the consumer of %s; consuming again", name)
            self.link.forget(queue)
            await _close_quietly(consumer)
        await self.link.declare(queue)
        if self.prefetch is None:
            self.prefetch = max(1, count) * PREFETCH_FACTOR
        channel = await self.link.consumer_channel(self.prefetch)
        try:
            raw = await channel.get_underlay_channel()
        except FAILURES as exc:
            raise translate(exc, f"opening queue {name!r}") from None
        consumer = Consumer(channel, raw, name, self.link.epoch)
        await self.mark.ensure(self.link)  # gone with the connection (liveness.py)
        wake = self._wake

        def on_cancel(_frame: Any) -> None:
            consumer.cancelled = True
            wake()

        raw.on_consumer_cancel_callbacks.add(on_cancel)
        channel.close_callbacks.add(lambda *_: wake())
        await self._consume(consumer)
        self.consumers[queue] = consumer
        if consumer.epoch > 1:
            logger.info("consuming from %s again (connection %d)", queue, consumer.epoch)
        return consumer

    async def _consume(self, consumer: Consumer) -> None:
        """``basic.consume`` on ``consumer``'s channel: each delivery goes to its buffer,
        taken off aiormq's frame queue as it is read (``tap.py``)."""
        buffer, arrived, wake, receive = (
            consumer.buffer,
            consumer.arrived,
            self._wake,
            consumer.receive,
        )
        monotonic = time.monotonic

        def on_delivery(deliver: Any, header: Any, body: bytes) -> None:
            got = receive(deliver, header, body)  # its tasks: one, or a pack's
            buffer.extend(got)
            consumer.filling = True
            arrived[got[0].tag] = monotonic()
            wake()

        async def on_message(message: DeliveredMessage) -> None:  # the tap takes them all
            on_delivery(message.delivery, message.header, message.body)

        tap(consumer.raw, on_delivery)
        try:
            ok = await consumer.raw.basic_consume(consumer.name, on_message, no_ack=False)
        except FAILURES as exc:
            raise translate(exc, f"consuming from {consumer.name!r}") from None
        consumer.tag = str(ok.consumer_tag or "")

    def _wake(self) -> None:
        """Wake every fetch waiting for a message (a message arrived, a channel closed)."""
        for waiter in self._waiters:
            waiter.set()

    def _alive(self, consumer: Consumer) -> bool:
        """Whether ``consumer`` still consumes: its channel open on the current connection
        (aio-pika may not mark a channel closed when the server closed its connection) and
        not cancelled by RabbitMQ."""
        link = self.link
        return consumer.epoch == link.epoch and link.connected and consumer.open

    def _deliver(self, queue: str, consumer: Consumer, message: Received) -> Delivery:
        headers = message.headers
        # 0 when a count header was planted: the worker dead-letters it as malformed.
        deliveries = delivery_count(headers) if headers else 1
        token = b"%s.%d.%d.%d" % (self._instance, consumer.epoch, consumer.raw.number, message.tag)
        if message.pack is not None:
            token += b".%d" % next(self._parts)
        token += b"/" + copy_digest(message.body)
        self.held[token] = Held(queue, message, deliveries, consumer.epoch)
        return Delivery(queue, token, message.body, deliveries)

    async def fetch(self, queue: str, count: int, timeout: float) -> list[Delivery]:
        """:meth:`fetch_first` of the one queue ``queue``."""
        return await self.fetch_first([queue], count, timeout)

    @guarded
    async def fetch_first(
        self, queues: Sequence[str], count: int, timeout: float, *, look_first: bool = True
    ) -> list[Delivery]:
        """Take up to ``count`` messages from ``queues``, earlier ones first; when all are
        empty, wait up to ``timeout`` seconds for any of them. ``look_first=False`` (the
        caller found them empty a moment ago): no ``basic.get`` before waiting for what
        RabbitMQ pushes (see :meth:`_take_first`); nor after a wake-up.

        Raises:
            BrokerError: RabbitMQ could not be reached.
        """
        deadline = time.monotonic() + timeout
        arrived = asyncio.Event()
        self._waiters.add(arrived)
        try:
            while True:
                arrived.clear()
                out = await self._take_first(queues, count, ask=look_first)
                look_first = False  # woken: RabbitMQ pushed something (or a channel closed)
                left = deadline - time.monotonic()
                if out or left <= 0:
                    return out
                try:
                    await asyncio.wait_for(arrived.wait(), left)
                except TimeoutError:
                    return []
        finally:
            self._waiters.discard(arrived)

    shared_block = True
    """Idle loops share one wait (:meth:`block_first`): it costs RabbitMQ and Redis nothing."""

    @guarded
    async def block_first(
        self, queues: Sequence[str], timeout: float, count: int = 1
    ) -> list[Delivery]:
        """Wait up to ``timeout`` s for a message pushed to the consumer of any of ``queues``
        (or one buffered): one, taken as :meth:`_take_first` takes one without asking (the
        priority order kept); none at the timeout or after :meth:`unblock`. Raises
        BrokerError when RabbitMQ cannot be reached."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        arrived = asyncio.Event()
        self._waiters.add(arrived)
        self._idle_wait, self._unblocked = arrived, False
        try:
            while True:
                arrived.clear()
                out = await self._take_first(queues, 1, ask=False)
                if out:
                    return out
                live = [self.consumers.get(q) for q in queues if q not in self.paused]
                if any(c is not None and c.buffer for c in live):
                    continue  # the one taken was committed already (skipped): the next
                left = deadline - loop.time()
                if self._unblocked or left <= 0:
                    return []
                try:
                    await asyncio.wait_for(arrived.wait(), left)
                except TimeoutError:
                    return []
        finally:
            self._waiters.discard(arrived)
            self._idle_wait = None

    async def unblock(self) -> bool:
        """End the :meth:`block_first` in flight (it returns nothing)."""
        if self._idle_wait is None:
            return False
        self._unblocked = True
        self._idle_wait.set()
        return True

    async def occupied(self, queues: Sequence[str]) -> list[str]:
        """The queues a recovery round has work on: those this process holds deliveries of
        and those that had deliveries in custody (``custody.py``); all at the first round
        (custody older than that index), else at least the first (each round drains the
        dead-letter queue once)."""
        if self.custody is None:
            return []
        if not self._scanned:
            self._scanned = True
            return list(queues)
        held = {h.queue for h in self.held.values()}
        kept = await self.custody.queues()
        out = [q for q in queues if q in held or q in kept]
        return out or list(queues[:1])

    async def _take_first(
        self, queues: Sequence[str], count: int, ask: bool = True
    ) -> list[Delivery]:
        """Up to ``count`` messages, earlier queues first. Each queue a fetch would take from
        (the earlier ones, up to the one whose buffer completes ``count``) whose buffer is
        short is topped up first (:meth:`Consumer.top_up`, all at once) on the first fetch
        of its consumer, and whenever no level has anything buffered: a message published
        before the call is then seen (in priority order on a consumer's first fetch), and a
        fetch that finds nothing has asked RabbitMQ. When something is buffered, a fetch
        takes what RabbitMQ pushed without waiting on a ``basic.get`` (on a quorum queue a
        get is a log write: profiled, the gets made each fetch of a drain wait 2-250 ms on a
        loaded server); a message pushed later to an earlier level is taken by the next
        fetch. A top-up asks one get per level, more only while that level's prefetch is
        spent (RabbitMQ then pushes no more until acks). Without ``ask`` (a blocking fetch
        whose caller just found the levels empty, or one woken by a push) only a consumer's
        first fetch asks."""
        out: list[Delivery] = []
        try:
            consumers = []
            for queue in queues:
                if queue in self.paused:
                    continue
                consumer = await self._consumer(queue, count)
                if self._alive(consumer):
                    consumers.append((queue, consumer))
                else:  # RabbitMQ delivers them again
                    consumer.buffer.clear()
            short: list[Consumer] = []
            buffered = 0
            dry = not any(consumer.buffer for _, consumer in consumers)
            prefetch = self.prefetch or 0
            tops = []
            # Buffered on each level's lower levels: what a fetch would descend to.
            below = [0] * len(consumers)
            for i in range(len(consumers) - 2, -1, -1):
                below[i] = below[i + 1] + len(consumers[i + 1][1].buffer)
            for i, (_, consumer) in enumerate(consumers):  # in the order a fetch takes them
                if len(consumer.buffer) < count - buffered and (
                    not consumer.asked
                    or (dry and ask)
                    or (consumer.filling and below[i])  # short, a lower level next
                ):
                    consumer.asked = True
                    spent = len(consumer.unacked) >= prefetch
                    short.append(consumer)
                    tops.append(consumer.top_up(count - buffered, more=spent))
                buffered += len(consumer.buffer)
                if buffered >= count:
                    break
            # The levels whose get found a message: RabbitMQ may be pushing them more now.
            filling = set()
            if tops:
                for consumer, empty in zip(short, await asyncio.gather(*tops), strict=True):
                    if not empty:
                        filling.add(consumer)
            for queue, consumer in consumers:
                for message in consumer.take(count - len(out)):
                    if message.redelivered_pack():
                        out += await self._split(queue, consumer, message)
                    else:
                        out.append(self._deliver(queue, consumer, message))
                if len(out) >= count or consumer in filling:
                    # A level being filled: a lower one waits for the next fetch, so a
                    # consumer's first fetches (a start, a resume) keep the priority order.
                    break
        except FAILURES as exc:  # a BrokerError goes through translate as it is
            raise translate(exc, "fetching") from None
        if self.custody is not None and any(d.deliveries > 1 for d in out):
            out = await self._skip_committed(out)
        return out

    async def _split(self, queue: str, consumer: Consumer, message: Received) -> list[Delivery]:
        """A pack delivered again: :func:`.redelivered.split_pack` (nothing to run now), or,
        not a well-formed pack, the message delivered as it is (dead-lettered as malformed)."""
        store = self.custody.store if self.custody is not None else None
        if await split_pack(store, queue, message, self.publish_with):
            return []
        return [self._deliver(queue, consumer, message)]

    async def _skip_committed(self, out: list[Delivery]) -> list[Delivery]:
        """:func:`.redelivered.skip_committed` of ``out`` (acked through :meth:`ack`)."""
        assert self.custody is not None
        return await skip_committed(self.custody.store, out, self.ack)

    # ---------------------------------------------------------------- ack
    @guarded
    async def ack(self, queue: str, tokens: Sequence[bytes]) -> None:
        """``basic.ack`` the deliveries, batched per channel (``multiple=True``, see
        ``deliveries.py``); a delivery in custody is released from it instead; tokens no
        longer held are ignored (:func:`.settling.ack_held`)."""
        await ack_held(self, queue, tokens)

    @guarded
    async def nack(self, queue: str, tokens: Sequence[bytes]) -> None:
        """Hand deliveries back unfinished: each is published again (confirmed), marked
        with its deliveries so far minus one, then acked (or released from custody) -- so a
        hand-back does not spend the delivery budget as ``basic.nack`` on a quorum queue
        would (:func:`.settling.nack_held`)."""
        await nack_held(self, queue, tokens)

    def forget_lost(self, queue: str) -> int:
        """Drop the unacked deliveries of ``queue`` whose connection is gone (RabbitMQ put
        them back: another delivery follows); return how many."""
        epoch = self.link.epoch if self.link.connected else -1
        lost = [
            token
            for token, held in self.held.items()
            if held.queue == queue and held.state == "held" and held.epoch != epoch
        ]
        for token in lost:
            del self.held[token]
        return len(lost)

    # ------------------------------------------------------- custody (leases)
    @guarded
    async def heartbeat(self, queue: str, tokens: Sequence[bytes]) -> int:
        """Mark the deliveries ``tokens`` of ``queue`` as still running (so :meth:`recover`
        does not hand them back) and renew the custody leases of those in custody; return
        how many are still held."""
        now = time.monotonic()
        renewed = 0
        kept: list[bytes] = []
        for token in tokens:
            held = self.held.get(token)
            if held is None or held.queue != queue or held.state == "done":
                continue
            held.beat = now
            if held.state == "custody":
                kept.append(token)
            else:
                renewed += 1
        if kept and self.custody is not None:
            renewed += await self.custody.renew(queue, kept)
        return renewed

    @guarded
    async def recover(
        self,
        queue: str,
        min_idle: float,
        count: int,
        max_deliveries: int,
        record_ttl: int = 86400,
        holders: Mapping[str, float] | None = None,
    ) -> tuple[int, int]:
        """Hand deliveries held over ``min_idle`` seconds (and heartbeated) to custody;
        publish again (or dead-letter past ``max_deliveries``) deliveries whose custody lease
        lapsed and this process's deliveries not heartbeated for ``min_idle`` seconds; drain
        RabbitMQ's dead-letter queue into the state store (see ``custody.py``). No
        ``holders``: a custody lease carries its holder's own expiry (docs/guarantees.md).

        Returns:
            ``(requeued, dead_lettered)``.
        """
        if self.custody is None:
            return (0, 0)
        return await self.custody.maintain(queue, min_idle, count, max_deliveries, record_ttl)

    # ---------------------------------------------------------- inspection
    @guarded
    async def queue_stats(self, queues: Sequence[str]) -> dict[str, dict[str, int]]:
        """See :func:`.inspection.queue_stats` (in flight: this process's and, from the
        workers' registrations, the others')."""
        alive = {q: c for q, c in self.consumers.items() if self._alive(c)}
        store = self.custody.store if self.custody is not None else None
        elsewhere = await inspection.held_elsewhere(store, self._instance.decode(), self.link)
        return await inspection.queue_stats(self.link, alive, self.held.values(), queues, elsewhere)

    def holding(self) -> dict[str, Any]:
        """See :meth:`Transport.holding` and :func:`.inspection.holding`."""
        alive = {q: c for q, c in self.consumers.items() if self._alive(c)}
        epoch = self.link.epoch
        return inspection.holding(
            self._instance.decode(), alive, self.held.values(), epoch, self.mark.current(epoch)
        )

    @guarded
    async def purge_queue(self, queue: str) -> int:
        """See :func:`.inspection.purge_queue`."""
        return await inspection.purge_queue(self.link, self.consumers.get(queue), queue)

    @guarded
    async def pause(self, queues: Sequence[str]) -> int:
        """Consume nothing more from ``queues`` (physical; a paused queue) until
        :meth:`resume`: each one's consumer is cancelled and what it received that no fetch
        took is handed back (``pausing.py``); fetches skip them. Idempotent; returns how
        many messages were handed back.

        Raises:
            BrokerError: RabbitMQ refused a cancel or a publish, or could not be reached
                (what was not handed back is handed back by the next call).
        """
        self.paused.update(queues)
        self._wake()  # a wait in flight goes round, without the paused queues
        returned = 0
        for queue in queues:
            consumer = self.consumers.get(queue)
            if consumer is not None and consumer.epoch == self.link.epoch:
                returned += await stop_consuming(self, queue, consumer)
        return returned

    async def resume(self, queues: Sequence[str]) -> None:
        """Consume ``queues`` again (their next fetch consumes on the consumer's channel)."""
        self.paused.difference_update(queues)
        self._wake()

    @guarded
    async def ping(self) -> None:
        """Raise BrokerError unless RabbitMQ accepts a connection and a channel."""
        await self.link.publisher()

    async def close(self) -> None:
        """Stop consuming, hand back what the consumers received that no fetch took (published
        again, then acked: a channel closing with them would spend a delivery of each), and
        close the connection. Deliveries still unacked go back to their queues (RabbitMQ
        redelivers them). The transport connects again on its next call."""
        consumers, self.consumers = self.consumers, {}
        for queue, consumer in consumers.items():
            try:
                if self._alive(consumer):
                    await stop_consuming(self, queue, consumer)
            except FAILURES as exc:
                logger.warning("could not hand back the prefetched messages of %s: %s", queue, exc)
        self.held.clear()
        await self.link.close()
