"""What both Redis brokers share: connection, schedule, records, dead letters, inspection.

The two modes differ only in where a queue's messages wait (a stream with a consumer group, or
a list) and so in publish, fetch, ack, heartbeat and recovery; see ``reliable.py`` and
``fast.py``. Every Redis command blitzq sends lives under this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Sequence
from typing import Any, ClassVar, TypeVar

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError, ResponseError

from ...exceptions import BrokerError, ConfigurationError
from ...limits import (
    CHUNK_ITEMS,
    CHUNK_WRITES,
    DEFAULT_DEAD_LETTER_MAX_BYTES,
    DEFAULT_DEAD_LETTER_TTL,
    NOTIFY_INLINE_MAX,
)
from .. import Broker, Completion, DeadLetterFields, Scheduled
from ..ops import encode_op
from .client import REDIS_ERRORS, broker_error, make_client, max_block, pool_size, translate_errors
from .control import RedisControl
from .keys import GROUP, Keys
from .results import ResultListener
from .scripts import Scripts

R = TypeVar("R")

logger = logging.getLogger("blitzq.broker")

#: Dead letters kept per namespace before the oldest are dropped.
DEFAULT_DEAD_LETTER_CAP = 100_000
#: Keys read by one MGET (a bounded reply, a short server call).
READ_CHUNK = 100

#: Prefix of a message on the event channel -> the kind ``events()`` yields.
_EVENT_KINDS = {"r": "revoke", "s": "schedule"}


_batch_encoder = msgspec.msgpack.Encoder()


def _lua_bytes(data: bytes) -> msgspec.Raw:
    """``data`` as a MessagePack *str*: the ``cmsgpack`` in Redis/Valkey Lua rejects *bin*.

    Lua strings are byte strings, so the bytes arrive unchanged.
    """
    n = len(data)
    if n < 256:
        return msgspec.Raw(b"\xd9" + n.to_bytes(1, "big") + data)
    if n < 65536:
        return msgspec.Raw(b"\xda" + n.to_bytes(2, "big") + data)
    return msgspec.Raw(b"\xdb" + n.to_bytes(4, "big") + data)


_EMPTY = msgspec.Raw(b"\xa0")


def _lua_op(op: tuple[Any, ...]) -> list[Any]:
    """A completion op with its bytes items made Lua-readable (see :func:`_lua_bytes`)."""
    return [
        _lua_bytes(item)
        if isinstance(item, bytes)
        else _lua_op(item)
        if isinstance(item, tuple)
        else item
        for item in op
    ]


def _raw(response: Any, **_: Any) -> Any:
    return response


#: Seconds a result or workflow wait may overrun its timeout while a command is in flight.
WAIT_GRACE = 1.0


async def _bounded(wait: Coroutine[Any, Any, R], timeout: float) -> R:
    """Run ``wait``; past ``timeout`` + :data:`WAIT_GRACE` seconds cancel it.

    Raises:
        BrokerError: (transient) the deadline passed with a command still unanswered.
    """
    try:
        async with asyncio.timeout(max(0.0, timeout) + WAIT_GRACE):
            return await wait
    except TimeoutError:
        raise BrokerError(
            f"Redis did not answer within {max(0.0, timeout) + WAIT_GRACE:.1f} s", True
        ) from None


#: ``reason`` of a dead-letter entry whose key holds another type than a hash.
UNREADABLE_DEAD_LETTER = "unreadable entry"


def _unreadable_dead_letter() -> DeadLetterFields:
    """The fields shown for a dead-letter entry whose key is not a hash (reading it gave
    ``WRONGTYPE``): marked :data:`UNREADABLE_DEAD_LETTER`, with an empty message."""
    return DeadLetterFields(
        message=b"",
        reason=UNREADABLE_DEAD_LETTER,
        error="the dead-letter key is not a hash (planted or damaged); purge it",
        task="",
        queue="",
        failed_at=0.0,
        kind="",
    )


class RedisBroker(RedisControl, Broker):
    """Base of the Redis brokers.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL.
        namespace: key namespace; every key is prefixed ``{namespace}:``.
        dead_letter_cap: dead letters kept before the oldest are dropped.
        dead_letter_ttl: seconds a dead letter is kept.
        dead_letter_max_bytes: total bytes of dead letters kept before the oldest are
            dropped.
        client: an existing ``redis.asyncio.Redis`` to use instead of ``url`` (not closed by
            the broker).

    Raises:
        ConfigurationError: a query parameter of ``url`` has an invalid value.
    """

    kind: ClassVar[str]
    """``"s"`` for streams, ``"l"`` for lists: where this mode keeps a queue's messages."""
    consumer: str = ""
    """This process's consumer name in the streams' group (reliable mode; fencing)."""

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        dead_letter_cap: int = DEFAULT_DEAD_LETTER_CAP,
        client: aioredis.Redis | None = None,
        dead_letter_ttl: int = DEFAULT_DEAD_LETTER_TTL,
        dead_letter_max_bytes: int = DEFAULT_DEAD_LETTER_MAX_BYTES,
    ) -> None:
        self.url = url
        self.keys = Keys(namespace)
        self.dead_letter_cap = dead_letter_cap
        self.dead_letter_ttl = int(dead_letter_ttl)
        self.dead_letter_max_bytes = dead_letter_max_bytes
        self._owns_client = client is None
        # Typed as Any: redis-py's stubs type replies as bytes | str whatever decode_responses is.
        if client is None:
            try:  # a bounded blocking pool with timeouts: see client.py
                client = make_client(url)
            except ValueError as exc:
                raise ConfigurationError(f"bad broker URL {url!r}: {exc}") from None
        self.client: Any = client
        #: Longest BLOCK a blocking read may ask for: under the socket timeout (None: any).
        self.max_block = max_block(client)
        for command in ("XREADGROUP", "XAUTOCLAIM", "BLMPOP", "LPOP"):
            self.client.set_response_callback(command, _raw)
        #: Runs the Lua scripts (EVALSHA, reloaded on NOSCRIPT): see scripts.py.
        self.scripts = Scripts(self.client)
        self._results = ResultListener(self.client)

    def queue_key(self, queue: str) -> str:
        """Key where ``queue``'s messages wait in this mode."""
        raise NotImplementedError

    def block_for(self, timeout: float) -> float:
        """``timeout`` (seconds) cut to :attr:`max_block`, for a blocking command.

        A block longer than the socket timeout would end in a read timeout; the fetch loop
        simply fetches again after a shorter one.
        """
        limit = self.max_block
        return timeout if limit is None or timeout <= limit else limit

    # ------------------------------------------------------------ completions
    @translate_errors
    async def complete(self, completions: Sequence[Completion]) -> list[Completion]:
        """Apply a batch of completions in one Lua call (one round-trip, atomic).

        The batch travels as one MessagePack argument that the script unpacks with
        ``cmsgpack``: building a handful of arguments per completion in redis-py cost more
        than the whole server-side work. Stream completions are fenced in the script (see
        :meth:`Broker.complete`); the stale ones are returned.
        """
        if not completions:
            return []
        entries: list[Any] = []
        acks: dict[str, list[bytes]] = {}
        kind = self.kind
        for c in completions:
            if (
                c.record is None
                and c.reschedule is None
                and c.dead_letter is None
                and c.requeue is None
                and not c.ops
            ):
                if c.token is not None:
                    acks.setdefault(c.queue, []).append(c.token)
                continue
            d = c.dead_letter
            entries.append(
                (
                    "C",
                    kind,
                    c.queue,
                    _lua_bytes(c.token) if c.token else _EMPTY,
                    c.task_id,
                    _lua_bytes(c.record) if c.record else _EMPTY,
                    c.record_ttl,
                    _lua_bytes(c.reschedule) if c.reschedule else _EMPTY,
                    float(c.delay),
                    (_lua_bytes(d.message), d.reason, d.error, d.task, d.queue, d.failed_at)
                    if d
                    else _EMPTY,
                    _lua_bytes(c.requeue) if c.requeue else _EMPTY,
                    [_lua_op(encode_op(op)) for op in c.ops] if c.ops else _EMPTY,
                    _lua_bytes(c.fence) if c.fence else _EMPTY,
                )
            )
        for queue, tokens in acks.items():
            entries.append(("A", queue, [_lua_bytes(t) for t in tokens]))
        if not entries:
            return []
        keys = self.keys
        stale = await self.scripts.call(
            "complete",
            keys=[keys.schedule, keys.schedule_data, keys.dead_letters],
            args=[
                keys.prefix, GROUP, self.dead_letter_cap, _batch_encoder.encode(entries),
                self.dead_letter_ttl, self.dead_letter_max_bytes, NOTIFY_INLINE_MAX,
                self.consumer,
            ],
        )  # fmt: skip
        if not stale:
            return []
        wanted = {(q.decode(), bytes(t)) for q, t in stale}
        return [c for c in completions if (c.queue, c.token or c.fence) in wanted]

    @translate_errors
    async def acquire_rate(self, buckets: Sequence[tuple[str, float, float]]) -> tuple[bool, float]:
        """Reserve a token from each bucket in one script run on server time."""
        keys = [self.keys.rate_limit(key) for key, _, _ in buckets]
        args: list[float] = []
        for _, rate, capacity in buckets:
            args += (rate, capacity)
        reserved, wait = await self.scripts.call("rate_acquire", keys=keys, args=args)
        return reserved in (b"1", "1", 1), float(wait)

    # --------------------------------------------------------------- schedule
    @translate_errors
    async def schedule(self, items: Sequence[Scheduled]) -> None:
        """Put messages on the schedule; due times on the server's clock.

        One script run per :data:`~blitzq.limits.CHUNK_WRITES` items (each item is atomic, a
        large batch is not), so no call holds the server long.
        """
        keys = self.keys
        kind = self.kind.encode()
        for start in range(0, len(items), CHUNK_WRITES):
            args: list[Any] = [keys.events]
            for item in items[start : start + CHUNK_WRITES]:
                args += (
                    item.task_id,
                    "" if item.eta is None else repr(float(item.eta)),
                    repr(float(item.delay)),
                    kind + item.queue.encode() + b"\n" + item.message,
                )
            await self.scripts.call("schedule", keys=[keys.schedule, keys.schedule_data], args=args)

    @translate_errors
    async def cancel(self, task_id: str, record: bytes, ttl: int) -> str:
        """Cancel atomically (one script): off the schedule, or revoked and announced."""
        keys = self.keys
        answer = await self.scripts.call(
            "cancel",
            keys=[keys.schedule, keys.schedule_data, keys.revoked, keys.record(task_id)],
            args=[keys.prefix, task_id, repr(time.time()), ttl, record],
        )
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    @translate_errors
    async def revoked(self) -> dict[str, float]:
        """Revoked ids whose mark has not expired, read :data:`~blitzq.limits.CHUNK_ITEMS` per
        call (pages by offset), so a mass cancel makes no single long read."""
        out: dict[str, float] = {}
        now, offset = time.time(), 0
        while True:
            rows = await self.client.zrangebyscore(
                self.keys.revoked, now, "+inf", start=offset, num=CHUNK_ITEMS, withscores=True
            )
            out.update((member.decode(errors="replace"), float(score)) for member, score in rows)
            if len(rows) < CHUNK_ITEMS:
                return out
            offset += len(rows)

    async def events(self) -> AsyncIterator[tuple[str, str]]:
        """Messages of the namespace's event channel, on a pub/sub connection of their own."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            try:
                await pubsub.subscribe(self.keys.events)
                while True:
                    message = await pubsub.get_message(timeout=5.0)
                    if message is None or message.get("type") != "message":
                        continue
                    data = message["data"]
                    # Anyone may publish here: never fail on a payload (the listener
                    # checks the values).
                    text = data.decode(errors="replace") if isinstance(data, bytes) else str(data)
                    kind, _, value = text.partition(":")
                    yield _EVENT_KINDS.get(kind, "unknown"), value
            except REDIS_ERRORS as exc:
                raise broker_error(exc) from exc
        finally:
            with contextlib.suppress(*REDIS_ERRORS):
                await pubsub.aclose()

    @translate_errors
    async def promote_due(self, limit: int) -> tuple[int, float | None, float]:
        """Move messages due by the server's clock to their queues (one Lua call)."""
        keys = self.keys
        moved, head, now = await self.scripts.call(
            "promote",
            keys=[keys.schedule, keys.schedule_data],
            args=[
                keys.prefix, limit,
                self.dead_letter_cap, self.dead_letter_ttl, self.dead_letter_max_bytes,
            ],
        )  # fmt: skip
        return int(moved), (float(head) if head else None), float(now)

    @translate_errors
    async def scheduled_count(self) -> int:
        """Number of messages waiting on the schedule."""
        return int(await self.client.zcard(self.keys.schedule))

    # --------------------------------------------------------------- periodic
    @translate_errors
    async def server_time(self) -> float:
        """The server's clock, Redis ``TIME`` (Unix seconds)."""
        seconds, micros = await self.client.time()
        return float(seconds) + int(micros) / 1_000_000

    @translate_errors
    async def claim_periodic(
        self, name: str, occurrence: float, message: bytes, queue: str
    ) -> bool:
        """Compare-and-set the last occurrence of ``name`` and publish, in one Lua call on
        the server's clock (see :meth:`Broker.claim_periodic`)."""
        keys = self.keys
        done = await self.scripts.call(
            "claim_periodic",
            keys=[keys.periodic, self.queue_key(queue)],
            args=[name, repr(float(occurrence)), self.kind, message],
        )
        return bool(done)

    @translate_errors
    async def periodic_last(self, names: Sequence[str]) -> dict[str, float]:
        """Last dispatched occurrence of each name that has one (one HMGET)."""
        if not names:
            return {}
        values = await self.client.hmget(self.keys.periodic, list(names))
        return {n: float(v) for n, v in zip(names, values, strict=True) if v is not None}

    # --------------------------------------------------------------- progress
    @translate_errors
    async def set_progress(
        self,
        task_id: str,
        data: bytes,
        at: float,
        ttl: int,
        fence: tuple[str, bytes] | None = None,
    ) -> bool:
        """Store and publish a progress update unless a newer one is stored (one script);
        with ``fence`` only while that delivery is leased to this consumer (reliable mode)."""
        keys = self.keys
        script_keys = [keys.progress(task_id)]
        args: list[Any] = [repr(float(at)), data, ttl, keys.progress_channel(task_id)]
        if fence is not None and self.kind == "s":
            script_keys.append(keys.stream(fence[0]))
            args += (GROUP, self.consumer, fence[1])
        done = await self.scripts.call("progress", keys=script_keys, args=args)
        return bool(done)

    @translate_errors
    async def get_progress(self, task_id: str) -> bytes | None:
        """The latest stored progress update of a task, or ``None``."""
        value: bytes | None = await self.client.hget(self.keys.progress(task_id), "v")
        return value

    async def watch_progress(self, task_id: str) -> AsyncGenerator[tuple[str, bytes], None]:
        """Follow a task's progress and record over the broker's shared pub/sub connection.

        A watcher holds no connection of its own (many watchers would otherwise use up the
        pool); it is woken by the next message on either channel, then subscribes again.
        An update published in between is not lost for good: the stored one is re-read after
        a second without news.
        """
        keys = self.keys
        progress_channel = keys.progress_channel(task_id)
        done_channel = keys.done_channel(task_id)
        listener = self._results
        try:
            progress_fut = await listener.subscribe(progress_channel)
            try:
                done_fut = await listener.subscribe(done_channel)
            except BaseException:
                listener.release(progress_channel, progress_fut)
                raise
        except REDIS_ERRORS as exc:
            raise broker_error(exc) from exc
        try:
            fresh = True
            while True:
                try:
                    if fresh:  # after subscribing, and after a second without news
                        progress = await self.client.hget(keys.progress(task_id), "v")
                        if progress is not None:
                            yield "progress", progress
                        record = await self.client.get(keys.record(task_id))
                        if record is not None:
                            yield "record", record
                    done, _ = await asyncio.wait(
                        (progress_fut, done_fut), timeout=1.0, return_when=asyncio.FIRST_COMPLETED
                    )
                    fresh = not done
                    if progress_fut.done():
                        data = None if progress_fut.cancelled() else progress_fut.result()
                        listener.release(progress_channel, progress_fut)
                        progress_fut = await listener.subscribe(progress_channel)
                        if data is not None:
                            yield "progress", data
                    if done_fut.done():
                        listener.release(done_channel, done_fut)
                        done_fut = await listener.subscribe(done_channel)
                        record = await self.client.get(keys.record(task_id))
                        if record is not None:
                            yield "record", record
                except REDIS_ERRORS as exc:
                    raise broker_error(exc) from exc
        finally:
            listener.release(progress_channel, progress_fut)
            listener.release(done_channel, done_fut)

    # -------------------------------------------------------------- workflows
    @translate_errors
    async def workflow_state(self, workflow_id: str) -> dict[str, bytes] | None:
        """The fields of a workflow's state hash (one HGETALL), or ``None``."""
        raw = await self.client.hgetall(self.keys.workflow(workflow_id))
        return {k.decode(): v for k, v in raw.items()} if raw else None

    async def wait_for_workflow(self, workflow_id: str, timeout: float) -> dict[str, bytes] | None:
        """Wait (pushed on the workflow's channel, re-read every second) until it ends.

        Returns or raises within ``timeout`` + :data:`WAIT_GRACE` seconds whatever the
        network does.

        Raises:
            BrokerError: the server could not be reached, or did not answer in that time
                (transient).
        """
        return await _bounded(self._wait_for_workflow(workflow_id, timeout), timeout)

    @translate_errors
    async def _wait_for_workflow(self, workflow_id: str, timeout: float) -> dict[str, bytes] | None:
        state = await self.workflow_state(workflow_id)
        if timeout <= 0 or state is None or state.get("state") != b"running":
            return state
        deadline = time.monotonic() + timeout
        channel = self.keys.workflow_channel(workflow_id)
        fut = await self._results.subscribe(channel)
        try:
            while True:
                state = await self.workflow_state(workflow_id)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or state is None or state.get("state") != b"running":
                    return state
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(fut), timeout=min(remaining, 1.0))
                if fut.done():
                    self._results.release(channel, fut)
                    fut = await self._results.subscribe(channel)
        finally:
            self._results.release(channel, fut)

    # ---------------------------------------------------------------- records
    @translate_errors
    async def get_record(self, task_id: str) -> bytes | None:
        """The stored record of a task, or ``None``."""
        value: bytes | None = await self.client.get(self.keys.record(task_id))
        return value

    @translate_errors
    async def get_records(self, task_ids: Sequence[str]) -> list[bytes | None]:
        """The stored records of ``task_ids`` in order: one MGET per :data:`READ_CHUNK` ids."""
        out: list[bytes | None] = []
        record = self.keys.record
        for start in range(0, len(task_ids), READ_CHUNK):
            chunk = task_ids[start : start + READ_CHUNK]
            out += await self.client.mget([record(task_id) for task_id in chunk])
        return out

    @translate_errors
    async def set_record(self, task_id: str, record: bytes, ttl: int) -> None:
        """Store a record for ``ttl`` seconds and publish its completion channel."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.record(task_id), record, ex=ttl)
            pipe.publish(self.keys.done_channel(task_id), b"1")
            await pipe.execute()

    @translate_errors
    async def reset_tasks(self, task_ids: Sequence[str]) -> None:
        """DEL the records and progress, ZREM the cancel marks (one MULTI/EXEC)."""
        if not task_ids:
            return
        keys = self.keys
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.delete(*(keys.record(i) for i in task_ids), *(keys.progress(i) for i in task_ids))
            pipe.zrem(keys.revoked, *task_ids)
            await pipe.execute()

    async def wait_for_record(self, task_id: str, timeout: float) -> bytes | None:
        """Wait (pushed, with a 1 s re-read fallback) until a record exists.

        The subscription and the first read go out together; only when that read misses
        does the waiter need the confirmed subscription, read again and wait. Unsubscribing
        happens in the background, off the caller's path. Returns or raises within
        ``timeout`` + :data:`WAIT_GRACE` seconds whatever the network does (a silent server,
        a pool with no free connection).

        Raises:
            BrokerError: the server could not be reached, or did not answer in that time
                (transient).
        """
        return await _bounded(self._wait_for_record(task_id, timeout), timeout)

    @translate_errors
    async def _wait_for_record(self, task_id: str, timeout: float) -> bytes | None:
        if timeout <= 0:
            return await self.get_record(task_id)
        deadline = time.monotonic() + timeout
        channel = self.keys.done_channel(task_id)
        subscribing = asyncio.ensure_future(self._results.subscribe(channel))
        try:
            record = await self.get_record(task_id)
        except BaseException:
            subscribing.add_done_callback(self._results.release_later(channel))
            raise
        if record is not None:
            subscribing.add_done_callback(self._results.release_later(channel))
            return record
        fut = await subscribing
        try:
            while True:
                record = await self.get_record(task_id)
                remaining = deadline - time.monotonic()
                if record is not None or remaining <= 0:
                    return record
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(fut), timeout=min(remaining, 1.0))
                if fut.done():
                    pushed = None if fut.cancelled() else fut.result()
                    if pushed and pushed != b"1":
                        return pushed  # the completion script publishes the record itself
                    # A bare notification: read again; if already expired, wait anew.
                    self._results.release(channel, fut)
                    fut = await self._results.subscribe(channel)
        finally:
            self._results.release(channel, fut)

    # ----------------------------------------------------------- dead letters
    @staticmethod
    def _dead_letter_fields(raw: dict[bytes, bytes]) -> DeadLetterFields | None:
        if not raw:
            return None
        try:  # a planted or damaged entry must not break listing the others
            failed_at = float(raw.get(b"failed_at", b"0") or 0)
        except ValueError:
            failed_at = 0.0
        return DeadLetterFields(
            message=raw.get(b"message", b""),
            reason=raw.get(b"reason", b"").decode(errors="replace"),
            error=raw.get(b"error", b"").decode(errors="replace"),
            task=raw.get(b"task", b"").decode(errors="replace"),
            queue=raw.get(b"queue", b"").decode(errors="replace"),
            failed_at=failed_at,
            kind=raw.get(b"kind", b"").decode(errors="replace"),
        )

    @translate_errors
    async def dead_letters(self, offset: int, limit: int) -> list[tuple[str, DeadLetterFields]]:
        """Dead letters, newest first (those past their retention TTL are gone).

        Read in chunks of :data:`~blitzq.limits.CHUNK_ITEMS` ids (one range read and one
        pipeline of reads each), so no single call's reply grows with ``limit``.
        """
        out: list[tuple[str, DeadLetterFields]] = []
        position, end = offset, offset + max(0, limit)
        while position < end:
            count = min(CHUNK_ITEMS, end - position)
            ids = await self.client.zrevrange(
                self.keys.dead_letters, position, position + count - 1
            )
            if not ids:
                break
            async with self.client.pipeline(transaction=False) as pipe:
                for raw_id in ids:
                    pipe.hgetall(self.keys.dead_letter(raw_id.decode(errors="replace")))
                # An entry of the wrong type (a planted or damaged key) is marked, not fatal.
                rows = await pipe.execute(raise_on_error=False)
            for raw_id, row in zip(ids, rows, strict=True):
                if isinstance(row, ResponseError) and "WRONGTYPE" not in str(row):
                    raise row
                fields = (
                    _unreadable_dead_letter()
                    if isinstance(row, ResponseError)
                    else self._dead_letter_fields(row)
                )
                if fields is not None:  # None: expired meanwhile
                    out.append((raw_id.decode(errors="replace"), fields))
            position += len(ids)
            if len(ids) < count:
                break
        return out

    @translate_errors
    async def get_dead_letter(self, task_id: str) -> DeadLetterFields | None:
        """One dead letter, or ``None``; an entry whose key is not a hash (planted or damaged)
        comes back marked ``reason="unreadable entry"`` with an empty message."""
        try:
            raw = await self.client.hgetall(self.keys.dead_letter(task_id))
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            return _unreadable_dead_letter()
        return self._dead_letter_fields(raw)

    @translate_errors
    async def dead_letter_count(self) -> int:
        """Number of stored dead letters (expired ones are dropped first, one script)."""
        keys = self.keys
        left = await self.scripts.call(
            "trim_dead",
            keys=[keys.dead_letters],
            args=[keys.prefix, self.dead_letter_cap, self.dead_letter_max_bytes],
        )
        return int(left)

    @translate_errors
    async def replay_dead_letter(
        self,
        task_id: str,
        queue: str,
        message: bytes,
        kind: str = "",
        unique: tuple[str, float] | None = None,
    ) -> bool | str:
        """Atomically remove the dead letter and publish ``message`` (compare-and-delete) to
        the stream (``kind`` "s") or list ("l", ``""``: this broker's mode) of ``queue``,
        claiming the ``unique`` key in the same script; see :meth:`Broker.replay_dead_letter`.
        """
        key, ttl = unique if unique is not None else ("", 0.0)
        done = await self.scripts.call(
            "replay",
            keys=[self.keys.dead_letters],
            args=[
                self.keys.prefix,
                task_id,
                kind if kind in ("s", "l") else self.kind,
                queue,
                message,
                key,
                max(1, int(ttl * 1000)),
            ],
        )
        if isinstance(done, bytes | str):
            return done.decode() if isinstance(done, bytes) else done
        return bool(done)

    @translate_errors
    async def purge_dead_letters(self) -> int:
        """Delete every dead letter, :data:`~blitzq.limits.CHUNK_WRITES` per script call.

        Returns how many were deleted (those added meanwhile may be deleted too).
        """
        keys = self.keys
        stored = int(await self.client.zcard(keys.dead_letters))
        removed = 0
        while removed < stored:
            n = int(
                await self.scripts.call(
                    "purge_dead", keys=[keys.dead_letters], args=[keys.prefix, CHUNK_WRITES]
                )
            )
            if n == 0:
                break
            removed += n
        return removed

    # ------------------------------------------------------------- inspection
    @translate_errors
    async def known_queues(self) -> list[str]:
        """Queues recorded by producers and workers."""
        names = await self.client.smembers(self.keys.queues)
        return sorted(name.decode() for name in names)

    @translate_errors
    async def remember_queues(self, queues: Sequence[str]) -> None:
        """Add queue names to the registry of known queues.

        A server out of memory (``noeviction`` at ``maxmemory``) refuses the SADD even for
        names already there; the registry only serves inspection, so that refusal is logged
        (when a name is really missing) and not raised: a worker still starts.
        """
        if not queues:
            return
        try:
            await self.client.sadd(self.keys.queues, *queues)
        except OutOfMemoryError as exc:
            known = await self.client.smismember(self.keys.queues, list(queues))
            missing = [q for q, there in zip(queues, known, strict=True) if not there]
            if missing:
                logger.warning("could not register queue(s) %s: %s", ", ".join(missing), exc)

    @translate_errors
    async def register_worker(self, worker_id: str, info: bytes, ttl: float) -> None:
        """Record a live worker until ``ttl`` seconds from now."""
        keys = self.keys
        now = time.time()
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hset(keys.workers, worker_id, info)
            pipe.zadd(keys.worker_beats, {worker_id: now + ttl})
            await pipe.execute()

    @translate_errors
    async def unregister_worker(self, worker_id: str) -> None:
        """Remove a worker's registration."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(self.keys.workers, worker_id)
            pipe.zrem(self.keys.worker_beats, worker_id)
            await pipe.execute()

    @translate_errors
    async def workers(self) -> dict[str, bytes]:
        """Live workers; expired registrations are removed on the way."""
        keys = self.keys
        expired = await self.client.zrangebyscore(keys.worker_beats, "-inf", time.time())
        if expired:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.hdel(keys.workers, *expired)
                pipe.zrem(keys.worker_beats, *expired)
                await pipe.execute()
        raw: dict[bytes, bytes] = await self.client.hgetall(keys.workers)
        return {k.decode(): v for k, v in raw.items()}

    @translate_errors
    async def counters(self) -> dict[str, int]:
        """The namespace's counters (one HGETALL of ``{ns}:stats``)."""
        raw = await self.client.hgetall(self.keys.stats)
        return {k.decode(): int(v) for k, v in raw.items()}

    @translate_errors
    async def ping(self) -> None:
        """Raise BrokerError unless the server answers PING."""
        await self.client.ping()

    @translate_errors
    async def memory_policy(self) -> tuple[str, int] | None:
        """``(maxmemory-policy, maxmemory bytes)`` from INFO memory (read-only; ``None``
        when the server refuses INFO, as some managed services do)."""
        try:
            info = await self.client.info("memory")
        except ResponseError:
            return None
        policy = info.get("maxmemory_policy")
        if policy is None:
            return None
        policy = policy.decode() if isinstance(policy, bytes) else str(policy)
        return policy, int(info.get("maxmemory", 0) or 0)

    @property
    def pool_size(self) -> int | None:
        """Most connections this broker opens (``max_connections``), ``None`` when unknown."""
        return pool_size(self.client)

    async def close(self) -> None:
        """Close the result listener and, when the broker made it, the client."""
        await self._results.close()
        if self._owns_client:
            await self.client.aclose()
