"""The AMQP side of the RabbitMQ transport: one connection, its channels, queue declarations.

:class:`AmqpLink` owns an aio-pika connection made on first use and re-made after it closed
(a server restart, ``rabbitmqctl close_connection``): every call first checks it
(:meth:`AmqpLink.ensure`), and each re-made connection is a new *epoch* whose consumers the
transport starts again. It has one channel in publisher-confirm mode for publishing and
declaring, one channel per consumed queue (a channel closed by the server -- a
``consumer_timeout``, a refused ack -- costs that queue's consumer only), and declares the
queues blitzq uses:

- ``<namespace>.<physical queue>`` (``app.emails``, ``app.emails:high``): a durable quorum
  queue (``x-queue-type: quorum``) with ``x-delivery-limit`` one less than the backstop
  (:func:`~blitzq.broker.transport.delivery_backstop`; RabbitMQ counts *returns*: a limit of
  L allows L + 1 deliveries; the worker dead-letters a crashing task after ``max_deliveries``
  runs itself, see ``worker/solo.py``; a queue an earlier version declared with
  ``max_deliveries - 1`` is used as it is, with a warning) and at-least-once
  dead-lettering (``x-dead-letter-strategy: at-least-once``, which needs ``x-overflow:
  reject-publish``) through the default exchange into
- ``<namespace>.dead-letter``: a durable quorum queue the transport drains into the state
  store's dead letters (``custody.py``).

The connection's heartbeat timeout is a third of the visibility timeout (2 to 60 s,
:func:`heartbeat_for`; a ``?heartbeat=`` in the URL wins), so RabbitMQ closes the connection of
a frozen (``SIGSTOP``, stopped in a debugger) worker and redelivers its unacked messages after
about the visibility timeout; aio-pika answers heartbeats from the event loop, which a
responsive worker keeps running.

A declaration is idempotent while the arguments agree; a queue declared earlier with other
arguments (another ``max_deliveries``) is refused by RabbitMQ (``PRECONDITION_FAILED``),
reported as a :class:`~blitzq.exceptions.ConfigurationError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from ...exceptions import BlitzQError, BrokerError, BrokerRefusedSettings, ConfigurationError
from ...redaction import mask_url
from ..factory import AMQP_RESERVED_QUEUE, amqp_hosts, check_amqp_queue, without_pack
from ..transport import delivery_backstop
from .closing import FAILURES, CloseNotice, describe
from .deliveries import Received
from .frames import read_in_bulk
from .injected import Borrowed
from .tap import tap_confirms

logger = logging.getLogger("blitzq.broker.amqp")

_Method = TypeVar("_Method", bound=Callable[..., Any])

#: Suffix of the namespace's dead-letter queue (``<namespace>.dead-letter``).
DEAD_LETTER_SUFFIX = AMQP_RESERVED_QUEUE

#: Header carrying the deliveries a message had before it was published again from the
#: state store's custody (``custody.py``).
DELIVERIES = "x-blitzq-deliveries"

#: Seconds to wait for RabbitMQ to accept a connection.
CONNECT_TIMEOUT = 10.0

#: Longest AMQP heartbeat timeout blitzq asks for (seconds; aio-pika's own default).
MAX_HEARTBEAT = 60


def heartbeat_for(visibility_timeout: float) -> int:
    """The AMQP heartbeat timeout (whole seconds) for a Queue's visibility timeout: a third
    of it, at least 2 and at most :data:`MAX_HEARTBEAT`. RabbitMQ closes a connection that
    sent nothing for two to three heartbeat timeouts (measured on RabbitMQ 3.x: 3 x) -- a
    frozen or paused process; a responsive event loop sends one every half timeout -- and
    redelivers its unacked messages, so a frozen worker's deliveries come back after about
    the visibility timeout (at least some 6 s)."""
    return max(2, min(MAX_HEARTBEAT, round(visibility_timeout / 3)))


#: Reply codes of a ``connection.close`` that no retry cures (a wrong vhost or login).
REFUSALS = {403: "ACCESS_REFUSED", 530: "NOT_ALLOWED"}


def server_close(exc: BaseException) -> tuple[int, str] | None:
    """The ``(reply_code, reply_text)`` of the ``connection.close`` RabbitMQ answered a
    connection attempt with, when ``exc`` came from it: aiormq reports a close in reply to
    ``connection.open`` (an unknown vhost, a vhost the user may not use) as an
    ``InvalidFrameError`` naming only the frame's class, so the frame is looked up in the
    frames of the traceback (``None`` when not found)."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame.f_locals.get("frame")
        if isinstance(frame, aiormq.spec.Connection.Close):
            return int(frame.reply_code or 0), str(frame.reply_text or "")
        tb = tb.tb_next
    return None


