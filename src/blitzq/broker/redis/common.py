"""What both Redis brokers share: connection, schedule, records, dead letters, inspection.

The two modes differ only in where a queue's messages wait (a stream with a consumer group, or
a list) and so in publish, fetch, ack, heartbeat and recovery; see ``reliable.py`` and
``fast.py``. Every Redis command blitzq sends lives under this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Sequence
from importlib import resources
from typing import Any, ClassVar, ParamSpec, TypeVar

import msgspec
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ...exceptions import BrokerError
from ..base import Broker, Completion, DeadLetterFields
from .control import RedisControl
from .keys import GROUP, Keys
from .results import ResultListener

P = ParamSpec("P")
R = TypeVar("R")

#: Dead letters kept per namespace before the oldest are dropped.
DEFAULT_DEAD_LETTER_CAP = 100_000

#: Prefix of a message on the event channel -> the kind ``events()`` yields.
_EVENT_KINDS = {"r": "revoke", "s": "schedule"}


def translate_errors(
    fn: Callable[P, Coroutine[Any, Any, R]],
) -> Callable[P, Coroutine[Any, Any, R]]:
    """Turn redis-py errors raised by ``fn`` into :class:`BrokerError`."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except BrokerError:
            raise
        except (RedisError, OSError) as exc:
            transient = isinstance(exc, (RedisConnectionError, RedisTimeoutError, OSError))
            raise BrokerError(f"{type(exc).__name__}: {exc}", transient) from exc

    return wrapper


def load_script(name: str) -> str:
    """Source of a Lua script shipped in ``broker/redis/lua/``."""
    return resources.files(__package__).joinpath("lua", name).read_text()


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


