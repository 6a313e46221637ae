"""Reading a connection's frames in bulk: one socket read for many frames.

aiormq's connection reader gets each frame from its ``FrameReceiver``, which awaits three
``readexactly`` calls per frame (the first byte, the rest of the 7-byte header, then the
payload and frame-end byte) under a lock, into a fresh ``BytesIO``. A delivery is three
frames, so a worker draining no-op tasks spent about a fifth of its CPU there (profiled).

:func:`read_in_bulk` gives one of the transport's own aiormq connections a
:class:`BulkFrameReceiver` instead: each ``read`` takes what the socket has (up to
:data:`READ_SIZE` bytes), every complete frame in it is decoded by pamqp
(``pamqp.frame.unmarshal``, what aiormq uses) and handed to aiormq's reader one by one, in
order; an incomplete frame's bytes wait for the next read. A ``basic.deliver`` of a shape
pamqp already decoded is made from that decoding (see :meth:`BulkFrameReceiver._deliver`),
and a body frame's payload is the body (pamqp's ``ContentBody`` of it, as pamqp makes it).
aiormq still does everything with the frames (its reader, channels, heartbeats and errors
are unchanged); only how the bytes are cut into frames changes. A connection the application
lent
(``Queue(amqp_connection=...)``) is left as it is.

The receiver is found in the frame of aiormq's reader coroutine (its ``frame_receiver``);
where it is not there (another aiormq version), the connection keeps aiormq's own.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import aiormq
from aiormq.connection import FrameReceiver
from aiormq.exceptions import AMQPConnectionError, InvalidFrameError
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.exceptions import PAMQPException
from pamqp.frame import unmarshal

logger = logging.getLogger("blitzq.broker.amqp")

#: Bytes asked of the socket per read (what is there is returned at once, up to this).
READ_SIZE = 1 << 18

_HEADER = 7  # frame type (1), channel (2), payload size (4)
_DELIVER = b"\x00\x3c\x00\x3c"  # class 60 (basic), method 60 (deliver)
_FRAME_END = 0xCE
#: Shapes of ``basic.deliver`` frames kept per connection (one per consumer, usually).
_KNOWN_SHAPES = 64


class ConnectionLost(AMQPConnectionError):
    """A :class:`BulkFrameReceiver`'s socket was reset or closed without AMQP's
    ``connection.close`` (RabbitMQ dropped a connection whose heartbeats it missed, a node
    went away, the network cut it): aiormq's error for it, of a type ``closing.py`` knows
    is a connection of blitzq's own that it reports in one line."""


class BulkFrameReceiver(FrameReceiver):
    """aiormq's ``FrameReceiver`` reading frames in bulk (see the module docstring). Made
    from a running receiver by :func:`read_in_bulk` (its class is switched: aiormq's reader
    keeps iterating the same object)."""

    _ready: collections.deque[Any]
    _data: bytes
    _known: dict[bytes, tuple[str | None, str, str | None]]

    async def get_frame(self) -> Any:
        """The next frame, as ``(bytes, channel, frame)`` (what aiormq's receiver returns).

        Raises:
            StopAsyncIteration: the connection had ended before the call (as aiormq's).
            AMQPConnectionError: the connection closed, or failed, while reading.
            InvalidFrameError: pamqp could not decode a frame.
        """
        ready = self._ready
        if not ready:
            await self._fill()
        return ready.popleft()

    def _deliver(self, frame: bytes) -> Any:
        """Decode a ``basic.deliver`` method frame (what :meth:`get_frame` returns).

        The deliveries of one consumer differ only in their delivery tag and
        ``redelivered`` flag (a fixed-width field after the consumer tag): the rest of the
        frame (consumer tag, exchange, routing key) is the same bytes each time. The first
        frame of each such shape is decoded by pamqp, and kept once pamqp's tag and flag
        are where this reads them; later frames of the same bytes outside those 9 are made
        from the kept fields, the tag and the flag (no property-by-property decoding).
        """
        at = 12 + frame[11]  # after the 7-byte frame header, class, method, consumer tag
        key = frame[:at] + frame[at + 9 :]
        known = self._known.get(key)
        channel = int.from_bytes(frame[1:3], "big")
        tag = int.from_bytes(frame[at : at + 8], "big")
        redelivered = bool(frame[at + 8] & 1)
        if known is not None:
            deliver = spec.Basic.Deliver(known[0], tag, redelivered, known[1], known[2])
            return len(frame), channel, deliver
        try:
            decoded = unmarshal(frame)
        except PAMQPException as exc:
            raise InvalidFrameError(str(exc)) from exc
        got = decoded[2]
        if (
            isinstance(got, spec.Basic.Deliver)
            and got.delivery_tag == tag
            and got.redelivered == redelivered
            and len(self._known) < _KNOWN_SHAPES
        ):
            self._known[key] = (got.consumer_tag, got.exchange, got.routing_key)
        return decoded

    async def _fill(self) -> None:
        ready = self._ready
        data = self._data
        while True:
            start, size = 0, len(data)
            while size - start > _HEADER:
                end = start + _HEADER + int.from_bytes(data[start + 3 : start + 7], "big") + 1
                if end > size:
                    break
                kind = data[start]
                if kind == 3 and data[end - 1] == _FRAME_END:  # a body frame: its payload
                    channel = int.from_bytes(data[start + 1 : start + 3], "big")
                    ready.append((end - start, channel, ContentBody(data[start + 7 : end - 1])))
                    start = end
                    continue
                if kind == 1 and data[start + 7 : start + 11] == _DELIVER:
                    ready.append(self._deliver(data[start:end]))
                    start = end
                    continue
                try:
                    ready.append(unmarshal(data[start:end]))
                except PAMQPException as exc:
                    raise InvalidFrameError(str(exc)) from exc
                start = end
            data = data[start:] if start else data
            if ready:
                self._data = data
                return
            reader = self.reader
            if reader.at_eof() and not data:  # as aiormq's: closed before this read
                raise StopAsyncIteration
            try:
                chunk = await reader.read(READ_SIZE)
            except OSError as exc:  # reset, refused, broken pipe: as aiormq reports them
                raise ConnectionLost(f"Server communication error: {exc!r}") from exc
            if not chunk:  # closed while waiting: aiormq's readexactly fails the same way
                raise ConnectionLost(
                    f"Server connection unexpectedly closed. Read {len(data)} bytes of a frame"
                )
            data = data + chunk if data else chunk


def read_in_bulk(connection: aiormq.abc.AbstractConnection) -> bool:
    """Switch ``connection``'s running frame receiver to a :class:`BulkFrameReceiver`;
    return whether it was switched (``False``: not found, aiormq's own is kept)."""
    try:
        task = connection._reader_task.task  # type: ignore[attr-defined]
        frame = task.get_coro().cr_frame
        receiver = frame.f_locals.get("frame_receiver") if frame is not None else None
    except AttributeError:
        receiver = None
    if type(receiver) is not FrameReceiver:
        if not isinstance(receiver, BulkFrameReceiver):
            logger.debug("aiormq's frame receiver not found: frames are read one by one")
        return isinstance(receiver, BulkFrameReceiver)
    receiver._ready = collections.deque()  # type: ignore[attr-defined]
    receiver._data = b""  # type: ignore[attr-defined]
    receiver._known = {}  # type: ignore[attr-defined]
    receiver.__class__ = BulkFrameReceiver
    return True


__all__ = ["READ_SIZE", "BulkFrameReceiver", "ConnectionLost", "read_in_bulk"]