def translate(exc: BaseException, what: str) -> Exception:
    """The blitzq error for an aio-pika/aiormq failure while doing ``what``: RabbitMQ's
    refusal of a login or vhost in its own words, a
    :class:`~blitzq.exceptions.BrokerRefusedSettings` (a configuration error: never
    retried). A blitzq error (one of the transport's own, raised inside a ``try`` that
    catches :data:`FAILURES`) is returned as it is."""
    if isinstance(exc, BlitzQError):
        return exc
    closed = server_close(exc) if isinstance(exc, aiormq.exceptions.AMQPError) else None
    if closed is not None:
        code, text = closed
        if code == 530:
            return BrokerRefusedSettings(
                f"RabbitMQ refused the virtual host of the AMQP URL ({what}): {code} {text} "
                "(use one that exists and that the user may use: the URL's path, "
                "amqp://host:port/VHOST, %2F for the default '/')"
            )
        if code in REFUSALS:
            return BrokerRefusedSettings(
                f"RabbitMQ refused the AMQP URL's credentials ({what}): {code} {text} "
                "(check the user name and password in the URL)"
            )
        return BrokerError(f"RabbitMQ closed the connection ({what}): {code} {text}")
    if isinstance(
        exc, (aiormq.exceptions.ProbableAuthenticationError, aiormq.exceptions.AuthenticationError)
    ):
        return BrokerRefusedSettings(
            f"RabbitMQ refused the AMQP URL's credentials ({what}): {exc} (check the user "
            "name and password in the URL)"
        )
    if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        return ConfigurationError(
            f"RabbitMQ refused {what}: {exc} (a queue of this name was declared with other "
            "arguments: another max_deliveries, or it is another namespace's queue -- "
            "namespace 'a' with queue 'x.q' and namespace 'a.x' with queue 'q' are both "
            "'a.x.q' -- or not blitzq's; delete it or use another namespace or queue name)"
        )
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        return BrokerError(f"RabbitMQ refused {what}: {exc}", transient=False)
    return BrokerError(f"RabbitMQ: {what} failed: {describe(exc)}")


