"""A consumer channel's deliveries, and a publishing channel's confirms, taken off aiormq's
frame queue as they are read.

aiormq hands every frame of a channel to that channel through an ``asyncio.Queue``
(``channel.frames``): the connection's reader puts it, the channel's reader task gets it, a
delivery's method, content header and body frames each take a queue round, then the
channel assembles a ``DeliveredMessage`` and starts a task per delivery for the consumer
callback. Profiled on a drain of no-op tasks, that hand-over cost about a third of the
worker's CPU per task (more than the task's own run).

:func:`tap` puts a :class:`FrameTap` in front of a consumer channel's queue: the connection's
reader still reads and decodes every frame (aiormq and pamqp, unchanged) and still calls
``channel.frames.put``; the tap takes the three frames of a ``basic.deliver`` (and the
further body frames of a large message) and hands the assembled delivery to a plain
callback at once, on the reader's own turn -- no queue round, no task. Every other frame
(``basic.get-ok`` and its content, ``basic.cancel``, RPC replies, ``channel.close``) goes to
the channel's own queue as before, so aiormq's channel keeps working as usual.

Frames of one channel arrive in order and AMQP never interleaves two messages' content on a
channel, so a frame that follows a method with content belongs to that method: the tap only
tracks whether the content being read is a delivery's (taken) or another method's (passed
on). A delivery taken by the tap may overtake a ``basic.get-ok`` still queued for the
channel's reader; the consumer orders what it holds by delivery tag (``deliveries.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiormq
from aiormq.channel import Returning
from aiormq.exceptions import DeliveryError
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

#: Called with each delivery taken: ``(basic.deliver frame, content header, body)``.
OnDelivery = Callable[[spec.Basic.Deliver, ContentHeader, bytes], None]


class _PassingOn:
    """What aiormq's channel calls on its frame queue besides ``put``, passed to the
    channel's own queue (``queue``)."""

    __slots__ = ()
    queue: asyncio.Queue[Any]

    async def get(self) -> Any:
        """The next frame passed on (the channel's reader)."""
        return await self.queue.get()

    def task_done(self) -> None:
        """As ``asyncio.Queue.task_done`` of the channel's queue."""
        self.queue.task_done()

    def qsize(self) -> int:
        """Frames passed on and not read yet."""
        return self.queue.qsize()


class FrameTap(_PassingOn):
    """Stands for a channel's ``frames`` queue (see the module docstring).

    Args:
        queue: the channel's own frame queue (what is not taken is put there; its reader
            keeps getting from it).
        on_delivery: called with each delivery, on the connection reader's turn (it must
            not block; an exception it raises is the reader's, and closes the connection).
    """

    __slots__ = ("_body", "_deliver", "_got", "_header", "on_delivery", "queue")

    def __init__(self, queue: asyncio.Queue[Any], on_delivery: OnDelivery) -> None:
        self.queue = queue
        self.on_delivery = on_delivery
        self._deliver: spec.Basic.Deliver | None = None  # the delivery being read
        self._header: ContentHeader | None = None
        self._body: list[bytes] = []
        self._got = 0  # body bytes read so far

    async def put(self, item: tuple[int, Any]) -> None:
        """Take ``item`` (``(weight, frame)``, as the connection's reader puts it) if it is
        part of a delivery; else put it on the channel's queue."""
        frame = item[1]
        deliver = self._deliver
        if deliver is not None:
            if isinstance(frame, ContentHeader):
                self._header = frame
                if not frame.body_size:
                    self._deliver, self._header = None, None
                    self.on_delivery(deliver, frame, b"")
                return
            header = self._header
            if isinstance(frame, ContentBody) and header is not None:
                value = frame.value
                self._got += len(value)
                if self._got < header.body_size:
                    self._body.append(value)
                    return
                if self._body:
                    self._body.append(value)
                    value = b"".join(self._body)
                self._deliver, self._header, self._body, self._got = None, None, [], 0
                self.on_delivery(deliver, header, value)
                return
            # Not the content of the delivery being read (only a closing channel does
            # that): drop the partial delivery (RabbitMQ redelivers it) and pass it on.
            self._deliver, self._header, self._body, self._got = None, None, [], 0
        if isinstance(frame, spec.Basic.Deliver):
            self._deliver = frame
            return
        await self.queue.put(item)


class ConfirmTap(_PassingOn):
    """Stands for a publishing channel's ``frames`` queue: settles publisher confirms as
    they are read.

    aiormq settles a ``basic.ack`` with ``multiple`` by scheduling a callback per sequence
    number it covers (``loop.call_soon`` each, a third of a bulk enqueue's CPU, profiled).
    The tap settles them at once, as aiormq's callback does (an ack sets each covered
    confirmation's result, a ``basic.nack`` a ``DeliveryError``; a returned message's
    marker and a confirmation already done are dropped), while the channel's reader has
    nothing queued: a ``basic.return`` read before the ack (for a message the ack covers)
    has then been handled, so its confirmation already says it was returned. Otherwise, and
    for every other frame, the frame goes to the channel's own queue as before.

    Args:
        queue: the channel's own frame queue.
        confirmations: the channel's ``confirmations`` (sequence number to confirmation).
    """

    __slots__ = ("confirmations", "queue")

    def __init__(self, queue: asyncio.Queue[Any], confirmations: dict[int, Any]) -> None:
        self.queue = queue
        self.confirmations = confirmations

    async def put(self, item: tuple[int, Any]) -> None:
        """Settle ``item`` (``(weight, frame)``) if it is a confirm and nothing is queued
        before it; else put it on the channel's queue."""
        frame = item[1]
        if isinstance(frame, spec.Basic.Ack | spec.Basic.Nack) and not self.queue.qsize():
            confirmations = self.confirmations
            tag = frame.delivery_tag
            if tag in confirmations:
                covered = [t for t in confirmations if t <= tag] if frame.multiple else [tag]
                ack = isinstance(frame, spec.Basic.Ack)
                for number in covered:
                    confirmation = confirmations.pop(number)
                    if isinstance(confirmation, Returning) or confirmation.done():
                        continue
                    if ack:
                        confirmation.set_result(frame)
                    else:
                        confirmation.set_exception(DeliveryError(None, frame))
                return
        await self.queue.put(item)


def tap_confirms(channel: aiormq.abc.AbstractChannel) -> None:
    """Put a :class:`ConfirmTap` in front of ``channel``'s frame queue (a channel in
    publisher-confirm mode; once)."""
    current: Any = channel.frames
    if not isinstance(current, ConfirmTap):
        confirmations = channel.confirmations  # type: ignore[attr-defined]
        channel.frames = ConfirmTap(current, confirmations)  # type: ignore[assignment]


def tap(channel: aiormq.abc.AbstractChannel, on_delivery: OnDelivery) -> FrameTap:
    """Put a :class:`FrameTap` in front of ``channel``'s frame queue (once: a tapped
    channel's tap gets the new callback) and return it.

    Args:
        channel: an open aiormq channel that only this consumer uses.
        on_delivery: see :class:`FrameTap`.
    """
    current: Any = channel.frames
    if isinstance(current, FrameTap):
        current.on_delivery = on_delivery
        return current
    made = FrameTap(current, on_delivery)
    channel.frames = made  # type: ignore[assignment]
    return made


__all__ = ["ConfirmTap", "FrameTap", "OnDelivery", "tap", "tap_confirms"]
