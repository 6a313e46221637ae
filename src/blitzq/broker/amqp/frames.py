"""Reading a connection's frames in bulk: one socket read for many frames.

aiormq's connection reader gets each frame from its ``FrameReceiver``, which awaits three
``readexactly`` calls per frame (the first byte, the rest of the 7-byte header, then the
payload and frame-end byte) under a lock, into a fresh ``BytesIO``. A delivery is three
frames, so a worker draining no-op tasks spent about a fifth of its CPU there (profiled).

:func:`read_in_bulk` gives one of the transport's own aiormq connections a
:class:`BulkFrameReceiver` instead: each ``read`` takes what the socket has (up to
:data:`READ_SIZE` bytes), every complete frame in it is decoded by pamqp
(``pamqp.frame.unmarshal``, what aiormq uses) and handed to aiormq's reader one by one, in
order; an incomplete frame's bytes wait for the next read. aiormq still does everything with
the frames (its reader, channels, heartbeats and errors are unchanged); only how the bytes
are cut into frames changes. A connection the application lent
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
from pamqp.exceptions import PAMQPException
from pamqp.frame import unmarshal

logger = logging.getLogger("blitzq.broker.amqp")

#: Bytes asked of the socket per read (what is there is returned at once, up to this).
READ_SIZE = 1 << 18

_HEADER = 7  # frame type (1), channel (2), payload size (4)


class BulkFrameReceiver(FrameReceiver):
    """aiormq's ``FrameReceiver`` reading frames in bulk (see the module docstring). Made
    from a running receiver by :func:`read_in_bulk` (its class is switched: aiormq's reader
    keeps iterating the same object)."""

    _ready: collections.deque[Any]
    _data: bytes

    async def get_frame(self) -> Any:
        """The next frame, as ``(bytes, channel, frame)`` (what aiormq's receiver returns).

        Raises:
            StopAsyncIteration: the server closed the connection between frames.
            AMQPConnectionError: the connection closed or failed within a frame.
            InvalidFrameError: pamqp could not decode a frame.
        """
        ready = self._ready
        if not ready:
            await self._fill()
        return ready.popleft()

    async def _fill(self) -> None:
        ready = self._ready
        data = self._data
        while True:
            start, size = 0, len(data)
            while size - start > _HEADER:
                end = start + _HEADER + int.from_bytes(data[start + 3 : start + 7], "big") + 1
                if end > size:
                    break
                try:
                    ready.append(unmarshal(data[start:end]))
                except PAMQPException as exc:
                    raise InvalidFrameError(str(exc)) from exc
                start = end
            data = data[start:] if start else data
            if ready:
                self._data = data
                return
            try:
                chunk = await self.reader.read(READ_SIZE)
            except OSError as exc:  # reset, refused, broken pipe: as aiormq reports them
                raise AMQPConnectionError(f"Server communication error: {exc!r}") from exc
            if not chunk:
                if data:
                    raise AMQPConnectionError(
                        "Server connection unexpectedly closed "
                        f"(within a frame, {len(data)} bytes read)"
                    )
                raise StopAsyncIteration
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
    receiver.__class__ = BulkFrameReceiver
    return True


__all__ = ["READ_SIZE", "BulkFrameReceiver", "read_in_bulk"]