def given_up(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``CancelledError`` that aiormq raised into a call because it gave
    the connection up (no frame for three heartbeat timeouts: it cancels its reader, and the
    calls waiting on that connection are cancelled with it) rather than a cancellation of the
    calling task itself (``Task.cancelling()`` is then 0)."""
    task = asyncio.current_task()
    return isinstance(exc, asyncio.CancelledError) and task is not None and not task.cancelling()


def guarded(method: _Method) -> _Method:
    """Make a coroutine method of the transport raise a transient
    :class:`~blitzq.exceptions.BrokerError` where aiormq cancelled it because the connection
    was given up (:func:`given_up`): a worker's fetch loop, which outlives any error but not
    a cancellation, then fetches again (and reconnects) instead of ending quietly. An error
    of a call whose connection was lost meanwhile (``CloseNotice`` logged that loss) is marked
    :attr:`~blitzq.exceptions.BrokerError.reported`: its callers log it at DEBUG."""

    @functools.wraps(method)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        link: AmqpLink | None = getattr(args[0], "link", None) if args else None
        epoch = link.epoch if link is not None and link.connected else None
        try:
            return await method(*args, **kwargs)
        except asyncio.CancelledError as exc:
            if not given_up(exc):
                raise
            error = BrokerError(
                "RabbitMQ: the connection was given up (no frame within three heartbeat "
                "timeouts: a silent network or server); connecting again"
            )
            error.reported = link is not None and epoch is not None
            raise error from None
        except BrokerError as exc:
            if link is not None and epoch is not None and link.lost_since(epoch):
                exc.reported = True  # the loss was logged once, where it was noticed
            raise

    return wrapper  # type: ignore[return-value]


def unconfirmed(exc: BaseException, what: str) -> Exception:
    """:func:`translate` for a publish that failed after its message was sent (connection
    or channel lost, confirm timed out, ``basic.nack``): RabbitMQ may have queued the message
    all the same (a quorum queue may nack a publish its log commits later), so the error says
    that the outcome is unknown. A refusal (:class:`~blitzq.exceptions.ConfigurationError`, a
    non-transient error) and a returned (unroutable) message are certain: kept as is."""
    error = translate(exc, what)
    returned = isinstance(exc, aiormq.exceptions.DeliveryError) and isinstance(
        exc.frame, aiormq.spec.Basic.Return
    )  # unroutable: certainly not queued (a nack from a quorum queue is not that certain)
    if isinstance(error, BrokerError) and error.transient and not returned:
        return BrokerError(
            f"{error} (unconfirmed: the message may still have reached RabbitMQ and run; "
            "enqueue again with the same task_id if a duplicate matters)"
        )
    return error


class AmqpLink:
    """An AMQP connection with its channels and declared queues (see the module docstring).

    Args:
        url: an ``amqp://`` or ``amqps://`` URL (user, password, host, port, vhost).
        namespace: prefix of every queue name (``<namespace>.<queue>``).
        max_deliveries: deliveries of one message before RabbitMQ dead-letters it (>= 1).
        heartbeat: the connection's heartbeat timeout in seconds (see :func:`heartbeat_for`),
            unless the URL gives ``?heartbeat=``; ``None``: aio-pika's default (60 s).
        borrowed: the application's connection or pool (``Queue(amqp_connection=...)``,
            :mod:`.injected`): used instead of a connection of the link's own, never
            closed (only the link's channels are); ``url`` then only names it.
    """

    def __init__(
        self,
        url: str,
        namespace: str,
        max_deliveries: int,
        heartbeat: int | None = None,
        borrowed: Borrowed | None = None,
    ) -> None:
        self.url = url
        self.borrowed = borrowed
        self.urls = [without_pack(u) for u in amqp_hosts(url)] if borrowed is None else [url]
        """The single-host URLs to try, in order (several: failover, see :meth:`ensure`)."""
        self._current = 0  # the index in ``urls`` of the host last connected to
        urls_set_it = all("heartbeat=" in u.partition("?")[2] for u in self.urls)
        self.heartbeat = None if urls_set_it else heartbeat
        self.namespace = namespace
        self.max_deliveries = max_deliveries
        self.epoch = 0
        self.connection_name = f"blitzq {namespace} pid {os.getpid()}"
        """The name RabbitMQ shows for the connection (``rabbitmqctl list_connections``)."""
        """Counts the connections made: a delivery of an older epoch can no longer be acked."""
        self._conn: aio_pika.abc.AbstractConnection | None = None
        self._publisher: AbstractChannel | None = None
        self._publisher_epoch = 0
        self._declared: dict[str, AbstractQueue] = {}
        self.listeners: list[Callable[[], None]] = []
        """Called when a connection closed (the transport wakes its waiting fetches)."""
        self.used: set[str] = set()
        """Every RabbitMQ queue name this link declared (for a teardown that deletes them)."""
        self._lock = asyncio.Lock()
        self._closer: AsyncGenerator[None, None] | None = None

    # ----------------------------------------------------------------- names
    def name(self, queue: str) -> str:
        """The RabbitMQ queue of the physical queue ``queue``.

        Raises:
            ConfigurationError: ``queue`` is ``dead-letter`` (the dead-letter queue's name).
        """
        check_amqp_queue(queue)
        return f"{self.namespace}.{queue}"

    def physical(self, name: str) -> str:
        """The physical queue of the RabbitMQ queue ``name`` (the inverse of :meth:`name`)."""
        return name.removeprefix(self.namespace + ".")

    @property
    def dead_letter_queue(self) -> str:
        """``<namespace>.dead-letter``."""
        return f"{self.namespace}.{DEAD_LETTER_SUFFIX}"

    def arguments(self, legacy: bool = False) -> dict[str, Any]:
        """Declaration arguments of a blitzq queue; ``legacy``: with the delivery limit of
        earlier versions (``max_deliveries - 1``), which counted crashes that only held a
        message against it."""
        limit = self.max_deliveries if legacy else delivery_backstop(self.max_deliveries)
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": limit - 1,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": self.dead_letter_queue,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }

    # ------------------------------------------------------------ connection
    @property
    def connected(self) -> bool:
        """Whether the connection is open."""
        return self._conn is not None and _alive(self._conn)

    def lost_since(self, epoch: int) -> bool:
        """Whether the connection of ``epoch`` (open then) was lost since: closed, or
        replaced by a newer one."""
        return self.epoch != epoch or not self.connected

    async def ensure(self) -> aio_pika.abc.AbstractConnection:
        """The open connection, made (a new epoch) when there is none or it closed.

        Raises:
            BrokerError: RabbitMQ could not be reached or refused the login.
        """
        conn = self._conn
        if conn is not None and _alive(conn):
            return conn
        async with self._lock:
            if self._conn is not None and _alive(self._conn):
                return self._conn
            if self.borrowed is not None:
                return await self._borrow(self.borrowed)
            await self._drop()
            made = await self._connect()
            if made.transport is not None:  # our own connection: frames read in bulk
                read_in_bulk(made.transport.connection)
            self._conn = made
            self.epoch += 1
            CloseNotice(made, self.connection_name, lambda: self._conn is not made, self.listeners)
            if self._closer is None:  # once per link: it closes whichever connection is open
                self._closer = _close_at_loop_end(self)
                await anext(self._closer)
            return made

    async def _borrow(self, borrowed: Borrowed) -> aio_pika.abc.AbstractConnection:
        """The application's connection (a new epoch when it is another one than before)."""
        conn = await borrowed.get()
        if conn is not self._conn:
            self._conn, self._publisher = conn, None
            self._declared.clear()
            self.epoch += 1
        if self._closer is None:  # gives a pool's connection back when the loop ends
            self._closer = _close_at_loop_end(self)
            await anext(self._closer)
        return conn

    async def _connect(self) -> aio_pika.abc.AbstractConnection:
        """Connect to the first host of :attr:`urls` that answers, starting with the one
        connected to last (then the next ones, wrapping around): failover between RabbitMQ
        nodes. A refused login or vhost is raised at once (every node would refuse it).

        Raises:
            BrokerError: no host could be reached (the last host's error), or a refusal.
        """
        count = len(self.urls)
        error: Exception | None = None
        for step in range(count):
            index = (self._current + step) % count
            url = self.urls[index]
            options: dict[str, Any] = {}
            if self.heartbeat is not None and "heartbeat=" not in url.partition("?")[2]:
                options["heartbeat"] = self.heartbeat
            try:
                made: aio_pika.abc.AbstractConnection = await aio_pika.connect(
                    url,
                    timeout=CONNECT_TIMEOUT,
                    client_properties={"connection_name": self.connection_name},
                    **options,
                )
            except FAILURES as exc:
                error = translate(exc, f"connecting to {mask_url(url)}")
                if isinstance(error, BrokerError) and not error.transient:
                    raise error from None
                if count > 1:
                    logger.warning("RabbitMQ node %s: %s", mask_url(url), error)
                continue
            if index != self._current:
                logger.warning("connected to RabbitMQ node %s instead", mask_url(url))
            self._current = index
            return made
        assert error is not None
        raise error

    async def publisher(self) -> AbstractChannel:
        """The channel publishing (confirm mode, unroutable messages returned as errors)."""
        channel = self._publisher
        if (
            channel is None
            or channel.is_closed
            or not self.connected
            or self._publisher_epoch != self.epoch
        ):
            conn = await self.ensure()
            try:
                channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
                tap_confirms(await channel.get_underlay_channel())
            except FAILURES as exc:
                raise translate(exc, "opening a channel") from None
            self._publisher = channel
            self._publisher_epoch = self.epoch
            self._declared.clear()
        return channel

    async def consumer_channel(self, prefetch: int) -> AbstractChannel:
        """A new channel for one consumer, its prefetch (``basic.qos``) set to ``prefetch``."""
        conn = await self.ensure()
        try:
            channel = await conn.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=prefetch)
        except FAILURES as exc:
            raise translate(exc, "opening a consumer channel") from None
        return channel

    async def declare(self, queue: str) -> AbstractQueue:
        """Declare the quorum queue of ``queue`` (and the dead-letter queue) once per channel.

        Raises:
            ConfigurationError: it exists with other arguments, or ``queue`` is the reserved
                ``dead-letter``.
            BrokerError: RabbitMQ could not be reached.
        """
        name = self.name(queue)  # a reserved name is refused before anything is declared
        channel = await self.publisher()  # a channel opened again forgets the declarations
        declared = self._declared.get(queue)
        if declared is not None:
            return declared
        try:
            if DEAD_LETTER_SUFFIX not in self._declared:
                self._declared[DEAD_LETTER_SUFFIX] = await channel.declare_queue(
                    self.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"}
                )
            declared = await channel.declare_queue(name, durable=True, arguments=self.arguments())
        except aiormq.exceptions.ChannelPreconditionFailed:
            self._publisher = None  # a refused declaration closes the channel
            declared = await self._declare_legacy(name)
        except FAILURES as exc:
            self._publisher = None  # a refused declaration closes the channel
            raise translate(exc, f"declaring queue {name!r}") from None
        self._declared[queue] = declared
        self.used |= {name, self.dead_letter_queue}
        return declared

    async def _declare_legacy(self, name: str) -> AbstractQueue:
        """Declare queue ``name`` with the delivery limit of earlier versions (it exists so);
        warn that RabbitMQ dead-letters by that limit.

        Raises:
            ConfigurationError: it exists with other arguments still.
            BrokerError: RabbitMQ could not be reached.
        """
        channel = await self.publisher()
        try:
            declared = await channel.declare_queue(
                name, durable=True, arguments=self.arguments(legacy=True)
            )
        except FAILURES as exc:
            self._publisher = None
            raise translate(exc, f"declaring queue {name!r}") from None
        logger.warning(
            "queue %r was declared by an earlier blitzq with x-delivery-limit %d: RabbitMQ "
            "dead-letters a message returned that often, also when the crashes were another "
            "task's; delete the queue once empty (or use another namespace) for the limit %d",
            name,
            self.max_deliveries - 1,
            delivery_backstop(self.max_deliveries) - 1,
        )
        return declared

    def forget(self, queue: str) -> None:
        """Forget that ``queue`` was declared (it was deleted: the next use declares it)."""
        self._declared.pop(queue, None)

    async def dead_letters(self) -> AbstractQueue:
        """The declared dead-letter queue."""
        channel = await self.publisher()
        if DEAD_LETTER_SUFFIX not in self._declared:
            try:
                self._declared[DEAD_LETTER_SUFFIX] = await channel.declare_queue(
                    self.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"}
                )
            except FAILURES as exc:
                self._publisher = None
                raise translate(exc, "declaring the dead-letter queue") from None
        return self._declared[DEAD_LETTER_SUFFIX]

    async def message_count(self, queue: str) -> int:
        """Messages ready in ``queue`` (a passive declaration: 0 when it does not exist)."""
        channel = await self.publisher()
        try:
            ok = await (await channel.get_underlay_channel()).queue_declare(
                self.name(queue), passive=True
            )
        except aiormq.exceptions.ChannelNotFoundEntity:
            self._publisher = None  # the refusal closed the channel
            return 0
        except FAILURES as exc:
            raise translate(exc, f"counting queue {self.name(queue)!r}") from None
        return int(ok.message_count or 0)

    async def purge(self, queue: str) -> int:
        """Delete the ready messages of ``queue``; return how many (0 when it does not exist)."""
        channel = await self.publisher()
        try:
            ok = await (await channel.get_underlay_channel()).queue_purge(self.name(queue))
        except aiormq.exceptions.ChannelNotFoundEntity:
            self._publisher = None
            return 0
        except FAILURES as exc:
            raise translate(exc, f"purging queue {self.name(queue)!r}") from None
        return int(ok.message_count or 0)

    async def delete(self, queues: list[str]) -> None:
        """Delete RabbitMQ queues by their full names (tests and teardown)."""
        channel = await self.publisher()
        for name in queues:
            try:
                await (await channel.get_underlay_channel()).queue_delete(
                    name, if_unused=False, if_empty=False
                )
            except FAILURES as exc:
                raise translate(exc, f"deleting queue {name!r}") from None
        self._declared.clear()

    async def _drop(self) -> None:
        publisher = self._publisher
        conn, self._conn, self._publisher = self._conn, None, None
        self._declared.clear()
        if self.borrowed is not None:  # the application's: only our channel is closed
            if publisher is not None and not publisher.is_closed:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(publisher.close(), CONNECT_TIMEOUT)
            await self.borrowed.release()
            return
        if conn is not None and not conn.is_closed:
            try:
                await asyncio.wait_for(conn.close(), CONNECT_TIMEOUT)
            except Exception:  # already going: nothing to release
                return

    async def close(self) -> None:
        """Close the connection (the next call connects again)."""
        await self._drop()


async def _close_at_loop_end(link: AmqpLink) -> AsyncGenerator[None, None]:
    """Close ``link`` when its event loop shuts down (``asyncio.run`` finalizes the async
    generators still suspended), so a program that never closed its Queue does not leave
    aio-pika's close callbacks pending on a closed loop (``Task was destroyed but it is
    pending!`` at exit)."""
    try:
        yield
    finally:
        await link.close()


async def settle(message: AbstractIncomingMessage | Received, ack: bool) -> None:
    """Ack (or nack with requeue) ``message``; a closed channel is not an error (RabbitMQ
    redelivers the message). A :class:`~.deliveries.Received` message is settled through its
    consumer (acks batched) -- a task of a pack (:mod:`.packs`) only counts as settled until
    the pack's last one is, which settles the message; aio-pika's ``message.channel`` itself raises
    ``ChannelInvalidStateError`` (a RuntimeError) once the channel is closed."""
    if isinstance(message, Received):
        if message.pack is not None and not message.pack.settled():
            return  # one task of a pack: the message is settled with its last task
        await message.consumer.settle([message.tag], ack)
        return
    try:
        if message.channel.is_closed:
            return
        if ack:
            await message.ack()
        else:
            await message.nack(requeue=True)
    except FAILURES as exc:
        logger.debug("could not settle delivery %s: %s", message.delivery_tag, exc)


def header_int(headers: dict[str, Any] | None, name: str) -> int:
    """The integer header ``name`` of a message (0 when absent or not an integer)."""
    value = (headers or {}).get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def delivery_count(headers: dict[str, Any]) -> int:
    """A received message's delivery count: the quorum queue's ``x-delivery-count`` + 1 +
    the deliveries before a republish (:data:`DELIVERIES`), each absent = 0; 0 when either
    header is present but no int >= 0 (planted: the worker dead-letters such a delivery as a
    malformed message, as it does a stream entry's bad ``d`` field)."""
    total = 1
    for name in ("x-delivery-count", DELIVERIES):
        value = headers.get(name, 0)
        if type(value) is not int or value < 0:
            return 0
        total += value
    return total


def _alive(conn: aio_pika.abc.AbstractConnection) -> bool:
    """Whether ``conn`` is open: aio-pika clears ``connected`` when the server closes a
    connection, before (or without) marking it closed."""
    return not conn.is_closed and conn.connected.is_set()


__all__ = [
    "DEAD_LETTER_SUFFIX",
    "DELIVERIES",
    "FAILURES",
    "AmqpLink",
    "delivery_count",
    "header_int",
    "settle",
    "translate",
]
