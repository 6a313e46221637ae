"""What the RabbitMQ transport holds in memory: its deliveries and its consumers.

:class:`Held` is one delivery received and not yet acked (or in the state store's custody,
``custody.py``); :class:`Received` is one message RabbitMQ delivered to a consumer's channel;
:class:`Consumer` is one queue's consumer: its channel, the buffer of messages RabbitMQ
pushed to it that no fetch has taken yet, and the delivery tags of that channel not acked yet.

**Acks in batches.** A channel's delivery tags rise in the order RabbitMQ delivered the
messages (consumer deliveries and ``basic.get`` alike). :meth:`Consumer.settle` marks the tags
it is given as done and sends one ``basic.ack`` with ``multiple=True`` for the longest run of
done tags at the front of the channel's unacked tags (what a batch of completions usually
is), and a plain ``basic.ack`` for each done tag behind a tag still running: one frame per
batch instead of one per message, never an ack of a message still running or buffered. The
frames are queued on the connection without waiting for the socket to drain (an ack has no
reply in AMQP: a lost one means a redelivery, which the state store's completion record
turns into an ack without a second run, see ``transport.py``).
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

from .closing import FAILURES
from .packs import PACK_HEADER, Pack, decode


class Received:
    """One message delivered to a consumer's channel (by ``basic.deliver`` or ``basic.get``).

    Attributes:
        body: the message body.
        headers: its AMQP headers (``None`` when it has none).
        tag: its delivery tag on ``consumer``'s channel.
        consumer: the :class:`Consumer` whose channel delivered it (acked there).
        redelivered: RabbitMQ's ``redelivered`` flag (delivered before, not acked).
        pack: the :class:`~.packs.Pack` this is one task of (the AMQP message, tag ``tag``,
            is acked once every task of it is settled: :func:`.channels.settle`,
            :meth:`Consumer.settle`); ``None``: a message of its own (or a whole pack
            delivered again, split by the transport).
    """

    __slots__ = ("body", "consumer", "headers", "pack", "redelivered", "tag")

    def __init__(
        self, consumer: Consumer, delivery: Any, header: ContentHeader, body: bytes
    ) -> None:
        self.body = body
        self.headers: dict[str, Any] | None = header.properties.headers
        self.tag: int = delivery.delivery_tag or 0
        self.redelivered = bool(delivery.redelivered)
        self.consumer = consumer
        self.pack: Pack | None = None

    def tasks(self) -> list[Received]:
        """This message as the tasks it holds: itself, or -- a pack delivered for the first
        time (:mod:`.packs`) -- one :class:`Received` per task, sharing its tag, headers and
        a :class:`~.packs.Pack`. A pack that does not decode stays whole (the worker
        dead-letters it as malformed); a pack delivered again stays whole (the transport
        splits it, :meth:`~.transport.AmqpTransport._split`)."""
        headers = self.headers
        if headers is None or PACK_HEADER not in headers or self.redelivered_pack():
            return [self]
        bodies = decode(self.body)
        if bodies is None:
            return [self]
        pack = Pack(len(bodies))
        out: list[Received] = []
        for body in bodies:
            part = object.__new__(Received)
            part.body = body
            part.headers = headers
            part.tag = self.tag
            part.redelivered = self.redelivered
            part.consumer = self.consumer
            part.pack = pack
            out.append(part)
        return out

    def redelivered_pack(self) -> bool:
        """Whether this is a pack delivered before (the quorum queue's
        ``x-delivery-count`` is set: a consumer's channel closed with it unacked)."""
        headers = self.headers
        return (
            headers is not None
            and PACK_HEADER in headers
            and self.pack is None
            and headers.get("x-delivery-count", 0) != 0
        )


class Held:
    """A delivery this process holds: received, not yet acked.

    Attributes:
        queue: physical queue.
        message: the :class:`Received` message (acked through its consumer's channel).
        since: ``time.monotonic()`` when it was received.
        beat: ``time.monotonic()`` of its last heartbeat (or its receipt).
        deliveries: its delivery count (:attr:`Delivery.deliveries`).
        epoch: the connection it came on (:attr:`.channels.AmqpLink.epoch`): once that
            connection is gone RabbitMQ has put the message back, and it is no longer held.
        state: ``"held"`` (unacked on RabbitMQ), ``"handing"`` (being handed to custody),
            ``"custody"`` (acked on RabbitMQ, kept by the state store) or ``"done"`` (acked
            while it was being handed over).
    """

    __slots__ = ("beat", "deliveries", "epoch", "message", "queue", "since", "state")

    def __init__(self, queue: str, message: Received, deliveries: int, epoch: int) -> None:
        self.queue = queue
        self.epoch = epoch
        self.message = message
        self.since = self.beat = time.monotonic()
        self.deliveries = deliveries
        self.state = "held"


class Consumer:
    """One queue's consumer (see the module docstring).

    Args:
        channel: the aio-pika channel it consumes on (its own).
        raw: that channel's aiormq channel (consume, get and ack go through it directly).
        name: the RabbitMQ queue consumed.
        epoch: the connection the channel belongs to.

    Attributes:
        tag: the consumer tag (``""`` until ``basic.consume`` was answered).
        buffer: the messages received that no fetch has taken yet, in delivery order.
        arrived: ``time.monotonic()`` of each buffered message's arrival, by delivery tag.
        unacked: the channel's delivery tags not acked yet, in delivery order, each mapped
            to whether its message is done (acked as soon as every tag before it is).
        cancelled: RabbitMQ cancelled the consumer (``basic.cancel``: its queue was deleted).
        stopped: the transport cancelled it, its queue paused (``pausing.py``): RabbitMQ
            pushes it nothing until it consumes again; its channel stays open for the acks.
        asked: a fetch topped its buffer up (:meth:`top_up`) at least once.
        filling: RabbitMQ may have more of the queue for it: a message arrived (pushed or
            got) since a ``basic.get`` last found the queue empty. A fetch does not take a
            lower priority level's buffer past a filling level whose buffer ran out: it asks
            that level first (``transport.py``, ``_take_first``).
        confirmed: ``time.monotonic()`` when a request was sent on the channel that RabbitMQ
            answered (its opening, a ``basic.get``, :meth:`confirm`): the channel, and every
            delivery received before, was still this consumer's then (:meth:`unconfirmed`).
    """

    __slots__ = (
        "arrived",
        "asked",
        "buffer",
        "cancelled",
        "channel",
        "confirmed",
        "epoch",
        "filling",
        "name",
        "raw",
        "stopped",
        "tag",
        "unacked",
    )

    def __init__(
        self, channel: AbstractChannel, raw: aiormq.abc.AbstractChannel, name: str, epoch: int
    ) -> None:
        self.channel = channel
        self.raw = raw
        self.name = name
        self.epoch = epoch
        self.tag = ""
        self.filling = False
        self.cancelled = False
        self.stopped = False
        self.asked = False
        self.buffer: collections.deque[Received] = collections.deque()
        self.arrived: dict[int, float] = {}
        self.unacked: dict[int, bool] = {}
        self.confirmed = time.monotonic()

    @property
    def open(self) -> bool:
        """Whether its channel is open and RabbitMQ has not cancelled it."""
        return not (self.cancelled or self.channel.is_closed or self.raw.is_closed)

    def received(self, message: DeliveredMessage) -> list[Received]:
        """Record a message the channel delivered (unacked from now on) and wrap it: the
        tasks it holds (:meth:`Received.tasks`: one, or a pack's)."""
        return self.receive(message.delivery, message.header, message.body)

    def receive(self, delivery: Any, header: ContentHeader, body: bytes) -> list[Received]:
        """:meth:`received` of a message given as its method frame (``basic.deliver`` or
        ``basic.get-ok``), content header and body."""
        got = Received(self, delivery, header, body)
        unacked = self.unacked
        if unacked and got.tag < next(reversed(unacked)):
            # A get's answer is read after deliveries of later tags: keep the tag order.
            unacked[got.tag] = False
            self.unacked = dict(sorted(unacked.items()))
        else:
            unacked[got.tag] = False
        return got.tasks()

    def stale(self, age: float) -> list[Received]:
        """Remove and return the buffered messages that arrived over ``age`` seconds ago
        (no fetch took them: the worker's slots are all busy)."""
        now = time.monotonic()
        arrived = self.arrived
        old = [m for m in self.buffer if now - arrived.setdefault(m.tag, now) > age]
        if old:
            keep = [m for m in self.buffer if now - arrived[m.tag] <= age]
            self.buffer.clear()
            self.buffer.extend(keep)
            for m in old:
                arrived.pop(m.tag, None)
        return old

    def unconfirmed(self) -> bool:
        """Whether what the buffer holds must be confirmed (:meth:`confirm`) before a fetch
        takes it: something is buffered, the connection has heartbeats, and nothing RabbitMQ
        answered on the channel was asked within half the heartbeat timeout. RabbitMQ gives
        a connection up after about one heartbeat timeout without a frame from it (the
        process stopped, ``SIGSTOP``, or its event loop blocked) and delivers its unacked
        messages to other consumers; what this process read before, or reads from its socket
        after, still looks fresh here until the reader reaches the close. A confirmed
        channel costs nothing: at most one round trip per half heartbeat timeout, and a
        ``basic.get`` of a top-up confirms as well."""
        if not self.buffer:
            return False
        heartbeat = getattr(self.raw.connection, "heartbeat_timeout", 0) or 0
        return heartbeat > 0 and time.monotonic() - self.confirmed > heartbeat / 2

    async def confirm(self) -> None:
        """A round trip on the channel (a passive declaration of its queue, answered after
        every frame RabbitMQ sent before: a close of the connection or channel is seen
        first). On failure the buffer is dropped -- RabbitMQ has taken those messages back,
        or gets them back as the channel closes (aiormq closes a channel whose request timed
        out) -- and the error raised.

        Raises:
            aiormq.exceptions.AMQPError, RuntimeError, OSError: the channel or connection is
                gone, or no answer within half the heartbeat timeout (the caller translates).
        """
        sent = time.monotonic()
        heartbeat = getattr(self.raw.connection, "heartbeat_timeout", 0) or 0
        try:
            await asyncio.wait_for(
                self.raw.queue_declare(self.name, passive=True), max(1.0, heartbeat / 2)
            )
        except FAILURES:
            self.buffer.clear()
            self.arrived.clear()
            raise
        self.confirmed = sent

    def take(self, room: int) -> list[Received]:
        """Up to ``room`` buffered messages (tasks: a pack's count one each), in queue
        order."""
        buffer, arrived = self.buffer, self.arrived
        taken: list[Received] = []
        while buffer and len(taken) < room:
            message = buffer.popleft()
            if not (buffer and buffer[0].tag == message.tag):  # a pack's last task buffered
                arrived.pop(message.tag, None)
            taken.append(message)
        return taken

    async def top_up(self, room: int, more: bool = True) -> bool:
        """Bring into the buffer what RabbitMQ already dispatched and what waits in the
        queue, up to ``room`` buffered messages: a ``basic.get`` (the first one in any case:
        a message published a moment ago is then seen at once), repeated while it finds a
        message when ``more`` (the consumer's prefetch is spent: a saturated prefetch does
        not stall free slots, nor let a lower level overtake this one; otherwise RabbitMQ
        pushes the next messages itself, and each get, a log write on a quorum queue, would
        hold the fetch up).

        Deliveries and gets of one channel share its delivery-tag sequence; the buffer is
        sorted by tag after the gets (and a loop turn for the consumer's callbacks). The
        order is FIFO but for one race: RabbitMQ's channel takes a get's answer before the
        pushes a queue sent it just earlier, so a message got may come ahead of ones being
        pushed at that moment (seen under load: the 101st of a queue first, then the 100
        prefetched). Delivery order is not a guarantee (docs/guarantees.md).

        Returns:
            Whether a get found the queue empty (else it may hold more: RabbitMQ may be
            pushing them to this consumer now).

        Raises:
            aiormq.exceptions.AMQPError: the get failed (the caller translates it).
        """
        got: list[Received] = []
        sent = time.monotonic()
        empty = False
        while len(got) + len(self.buffer) < room or not got:
            answer = await self.raw.basic_get(self.name, no_ack=False)
            self.confirmed = sent  # answered: what was buffered before the get is still ours
            for _ in range(3):  # the consumer's callbacks of frames read before the answer
                await asyncio.sleep(0)
            if isinstance(answer.delivery, spec.Basic.GetEmpty):
                empty = True
                self.filling = False
                break
            self.filling = True
            got.extend(self.received(answer))
            if not more:
                break
        if got:
            now = time.monotonic()
            for message in got:
                self.arrived[message.tag] = now
            merged = sorted([*self.buffer, *got], key=by_tag)
            self.buffer.clear()
            self.buffer.extend(merged)
        return empty

    async def settle(self, tags: list[int], ack: bool = True) -> None:
        """Ack (or ``basic.nack`` with requeue) the delivery tags ``tags`` of this channel,
        acks batched as the module docstring says. Tags not unacked here are skipped (an ack
        of an unknown tag would close the channel); a closed channel is not an error
        (RabbitMQ redelivers its messages)."""
        unacked = self.unacked
        if not self.open:
            unacked.clear()
            return
        raw = self.raw
        try:
            if not ack:
                for tag in tags:
                    if unacked.pop(tag, None) is not None:
                        await raw.basic_nack(tag, requeue=True, wait=False)
                return
            behind: list[int] = []
            for tag in tags:
                if tag in unacked:
                    unacked[tag] = True
                    behind.append(tag)
            if not behind:
                return
            front = 0
            count = 0
            for tag, done in unacked.items():
                if not done:
                    break
                front = tag
                count += 1
            if count:
                for tag in list(itertools.islice(unacked, count)):
                    del unacked[tag]
                await raw.basic_ack(front, multiple=count > 1, wait=False)
            for tag in behind:
                if unacked.pop(tag, None) is not None:
                    await raw.basic_ack(tag, wait=False)
        except FAILURES:
            unacked.clear()  # the channel is going: RabbitMQ redelivers what it held


def by_tag(message: Received) -> int:
    """Sort key of the messages of one channel: their delivery tag (the order RabbitMQ
    delivered them in, gets and consumer deliveries alike)."""
    return message.tag
