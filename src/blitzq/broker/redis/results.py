"""Push notification of written task records over one pub/sub connection per broker.

A waiter subscribes to ``{ns}:done:<id>``, waits for the server's confirmation, then reads the
record; the completion script publishes on that channel in the same transaction that writes
the record, so a waiter can never miss it. A fallback re-read every ``poll_interval`` seconds
keeps waiters live if the pub/sub connection drops (Redis restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from .client import REDIS_ERRORS
from .cluster import ready

logger = logging.getLogger("blitzq.broker")


class ResultListener:
    """Multiplexes per-task completion channels over one pub/sub connection.

    Args:
        client: the broker's redis client (the pub/sub connection comes from its pool).
    """

    def __init__(self, client: aioredis.Redis) -> None:
        self._client = client
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._waiters: dict[bytes, list[asyncio.Future[bytes]]] = {}
        self._confirmed: dict[bytes, asyncio.Future[None]] = {}
        self._lock = asyncio.Lock()
        self._background: set[asyncio.Future[None]] = set()

    async def subscribe(self, channel: str) -> asyncio.Future[bytes]:
        """Subscribe and return a future resolved with the next message on ``channel``.

        Returns only once the server has confirmed the subscription.
        """
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bytes] = loop.create_future()
        try:
            return await self._subscribe(channel.encode(), fut, loop)
        except (
            Exception,
            asyncio.CancelledError,
        ):  # a caller's deadline, or failed: no waiter left
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
                if self._pubsub is None:
                    await ready(self._client)  # a cluster client: its slot map first
                    self._pubsub = self._client.pubsub()
                await self._pubsub.subscribe(key)
                if self._reader is None or self._reader.done():
                    self._reader = asyncio.create_task(self._read(), name="blitzq-results")
        except (Exception, asyncio.CancelledError):
            if not confirmed.done():  # waiters that joined this one fall back to polling
                confirmed.set_result(None)
            raise
        try:
            await asyncio.wait_for(asyncio.shield(confirmed), timeout=5.0)
        except TimeoutError:
            logger.warning("no confirmation of subscription to %s; falling back to polling", key)
        return fut

    async def unsubscribe(self, channel: str, fut: asyncio.Future[bytes]) -> None:
        """Drop one waiter; unsubscribe from the channel when it was the last."""
        key = channel.encode()
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
        task = asyncio.ensure_future(self.unsubscribe(channel, fut))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def release_later(
        self, channel: str
    ) -> Callable[[asyncio.Future[asyncio.Future[bytes]]], None]:
        """Done-callback for a pending :meth:`subscribe` whose waiter is no longer needed."""

        def done(subscribing: asyncio.Future[asyncio.Future[bytes]]) -> None:
            if not subscribing.cancelled() and subscribing.exception() is None:
                self.release(channel, subscribing.result())

        return done

    async def _read(self) -> None:
        pubsub = self._pubsub
        while self._waiters:
            try:
                message = await pubsub.get_message(timeout=1.0)
            # RuntimeError: a subscribe reconnected the connection at the same time (redis-py
            # reads the handshake in both); the next read goes on with the connection made.
            except (*REDIS_ERRORS, RuntimeError) as exc:
                logger.debug("result listener read failed: %s", exc)
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

    async def close(self) -> None:
        """Stop the reader and close the pub/sub connection."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        if self._pubsub is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                await self._pubsub.aclose()
            self._pubsub = None
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.cancel()
        for confirmed in self._confirmed.values():  # subscribes in flight return at once
            if not confirmed.done():
                confirmed.set_result(None)
        self._waiters.clear()
        self._confirmed.clear()
