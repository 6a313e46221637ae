"""A lost RabbitMQ connection: one warning line, and waiting fetches woken.

A connection is lost in three expected ways: RabbitMQ closes it (``connection.close``:
``rabbitmqctl close_connection``, a node shutting down); its socket is reset or closed
without a close (RabbitMQ dropped a connection whose heartbeats it missed -- this process was
stopped, ``SIGSTOP``, or its event loop blocked -- a node died, the network cut it); or aiormq
gives it up (no frame for three heartbeat timeouts: a silent network or server). aiormq logs
each one its own way -- an ERROR, a WARNING "Server connection ... was stuck", or a WARNING
"Cancelling cause reader exited abnormally" *with the traceback* of its reader task -- which
reads like a crash, while nothing of it is news to the operator but the loss itself.

:class:`CloseNotice` is attached to each connection an :class:`~.channels.AmqpLink` makes:
its close callback logs one WARNING saying what happened (RabbitMQ's reply, ``320
CONNECTION_FORCED - ...``; or the lost socket and its usual causes; or the heartbeat) and
what follows (the worker connects again; RabbitMQ puts the connection's unacked deliveries
back), and calls the link's listeners (the transport wakes its waiting fetches, which
reconnect at once instead of at the end of their wait). A logging filter on aiormq's
connection logger drops aiormq's records about those expected losses of blitzq's own
connections only: matched by the connection object, by the close's reply, or by the error's
type (:class:`~.frames.ConnectionLost`, raised only by blitzq's frame reader); on its channel
logger, the WARNING "Closing channel ... because RPC call ... cancelled" of a channel of
blitzq's connections (a call given up with its connection, or timed out: the error blitzq
raises for that call is logged by its caller, at DEBUG when the loss was logged). Any other
record -- a malformed frame, an error of aiormq's own reader (a connection the application
lent, ``injected.py``) -- keeps its traceback. A close blitzq asked for itself logs nothing.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any

import aiormq

from .frames import ConnectionLost

logger = logging.getLogger("blitzq.broker.amqp")

#: What a call of aio-pika/aiormq raises when it fails, each translated by
#: :func:`.channels.translate` (never let out raw): RabbitMQ's AMQP errors; a closed
#: channel or connection (``ChannelInvalidStateError`` and aio-pika's other
#: ``RuntimeError``s, such as "Connection is not ready"); socket errors and timeouts
#: (``OSError``, whose subclass ``TimeoutError`` is also asyncio's). A
#: :class:`~blitzq.exceptions.BlitzQError` caught with them (a ``BrokerError`` is a
#: ``ConnectionError``) goes through ``translate`` unchanged.
FAILURES: tuple[type[BaseException], ...] = (aiormq.exceptions.AMQPError, RuntimeError, OSError)

_AIORMQ = "aiormq.connection"
_UNEXPECTED = "Unexpected connection close from remote"
_READER = "Cancelling cause reader exited abnormally"
_STUCK = "Server connection %r was stuck"
_AIORMQ_CHANNEL = "aiormq.channel"
_RPC_CANCELLED = "Closing channel %r because RPC call %s cancelled"


class _Quiet(logging.Filter):
    """Drops aiormq's records about a server close of a connection blitzq watches."""

    def __init__(self) -> None:
        super().__init__()
        self.watched: weakref.WeakSet[Any] = weakref.WeakSet()
        self.replies: list[tuple[Any, ...]] = []  # of closes whose first record was dropped

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(_RPC_CANCELLED):  # blitzq reports the call it cancelled
            args = record.args if isinstance(record.args, tuple) else ()
            return not (args and getattr(args[0], "connection", None) in self.watched)
        if message.startswith(_STUCK):  # given up (heartbeats): CloseNotice says so
            args = record.args if isinstance(record.args, tuple) else ()
            return not (args and args[0] in self.watched)
        if message.startswith(_UNEXPECTED):
            args = record.args if isinstance(record.args, tuple) else ()
            if args and args[0] in self.watched:
                self.replies = [*self.replies[-7:], tuple(args[1:3])]
                return False
        elif message.startswith(_READER) and record.exc_info:
            exc = record.exc_info[1]
            if isinstance(exc, ConnectionLost):  # blitzq's own reader: CloseNotice says so
                return False
            if isinstance(exc, aiormq.exceptions.ConnectionClosed):
                reply = tuple(exc.args[:2])
                if reply in self.replies:
                    self.replies.remove(reply)
                    return False
        return True


_quiet = _Quiet()
logging.getLogger(_AIORMQ).addFilter(_quiet)
logging.getLogger(_AIORMQ_CHANNEL).addFilter(_quiet)


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
                "%s; connecting again (RabbitMQ puts the connection's unacked deliveries "
                "back on their queues)",
                lost(self.name, exc),
            )
        for listener in self.listeners:
            listener()


def lost(name: str, exc: BaseException | None) -> str:
    """What happened to connection ``name``, closed with ``exc``, in one sentence."""
    if isinstance(exc, ConnectionLost):
        cause = exc.__cause__
        if isinstance(cause, ConnectionResetError):
            how = "reset"
        elif isinstance(cause, OSError):
            how = f"broken ({type(cause).__name__}: {cause})"
        else:
            how = "closed"
        return (
            f"lost connection {name!r} to RabbitMQ: its socket was {how} without an AMQP "
            "close (RabbitMQ drops a connection whose heartbeats it missed -- this process "
            "was stopped or its event loop blocked -- or the node or the network went away)"
        )
    if isinstance(exc, asyncio.CancelledError):
        return (
            f"gave up connection {name!r} to RabbitMQ: no frame for three heartbeat timeouts "
            "(a silent network or server, or this process was stopped)"
        )
    return f"RabbitMQ closed connection {name!r} ({describe(exc)})"


__all__ = ["CloseNotice", "describe", "lost"]
