"""Push notification of written task records over one pub/sub connection per broker.

A waiter subscribes to ``{ns}:done:<id>``, waits for the server's confirmation, then reads the
record; the completion script publishes there in the transaction that writes the record, so
a waiter never misses it; a re-read every ``poll_interval`` s covers a dropped connection.

Pattern mode (a single server, not a cluster): one ``PSUBSCRIBE {ns}:done:*``, kept while
this process waits and :data:`PATTERN_LINGER` s after, serves every wait (no SUBSCRIBE or
UNSUBSCRIBE per round trip). Over :data:`FLOOD_LIMIT` completions a second nobody here waits
for pause it :data:`FLOOD_PAUSE` s (its waiters read again and subscribe to their channel).

Vouched waits: :meth:`ResultListener.token`, taken just before a message is sent, marks a
point in the completions seen; a wait given it reads nothing while the listener vouches it
saw every completion since (same :attr:`~ResultListener._epoch`, none of the :data:`RECENT`
kept dropped). A reconnect, a pause, the linger's end or an overflow ends the vouching.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from ...log_episodes import Episode
from .client import REDIS_ERRORS, pubsub_send, subscriber
from .cluster import ready
from .keys import glob_escape
from .waits import InFlightWaits, fail

logger = logging.getLogger("blitzq.broker")

#: Seconds the completion pattern stays subscribed after the last wait it served.
PATTERN_LINGER = 2.0
#: Completions nobody here waits for, within one second, that make the listener drop the
#: pattern (each costs a little of this process's CPU and of the server's output).
FLOOD_LIMIT = 500
#: Seconds the listener uses one channel per wait after dropping the pattern for a flood.
FLOOD_PAUSE = 30.0
#: Completions the pattern brought that the listener keeps (the latest per channel), so a
#: vouched wait that starts after its task's completion still finds it.
RECENT = 1024
#: Seconds a subscription may wait for the server's confirmation before its wait polls.
CONFIRM_TIMEOUT = 5.0
#: Seconds without an unconfirmed subscription that end an episode of them (one line each).
UNCONFIRMED_SETTLE = 30.0
_EPOCHS = itertools.count()


class ResultListener:
    """Multiplexes per-task completion channels over one pub/sub connection.

    Args:
        client: the broker's redis client (pub/sub beside its pool: ``client.subscriber``).
        done_prefix: the completion channels' common start (``{ns}:done:``) to serve with
            one pattern subscription (pattern mode, see the module docs); ``None`` (a
            cluster): one channel per wait always.
    """

    def __init__(self, client: aioredis.Redis, done_prefix: str | None = None) -> None:
        self._client = client
        self._prefix = done_prefix.encode() if done_prefix else None
        self._pattern = (glob_escape(done_prefix) + "*").encode() if done_prefix else b""
        #: Waiters served by the pattern, by channel (no SUBSCRIBE of their own).
        self._pattern_waiters: dict[bytes, list[asyncio.Future[bytes]]] = {}
        #: Resolved once the server confirmed the pattern; ``None`` while not subscribed.
        self._pattern_on: asyncio.Future[None] | None = None
        self._pattern_unconfirmed: asyncio.Future[None] | None = None  # logged as late
        self._pattern_idle_since = self._pattern_paused_until = self._unwanted_since = 0.0
        self._unwanted = 0
        #: Renewed whenever completions may have been missed (reconnect, pause, linger end);
        #: unique in the process, so a mark of another listener (loop) never vouches here.
        self._epoch = next(_EPOCHS)
        #: Completions seen through the pattern; the newest dropped from ``_recent``.
        self._seq = self._dropped = 0
        self._recent: dict[bytes, tuple[int, bytes]] = {}
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._waiters: dict[bytes, list[asyncio.Future[bytes]]] = {}
        self._confirmed: dict[bytes, asyncio.Future[None]] = {}
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Future[Any]] = set()
        self.waits = InFlightWaits()  #: the record waits in flight, ended by :meth:`close`
        #: Subscriptions left unconfirmed (a busy server or connection): one WARNING when
        #: they start, one INFO with their count when confirmations come back in time.
        self.unconfirmed = Episode(
            logger,
            f"no confirmation of a subscription within {CONFIRM_TIMEOUT:.0f} s; its wait "
            "falls back to polling (counted until confirmations come back)",
            settle=UNCONFIRMED_SETTLE,
        )

    async def subscribe(self, channel: str) -> asyncio.Future[bytes]:
        """Subscribe and return a future resolved with the next message on ``channel``;
        returns only once the server has confirmed the subscription (or the pattern)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()
        key = channel.encode()
        if self._uses_pattern(key):
            self._pattern_waiters.setdefault(key, []).append(fut)
            try:
                await self._ensure_pattern(loop)
            except (Exception, asyncio.CancelledError):
                fut.cancel()
                self._drop_pattern_waiter(key, fut)
                raise
            return fut
        try:
            return await self._subscribe(key, fut, loop)
        except (Exception, asyncio.CancelledError):  # a deadline, or failed: no waiter left
            fut.cancel()
            self.release(channel, fut)
            raise

    async def _subscribe(
        self, key: bytes, fut: asyncio.Future[bytes], loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[bytes]:
        waiters = self._waiters.setdefault(key, [])
        waiters.append(fut)
        if len(waiters) > 1:
            confirmed = self._confirmed.get(key)
            if confirmed is not None:
                await asyncio.shield(confirmed)
            return fut
        confirmed = loop.create_future()
        self._confirmed[key] = confirmed
        try:
            async with self._lock:
                await pubsub_send((await self._opened()).subscribe(key))
                self._ensure_reader()
        except (Exception, asyncio.CancelledError):
            if not confirmed.done():  # waiters that joined this one fall back to polling
                confirmed.set_result(None)
            raise
        try:
            await asyncio.wait_for(asyncio.shield(confirmed), timeout=CONFIRM_TIMEOUT)
        except TimeoutError:
            self.unconfirmed.failed(key.decode(errors="replace"))
        else:
            self.unconfirmed.cleared()
        return fut

    async def _opened(self) -> Any:
        """The pub/sub connection, opened beside the pool (``subscriber``) at first use."""
        if self._pubsub is None:
            await ready(self._client)  # a cluster client: its slot map first
            self._pubsub = subscriber(self._client)
        return self._pubsub

    def _ensure_reader(self) -> None:
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read(), name="blitzq-results")

    def register(self, channel: str) -> asyncio.Future[bytes] | None:
        """A waiter on ``channel`` at once, without a command, when the confirmed pattern
        serves it; else ``None`` (then :meth:`subscribe`)."""
        key = channel.encode()
        on = self._pattern_on
        if on is None or not on.done() or not self._uses_pattern(key):
            return None
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._pattern_waiters.setdefault(key, []).append(fut)
        return fut

    def renew(self, channel: str, fut: asyncio.Future[bytes]) -> asyncio.Future[bytes] | None:
        """A fresh waiter in the place of ``fut`` (cancelled by its wait's own timeout), with
        no command; ``None`` when ``fut`` is no waiter any more (then :meth:`subscribe`)."""
        key = channel.encode()
        for waiters in (self._pattern_waiters.get(key), self._waiters.get(key)):
            if waiters is not None and fut in waiters:
                new: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
                waiters[waiters.index(fut)] = new
                return new
        return None

    def token(self) -> tuple[int, int] | None:
        """A mark in the completions seen, for a message about to be sent; ``None`` when the
        listener could not vouch for what follows (the pattern is not confirmed)."""
        on = self._pattern_on
        if on is None or not on.done() or time.monotonic() < self._pattern_paused_until:
            return None
        return (self._epoch, self._seq)

    def vouched(self, channel: str, token: tuple[int, int]) -> bytes | asyncio.Future[bytes] | None:
        """For a task sent after ``token`` was taken: its completion pushed since (bytes),
        or a waiter registered for it with no read needed (a future), or ``None`` when the
        listener cannot vouch any more (read and wait as usual)."""
        epoch, seq = token
        if epoch != self._epoch or self._dropped > seq or self.token() is None:
            return None
        key = channel.encode()
        seen = self._recent.get(key)
        if seen is not None and seen[0] > seq:  # ``1``: too big to push, read it
            return seen[1] if seen[1] != b"1" else None
        return self.register(channel)

    def _forget(self) -> None:
        """Completions may have been missed: end every token's vouching."""
        self._epoch = next(_EPOCHS)
        self._recent.clear()

    def _uses_pattern(self, key: bytes) -> bool:
        return (
            self._prefix is not None
            and key.startswith(self._prefix)
            and time.monotonic() >= self._pattern_paused_until
        )

    async def _ensure_pattern(self, loop: asyncio.AbstractEventLoop) -> None:
        """PSUBSCRIBE the completion pattern unless done; wait for the confirmation (at most
        5 s: then the waiter relies on its re-reads)."""
        on = self._pattern_on
        if on is None:
            on = self._pattern_on = loop.create_future()
            try:
                async with self._lock:
                    await pubsub_send((await self._opened()).psubscribe(self._pattern))
                    self._ensure_reader()
            except (Exception, asyncio.CancelledError):
                if self._pattern_on is on:
                    self._pattern_on = None
                if not on.done():  # waiters that joined this one fall back to polling
                    on.set_result(None)
                raise
        if not on.done():
            try:
                await asyncio.wait_for(asyncio.shield(on), timeout=CONFIRM_TIMEOUT)
            except TimeoutError:
                if on is not self._pattern_unconfirmed:  # once per subscription, not per wait
                    self._pattern_unconfirmed = on
                    logger.warning("no confirmation of the completion pattern; polling meanwhile")

    def _drop_pattern_waiter(self, key: bytes, fut: asyncio.Future[bytes]) -> bool:
        """Remove a pattern waiter; whether it was one."""
        waiters = self._pattern_waiters.get(key)
        if waiters is None or fut not in waiters:
            return False
        waiters.remove(fut)
        if not waiters:
            del self._pattern_waiters[key]
            if not self._pattern_waiters:
                self._pattern_idle_since = time.monotonic()
        return True

    def _pause_pattern(self) -> None:
        """Too many completions nobody here waits for: serve waits by channel for a while.
        The pattern's waiters are woken with a bare notification (they read the record again
        and subscribe anew, now to their own channel); the reader sends the PUNSUBSCRIBE."""
        logger.debug("completion pattern paused for %.0f s: busy namespace", FLOOD_PAUSE)
        self._pattern_paused_until = time.monotonic() + FLOOD_PAUSE
        self._forget()
        self._wake_pattern_waiters()

    def _refuse_pattern(self, error: Exception, on: asyncio.Future[None]) -> None:
        """The server refused the PSUBSCRIBE (an ACL without that pattern): one channel per
        wait from now on; the pattern's waiters read again and subscribe so."""
        logger.warning("completion pattern refused (%s): waiting channel by channel", error)
        self._prefix = self._pattern_on = None
        on.set_result(None)
        self._wake_pattern_waiters()

    def _wake_pattern_waiters(self) -> None:
        """Wake every pattern waiter with a bare notification: each reads its record again."""
        for waiters in self._pattern_waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(b"1")

    async def _leave_pattern(self) -> None:
        """PUNSUBSCRIBE (idle past the linger, or paused); runs in the reader. Under the
        lock, so a PSUBSCRIBE asked for meanwhile goes out after it."""
        async with self._lock:
            on = self._pattern_on
            if on is None or not self._pattern_done():  # a wait came meanwhile
                return
            if not on.done():
                on.set_result(None)
            self._pattern_on = None
            self._forget()
            with contextlib.suppress(*REDIS_ERRORS, AttributeError, RuntimeError):
                await self._pubsub.punsubscribe(self._pattern)

    def _pattern_done(self) -> bool:
        """Whether the subscribed pattern should go: paused, or idle past the linger."""
        if self._pattern_on is None:
            return False
        now = time.monotonic()
        if now < self._pattern_paused_until:
            return True
        return not self._pattern_waiters and now - self._pattern_idle_since > PATTERN_LINGER

    async def unsubscribe(self, channel: str, fut: asyncio.Future[bytes]) -> None:
        """Drop one waiter; unsubscribe from the channel when it was the last."""
        key = channel.encode()
        if self._drop_pattern_waiter(key, fut):
            return
        waiters = self._waiters.get(key)
        if waiters is None:
            return
        with contextlib.suppress(ValueError):
            waiters.remove(fut)
        if waiters:
            return
        del self._waiters[key]
        self._confirmed.pop(key, None)
        if self._pubsub is not None:
            # AttributeError: redis-py's answer when close() shut the connection meanwhile;
            # RuntimeError: the reader is reconnecting the same connection (a failover).
            with contextlib.suppress(*REDIS_ERRORS, AttributeError, RuntimeError):
                await self._pubsub.unsubscribe(key)

    def release(self, channel: str, fut: asyncio.Future[bytes]) -> None:
        """Drop a waiter without waiting: the unsubscribe runs in the background."""
        if not self._drop_pattern_waiter(channel.encode(), fut):
            self.in_background(asyncio.ensure_future(self.unsubscribe(channel, fut)))

    def in_background(self, task: asyncio.Future[Any]) -> None:
        """Keep ``task`` (nobody awaits it any more) until it ends; :meth:`close` cancels it."""
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _read(self) -> None:
        pubsub = self._pubsub
        while self._waiters or self._pattern_on is not None:
            if self._pattern_done():
                await self._leave_pattern()
                continue
            try:
                message = await pubsub.get_message(timeout=1.0)
            # RuntimeError: a subscribe reconnected the connection at the same time (redis-py
            # reads the handshake in both); the next read goes on with the connection made.
            except (*REDIS_ERRORS, RuntimeError) as exc:
                logger.debug("result listener read failed: %s", exc)
                self._forget()
                on = self._pattern_on
                if isinstance(exc, ResponseError) and on is not None and not on.done():
                    self._refuse_pattern(exc, on)
                await asyncio.sleep(0.2)
                continue
            if message is None:
                continue
            kind = message["type"]
            channel = message["channel"]
            if kind == "subscribe":
                confirmed = self._confirmed.get(channel)
                if confirmed is not None and not confirmed.done():
                    confirmed.set_result(None)
            elif kind == "message":
                for fut in self._waiters.get(channel, ()):
                    if not fut.done():
                        fut.set_result(message["data"])
                await asyncio.sleep(0)  # the woken waiters go first (the result's path)
            elif kind == "pmessage" and self._pattern_message(channel, message["data"]):
                await asyncio.sleep(0)
            elif kind == "psubscribe":
                on = self._pattern_on
                if on is not None and not on.done():
                    on.set_result(None)
                else:  # subscribed again after a reconnect: pushes may have been lost
                    self._forget()
                    self._wake_pattern_waiters()

    def _pattern_message(self, channel: bytes, data: bytes) -> bool:
        """A completion through the pattern: keep it among the recent ones, wake its
        waiters, or count it as unwanted. Whether it had waiters."""
        self._seq += 1
        recent = self._recent
        recent.pop(channel, None)
        recent[channel] = (self._seq, data)
        if len(recent) > RECENT:
            self._dropped = recent.pop(next(iter(recent)))[0]  # the oldest
        waiters = self._pattern_waiters.get(channel)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(data)
            return True
        now = time.monotonic()
        if now - self._unwanted_since > 1.0:
            self._unwanted_since, self._unwanted = now, 0
        self._unwanted += 1
        if self._unwanted > FLOOD_LIMIT and now >= self._pattern_paused_until:
            self._pause_pattern()
        return False

    async def close(self) -> None:
        """End the record waits in flight (:class:`~.waits.InFlightWaits`), stop the reader
        and the subscribes and unsubscribes nobody awaits, close the pub/sub connection."""
        await self.waits.end(self._waiters, self._pattern_waiters)
        reader = [self._reader] if self._reader is not None else []
        self._reader = None
        for _ in range(3):  # a cancelled subscribe releases its waiter: one more unsubscribe
            left = [*reader, *self._background]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
        if self._pubsub is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                await self._pubsub.aclose()
            self._pubsub = None
        fail(self._waiters, self._pattern_waiters)
        for confirmed in self._confirmed.values():  # subscribes in flight return at once
            if not confirmed.done():
                confirmed.set_result(None)
        if self._pattern_on is not None and not self._pattern_on.done():
            self._pattern_on.set_result(None)
        self._pattern_on = None
        self._forget()
        for held in (self._pattern_waiters, self._waiters, self._confirmed):
            held.clear()
