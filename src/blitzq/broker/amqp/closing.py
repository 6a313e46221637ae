"""A RabbitMQ connection closed by the server: one warning line, and waiting fetches woken.

When RabbitMQ closes a connection (``rabbitmqctl close_connection``, a node shutting down,
missed heartbeats), aiormq logs an ERROR and then a WARNING with the traceback of the close
it raised in its reader task; nothing of that is news to the operator but the close itself.
:class:`CloseNotice` is attached to each connection an :class:`~.channels.AmqpLink` makes:
its close callback logs one WARNING naming the connection and RabbitMQ's reply (``320
CONNECTION_FORCED - ...``) and calls the link's listeners (the transport wakes its waiting
fetches, which reconnect at once instead of at the end of their wait), and a logging filter
on aiormq's connection logger drops its two records about *that* close (matched by the
connection object, then by the close's reply). A close blitzq asked for itself logs nothing.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any

import aiormq

logger = logging.getLogger("blitzq.broker.amqp")

_AIORMQ = "aiormq.connection"
_UNEXPECTED = "Unexpected connection close from remote"
_READER = "Cancelling cause reader exited abnormally"


class _Quiet(logging.Filter):
    """Drops aiormq's records about a server close of a connection blitzq watches."""

    def __init__(self) -> None:
        super().__init__()
        self.watched: weakref.WeakSet[Any] = weakref.WeakSet()
        self.replies: list[tuple[Any, ...]] = []  # of closes whose first record was dropped

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(_UNEXPECTED):
            args = record.args if isinstance(record.args, tuple) else ()
            if args and args[0] in self.watched:
                self.replies = [*self.replies[-7:], tuple(args[1:3])]
                return False
        elif message.startswith(_READER) and record.exc_info:
            exc = record.exc_info[1]
            if isinstance(exc, aiormq.exceptions.ConnectionClosed):
                reply = tuple(exc.args[:2])
                if reply in self.replies:
                    self.replies.remove(reply)
                    return False
        return True


_quiet = _Quiet()
logging.getLogger(_AIORMQ).addFilter(_quiet)


def describe(exc: BaseException | None) -> str:
    """``exc`` of a closed connection in a few words: RabbitMQ's ``reply_code reply_text``
    when it sent one, else the exception's type and message."""
    if isinstance(exc, aiormq.exceptions.ConnectionClosed) and len(exc.args) >= 2:
        return f"{exc.args[0]} {exc.args[1]}"
    if exc is None:
        return "closed"
    if isinstance(exc, TimeoutError) and not str(exc):
        return "TimeoutError: no answer in time (the connection may be closing)"
    return f"{type(exc).__name__}: {exc}"


class CloseNotice:
    """Watches one aio-pika connection (see the module docstring).

    Args:
        conn: the aio-pika connection just opened.
        name: its name, as RabbitMQ lists it.
        ours: returns whether blitzq is closing it itself (then nothing is logged).
        listeners: called (no arguments) when it closed, whoever closed it.
    """

    def __init__(
        self,
        conn: Any,
        name: str,
        ours: Callable[[], bool],
        listeners: list[Callable[[], None]],
    ) -> None:
        self.name = name
        self.ours = ours
        self.listeners = listeners
        underlying = getattr(conn, "transport", None)
        underlying = getattr(underlying, "connection", None)
        if underlying is not None:
            _quiet.watched.add(underlying)
        conn.close_callbacks.add(self.closed)

    def closed(self, _sender: Any, exc: BaseException | None = None) -> None:
        """The close callback: one WARNING (unless blitzq closed it), then the listeners."""
        if not self.ours():
            logger.warning(
                "RabbitMQ closed connection %r (%s); reconnecting", self.name, describe(exc)
            )
        for listener in self.listeners:
            listener()


__all__ = ["CloseNotice", "describe"]