class RedisBroker(RedisControl, Broker):
    """Base of the Redis brokers.

    Args:
        url: a ``redis://``, ``rediss://`` or ``unix://`` URL.
        namespace: key namespace; every key is prefixed ``{namespace}:``.
        dead_letter_cap: dead letters kept before the oldest are dropped.
        client: an existing ``redis.asyncio.Redis`` to use instead of ``url`` (not closed by
            the broker).
    """

    kind: ClassVar[str]
    """``"s"`` for streams, ``"l"`` for lists: where this mode keeps a queue's messages."""

    def __init__(
        self,
        url: str,
        namespace: str,
        *,
        dead_letter_cap: int = DEFAULT_DEAD_LETTER_CAP,
        client: aioredis.Redis | None = None,
    ) -> None:
        self.url = url
        self.keys = Keys(namespace)
        self.dead_letter_cap = dead_letter_cap
        self._owns_client = client is None
        # Typed as Any: redis-py's stubs type replies as bytes | str whatever decode_responses is.
        self.client: Any = client or aioredis.Redis.from_url(
            url,
            decode_responses=False,
            health_check_interval=30,
            # Fail over to BrokerError in about a second, not redis-py's default ~10 s.
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), 3),
        )
        for command in ("XREADGROUP", "XAUTOCLAIM", "BLMPOP", "LPOP"):
            self.client.set_response_callback(command, _raw)
        self._complete = self.client.register_script(load_script("complete.lua"))
        self._promote = self.client.register_script(load_script("promote.lua"))
        self._replay = self.client.register_script(load_script("replay.lua"))
        self._rate_acquire = self.client.register_script(load_script("rate_acquire.lua"))
        self._cancel = self.client.register_script(load_script("cancel.lua"))
        self._claim_periodic = self.client.register_script(load_script("claim_periodic.lua"))
        self._set_progress = self.client.register_script(load_script("progress.lua"))
        self._results = ResultListener(self.client)

    def queue_key(self, queue: str) -> str:
        """Key where ``queue``'s messages wait in this mode."""
        raise NotImplementedError

    # ------------------------------------------------------------ completions
    @translate_errors
    async def complete(self, completions: Sequence[Completion]) -> None:
        """Apply a batch of completions in one Lua call (one round-trip, atomic).

        The batch travels as one MessagePack argument that the script unpacks with
        ``cmsgpack``: building a handful of arguments per completion in redis-py cost more
        than the whole server-side work.
        """
        if not completions:
            return
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
                    c.eta,
                    (_lua_bytes(d.message), d.reason, d.error, d.task, d.queue, d.failed_at)
                    if d
                    else _EMPTY,
                    _lua_bytes(c.requeue) if c.requeue else _EMPTY,
                    [_lua_op(op) for op in c.ops] if c.ops else _EMPTY,
                )
            )
        for queue, tokens in acks.items():
            entries.append(("A", queue, [_lua_bytes(t) for t in tokens]))
        if not entries:
            return
        keys = self.keys
        await self._complete(
            keys=[keys.schedule, keys.schedule_data, keys.dead_letters],
            args=[keys.prefix, GROUP, self.dead_letter_cap, _batch_encoder.encode(entries)],
        )

    @translate_errors
    async def acquire_rate(self, buckets: Sequence[tuple[str, float, float]]) -> tuple[bool, float]:
        """Reserve a token from each bucket in one script run on server time."""
        keys = [self.keys.rate_limit(key) for key, _, _ in buckets]
        args: list[float] = []
        for _, rate, capacity in buckets:
            args += (rate, capacity)
        reserved, wait = await self._rate_acquire(keys=keys, args=args)
        return reserved in (b"1", "1", 1), float(wait)

    # --------------------------------------------------------------- schedule
    @translate_errors
    async def schedule(self, items: Sequence[tuple[str, str, bytes, float]]) -> None:
        """Put ``(task_id, queue, message, eta)`` items on the schedule in one round-trip."""
        if not items:
            return
        keys = self.keys
        async with self.client.pipeline(transaction=True) as pipe:
            for task_id, queue, message, eta in items:
                pipe.zadd(keys.schedule, {task_id: eta})
                pipe.hset(
                    keys.schedule_data,
                    task_id,
                    self.kind.encode() + queue.encode() + b"\n" + message,
                )
            pipe.publish(keys.events, f"s:{min(eta for _, _, _, eta in items)!r}")
            await pipe.execute()

    @translate_errors
    async def cancel(self, task_id: str, record: bytes, ttl: int) -> str:
        """Cancel atomically (one script): off the schedule, or revoked and announced."""
        keys = self.keys
        answer = await self._cancel(
            keys=[keys.schedule, keys.schedule_data, keys.revoked, keys.record(task_id)],
            args=[keys.prefix, task_id, repr(time.time()), ttl, record],
        )
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    @translate_errors
    async def revoked(self) -> dict[str, float]:
        """Revoked ids whose mark has not expired."""
        rows = await self.client.zrangebyscore(
            self.keys.revoked, time.time(), "+inf", withscores=True
        )
        return {member.decode(errors="replace"): float(score) for member, score in rows}

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
            except (RedisError, OSError) as exc:
                raise BrokerError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()

    @translate_errors
    async def promote_due(self, now: float, limit: int) -> tuple[int, float | None]:
        """Move due scheduled messages to their queues (one Lua call)."""
        keys = self.keys
        moved, head = await self._promote(
            keys=[keys.schedule, keys.schedule_data], args=[keys.prefix, repr(now), limit]
        )
        return int(moved), (float(head) if head else None)

    @translate_errors
    async def scheduled_count(self) -> int:
        """Number of messages waiting on the schedule."""
        return int(await self.client.zcard(self.keys.schedule))

    # --------------------------------------------------------------- periodic
    @translate_errors
    async def claim_periodic(
        self, name: str, occurrence: float, message: bytes, queue: str
    ) -> bool:
        """Compare-and-set the last occurrence of ``name`` and publish, in one Lua call."""
        keys = self.keys
        done = await self._claim_periodic(
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
    async def set_progress(self, task_id: str, data: bytes, at: float, ttl: int) -> bool:
        """Store and publish a progress update unless a newer one is stored (one script)."""
        keys = self.keys
        done = await self._set_progress(
            keys=[keys.progress(task_id)],
            args=[repr(float(at)), data, ttl, keys.progress_channel(task_id)],
        )
        return bool(done)

    @translate_errors
    async def get_progress(self, task_id: str) -> bytes | None:
        """The latest stored progress update of a task, or ``None``."""
        value: bytes | None = await self.client.hget(self.keys.progress(task_id), "v")
        return value

    async def watch_progress(self, task_id: str) -> AsyncGenerator[tuple[str, bytes], None]:
        """Follow a task's progress and record on a pub/sub connection of its own."""
        keys = self.keys
        progress_channel = keys.progress_channel(task_id).encode()
        done_channel = keys.done_channel(task_id).encode()
        pubsub = self.client.pubsub()
        try:
            try:
                await pubsub.subscribe(progress_channel, done_channel)
                # Read both confirmations first: from then on nothing published is missed.
                confirmed, deadline = 0, time.monotonic() + 5.0
                while confirmed < 2 and time.monotonic() < deadline:
                    reply = await pubsub.get_message(timeout=1.0)
                    if reply is not None and reply.get("type") == "subscribe":
                        confirmed += 1
                fresh = True
                while True:
                    if fresh:  # after subscribing, and after a second without news
                        progress = await self.client.hget(keys.progress(task_id), "v")
                        if progress is not None:
                            yield "progress", progress
                        record = await self.client.get(keys.record(task_id))
                        if record is not None:
                            yield "record", record
                    message = await pubsub.get_message(timeout=1.0)
                    fresh = message is None
                    if message is None or message.get("type") != "message":
                        continue
                    if message["channel"] == progress_channel:
                        yield "progress", message["data"]
                    else:
                        record = await self.client.get(keys.record(task_id))
                        if record is not None:
                            yield "record", record
            except (RedisError, OSError) as exc:
                raise BrokerError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()

    # -------------------------------------------------------------- workflows
    @translate_errors
    async def workflow_state(self, workflow_id: str) -> dict[str, bytes] | None:
        """The fields of a workflow's state hash (one HGETALL), or ``None``."""
        raw = await self.client.hgetall(self.keys.workflow(workflow_id))
        return {k.decode(): v for k, v in raw.items()} if raw else None

    @translate_errors
    async def wait_for_workflow(self, workflow_id: str, timeout: float) -> dict[str, bytes] | None:
        """Wait (pushed on the workflow's channel, re-read every second) until it ends."""
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
    async def set_record(self, task_id: str, record: bytes, ttl: int) -> None:
        """Store a record for ``ttl`` seconds and publish its completion channel."""
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.record(task_id), record, ex=ttl)
            pipe.publish(self.keys.done_channel(task_id), b"1")
            await pipe.execute()

    @translate_errors
    async def wait_for_record(self, task_id: str, timeout: float) -> bytes | None:
        """Wait (pushed, with a 1 s re-read fallback) until a record exists.

        The subscription and the first read go out together; only when that read misses
        does the waiter need the confirmed subscription, read again and wait. Unsubscribing
        happens in the background, off the caller's path.
        """
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
        return DeadLetterFields(
            message=raw.get(b"message", b""),
            reason=raw.get(b"reason", b"").decode(errors="replace"),
            error=raw.get(b"error", b"").decode(errors="replace"),
            task=raw.get(b"task", b"").decode(errors="replace"),
            queue=raw.get(b"queue", b"").decode(errors="replace"),
            failed_at=float(raw.get(b"failed_at", b"0") or 0),
        )

    @translate_errors
    async def dead_letters(self, offset: int, limit: int) -> list[tuple[str, DeadLetterFields]]:
        """Dead letters, newest first."""
        ids = await self.client.zrevrange(self.keys.dead_letters, offset, offset + limit - 1)
        if not ids:
            return []
        async with self.client.pipeline(transaction=False) as pipe:
            for raw_id in ids:
                pipe.hgetall(self.keys.dead_letter(raw_id.decode()))
            rows = await pipe.execute()
        out = []
        for raw_id, row in zip(ids, rows, strict=True):
            fields = self._dead_letter_fields(row)
            if fields is not None:
                out.append((raw_id.decode(), fields))
        return out

    @translate_errors
    async def get_dead_letter(self, task_id: str) -> DeadLetterFields | None:
        """One dead letter, or ``None``."""
        return self._dead_letter_fields(await self.client.hgetall(self.keys.dead_letter(task_id)))

    @translate_errors
    async def dead_letter_count(self) -> int:
        """Number of stored dead letters."""
        return int(await self.client.zcard(self.keys.dead_letters))

    @translate_errors
    async def replay_dead_letter(self, task_id: str, queue: str, message: bytes) -> bool:
        """Atomically remove the dead letter and publish ``message`` (compare-and-delete)."""
        done = await self._replay(
            keys=[self.keys.dead_letters],
            args=[self.keys.prefix, task_id, self.kind, queue, message],
        )
        return bool(done)

    @translate_errors
    async def purge_dead_letters(self) -> int:
        """Delete every dead letter."""
        ids = await self.client.zrange(self.keys.dead_letters, 0, -1)
        if not ids:
            return 0
        async with self.client.pipeline(transaction=True) as pipe:
            for raw_id in ids:
                pipe.delete(self.keys.dead_letter(raw_id.decode()))
            pipe.zrem(self.keys.dead_letters, *ids)
            await pipe.execute()
        return len(ids)

    # ------------------------------------------------------------- inspection
    @translate_errors
    async def known_queues(self) -> list[str]:
        """Queues recorded by producers and workers."""
        names = await self.client.smembers(self.keys.queues)
        return sorted(name.decode() for name in names)

    @translate_errors
    async def remember_queues(self, queues: Sequence[str]) -> None:
        """Add queue names to the registry of known queues."""
        if queues:
            await self.client.sadd(self.keys.queues, *queues)

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
    async def ping(self) -> None:
        """Raise BrokerError unless the server answers PING."""
        await self.client.ping()

    async def close(self) -> None:
        """Close the result listener and, when the broker made it, the client."""
        await self._results.close()
        if self._owns_client:
            await self.client.aclose()
