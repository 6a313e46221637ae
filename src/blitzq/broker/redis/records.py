"""The Redis state store's reads and waits: records, workflow state, progress.

A wait subscribes on the shared listener (``result_listener.py``) and re-reads every second, so a
lost push costs a second, never a result; every wait is bounded by its timeout plus
:data:`WAIT_GRACE` whatever the network does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ...exceptions import BrokerError
from ..state import RecordsState
from .client import REDIS_ERRORS, broker_error, translate_errors
from .connection import LeaseIdentity, RedisConnection, RedisPart
from .keys import GROUP

if TYPE_CHECKING:
    from .result_listener import ResultListener

R = TypeVar("R")

#: Keys read by one MGET (a bounded reply, a short server call).
READ_CHUNK = 100

#: Seconds a result or workflow wait may overrun its timeout while a command is in flight.
WAIT_GRACE = 1.0

#: Stream entries :meth:`RedisRecords.trace_task` searches at most (a longer stream: it
#: cannot tell, and the wait goes on).
TRACE_SCAN = 1000


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


def _release_later(
    listener: ResultListener, channel: str, subscribing: asyncio.Future[asyncio.Future[bytes]]
) -> None:
    """Let a pending ``listener.subscribe`` whose waiter is no longer needed end in the
    background (the listener's close cancels it), then release that waiter."""

    def done(subscribing: asyncio.Future[asyncio.Future[bytes]]) -> None:
        if not subscribing.cancelled() and subscribing.exception() is None:
            listener.release(channel, subscribing.result())

    listener.in_background(subscribing)
    subscribing.add_done_callback(done)


class RedisRecords(RedisPart, RecordsState):
    """Task records and the waits on them, workflow state, progress and task liveness (the
    ``records`` role of :class:`~.store.RedisStateStore`).

    Args:
        conn: the store's connection.
        kind: the store's write kind: a task is traced in its stream only with ``"s"`` (a
            streams transport on this connection).
        lease: the lease identity of the streams transport whose deliveries the store acks
            (:class:`~.connection.LeaseIdentity`): progress with a ``fence`` is stored only
            while that consumer holds the delivery; ``None``: progress is never fenced.
    """

    announce: Callable[[str, float], Awaitable[None]] | None = None
    """Called with a task id and the seconds left once a wait on its record is subscribed,
    before it reads again: the spread layout marks the wait (``homes.py``); ``None``: a
    completion always publishes."""

    def __init__(self, conn: RedisConnection, kind: str, lease: LeaseIdentity | None) -> None:
        super().__init__(conn, kind)
        self.lease = lease

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
        if fence is not None and self.lease is not None:
            script_keys.append(keys.stream(fence[0]))
            args += (GROUP, self.lease.consumer, fence[1])
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
                        if self.announce is not None:
                            await self.announce(task_id, 2.0)
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
    async def take_redelivered(
        self, task_ids: Sequence[str], digests: Sequence[str], owners: Sequence[bytes], ttl: int
    ) -> tuple[list[bytes | None], list[int]]:
        """See :meth:`RecordsState.take_redelivered`: one MULTI/EXEC of, per message, ``GET``
        of its record, ``HSET``/``HINCRBY``/``EXPIRE`` of ``{ns}:tk:<task_id>:<digest>`` (``o``
        the owner, ``n`` the takes) and ``ZADD`` of the id to ``{ns}:tks`` scored by the
        take's expiry (complete.lua looks up the takes of these ids only), then the expired
        ids pruned from it and its ``EXPIRE``. Atomic: a completion applied before it is
        seen in the record read, one applied after it is checked against the take."""
        keys = self.keys
        ttl = max(1, int(ttl))
        now = time.time()
        async with self.client.pipeline(transaction=True) as pipe:
            for task_id, digest, owner in zip(task_ids, digests, owners, strict=True):
                taken = keys.taken(task_id, digest)
                pipe.get(keys.record(task_id))
                pipe.hset(taken, "o", owner)
                pipe.hincrby(taken, "n", 1)
                pipe.expire(taken, ttl)
                pipe.zadd(keys.takes, {task_id: now + ttl})
            pipe.zremrangebyscore(keys.takes, "-inf", now)
            pipe.expire(keys.takes, ttl)
            replies = await pipe.execute()
        return list(replies[0:-2:5]), [int(n) for n in replies[2:-2:5]]

    @translate_errors
    async def count_solo_start(self, task_id: str, ttl: int) -> int:
        """See :meth:`RecordsState.count_solo_start`: ``INCR`` and ``EXPIRE`` of
        ``{ns}:solo:<task_id>``, pipelined (one round trip; one key, so any cluster node)."""
        key = self.keys.solo(task_id)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.incr(key)
            pipe.expire(key, max(1, ttl))
            count, _ = await pipe.execute()
        return int(count)

    @translate_errors
    async def solo_runs(self, task_id: str) -> int:
        """See :meth:`RecordsState.solo_runs`: ``GET {ns}:solo:<task_id>``."""
        found = await self.client.get(self.keys.solo(task_id))
        return int(found) if found is not None and bytes(found).isdigit() else 0

    @translate_errors
    async def record_ids(self, limit: int) -> tuple[list[str], bool]:
        """Ids of stored records, found by SCAN over the namespace's record keys (1000 keys
        examined per call), at most ``limit``: in no particular order, and whether the scan
        stopped at ``limit`` with keys left. The cost grows with the records kept
        (``result_ttl``), not the queues: for an inspection page, never a hot path."""
        prefix = self.keys.record("")
        pattern = "".join("\\" + c if c in "\\*?[]" else c for c in prefix) + "*"
        ids: list[str] = []
        async for key in self.client.scan_iter(match=pattern, count=1000):
            if len(ids) >= limit:
                return ids, True
            text = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
            ids.append(text[len(prefix) :])
        return ids, False

    @translate_errors
    async def set_record(self, task_id: str, record: bytes, ttl: int) -> None:
        """Store a record for ``ttl`` seconds and publish its completion channel.

        On a cluster (whose pipelines refuse the keyless PUBLISH) the two are sent one after
        the other: a waiter subscribes before it reads, so it sees the record or the message.
        """
        if self.conn.cluster:
            await self.client.set(self.keys.record(task_id), record, ex=ttl)
            await self.client.publish(self.keys.done_channel(task_id), b"1")
            return
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(self.keys.record(task_id), record, ex=ttl)
            pipe.publish(self.keys.done_channel(task_id), b"1")
            await pipe.execute()

    @translate_errors
    async def reset_tasks(
        self, task_ids: Sequence[str], owners: Mapping[str, str] | None = None, ttl: int = 0
    ) -> None:
        """DEL the records and progress, ZREM the cancel marks, SET the owner marks
        (``tn:<id>``, EX ``ttl``) (one MULTI/EXEC)."""
        if not task_ids:
            return
        keys = self.keys
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.execute_command(  # DEL as a command: a cluster pipeline splits delete()
                "DEL", *(keys.record(i) for i in task_ids), *(keys.progress(i) for i in task_ids)
            )
            pipe.zrem(keys.revoked, *task_ids)
            for task_id, mark in (owners or {}).items():
                pipe.set(keys.owner(task_id), mark, ex=max(1, ttl))
            await pipe.execute()

    @translate_errors
    async def trace_task(self, task_id: str, queue: str) -> bool | None:
        """Whether the task is known anywhere (``lua/trace.lua``: its record, the schedule,
        the stream of ``queue`` searched up to :data:`TRACE_SCAN` entries, in one atomic
        look); ``None`` unless this store acks a stream transport on its own connection
        (lists pop a running message, an outbox or foreign transport is not searched)."""
        if self.kind != "s":
            return None
        keys = self.keys
        found = await self.scripts.call(
            "trace",
            keys=[keys.record(task_id), keys.schedule, keys.stream(queue)],
            args=[task_id, TRACE_SCAN],
        )
        return None if int(found) < 0 else bool(int(found))

    @translate_errors
    async def keep_running(self, task_ids: Sequence[str], ttl: int) -> int:
        """EXPIRE the ``running`` records of ``task_ids`` to ``ttl`` s where they have less
        (``lua/keep_running.lua``, one call)."""
        if not task_ids:
            return 0
        keys = [self.keys.record(task_id) for task_id in task_ids]
        return int(await self.scripts.call("keep_running", keys=keys, args=[ttl]))

    def result_token(self) -> object | None:
        """The result listener's mark (see ``result_listener.py``, vouched waits), or ``None``."""
        return self._results.token()

    async def wait_for_record(
        self, task_id: str, timeout: float, since: object | None = None
    ) -> bytes | None:
        """Wait (pushed, with a 1 s re-read fallback) until a record exists.

        With the listener's completion pattern confirmed, the wait registers locally and
        reads once; given ``since`` (a :meth:`result_token` taken before the task's message
        was sent) that the listener still vouches for, it reads nothing and takes the push
        (or the completion already seen). Otherwise the subscription and the first read go
        out together; only when that read misses does the waiter need the confirmed
        subscription, read again and wait. Unsubscribing happens in the background, off the
        caller's path. Returns or raises within
        ``timeout`` + :data:`WAIT_GRACE` seconds whatever the network does (a silent server,
        a pool with no free connection).

        Raises:
            BrokerError: the server could not be reached, or did not answer in that time
                (transient).
        """
        if isinstance(since, tuple) and timeout > 0 and self.announce is None:
            started = time.monotonic()
            pushed = await self._take_push(task_id, min(timeout, 1.0), since)
            if pushed is not None:
                return pushed
            timeout, since = max(0.0, timeout - (time.monotonic() - started)), None
        return await _bounded(self._wait_for_record(task_id, timeout, since), timeout)

    async def _take_push(self, task_id: str, wait: float, since: tuple[int, int]) -> bytes | None:
        """The vouched wait's short way (the round trip's path): the completion the listener
        saw since ``since``, or its push awaited up to ``wait`` seconds. No command is sent,
        so no bound of a command in flight (:func:`_bounded`) is needed; ``None`` when the
        listener cannot vouch, nothing came in time or a bare notification came (then the
        wait goes the usual way, reading first).

        Raises:
            BrokerError: the broker was closed meanwhile (:mod:`.waits`).
        """
        listener = self._results
        channel = self.keys.done_channel(task_id)
        seen = listener.vouched(channel, since)
        if seen is None or isinstance(seen, bytes):
            return seen
        waits = listener.waits
        generation = waits.begin()
        try:
            if not seen.done():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await seen
            waits.check(generation)
            pushed = None if seen.cancelled() else seen.result()
            return pushed if pushed and pushed != b"1" else None
        finally:
            waits.done()
            listener.release(channel, seen)

    @translate_errors
    async def _wait_for_record(
        self, task_id: str, timeout: float, since: object | None
    ) -> bytes | None:
        if timeout <= 0:
            return await self.get_record(task_id)
        waits = self._results.waits  # a close of the broker ends this wait (.waits)
        generation = waits.begin()
        try:
            return await self._wait_in(task_id, timeout, since, generation)
        finally:
            waits.done()

    async def _wait_in(
        self, task_id: str, timeout: float, since: object | None, generation: int
    ) -> bytes | None:
        deadline = time.monotonic() + timeout
        channel = self.keys.done_channel(task_id)
        listener = self._results
        check = listener.waits.check
        read = True  # False: the listener vouches that no read is needed
        fut = None
        if isinstance(since, tuple):
            seen = listener.vouched(channel, since)
            if isinstance(seen, bytes):
                return seen
            if seen is not None:
                fut, read = seen, False
        if fut is None:  # the confirmed completion pattern serves it without a command
            fut = listener.register(channel)
        if fut is None:
            subscribing = asyncio.ensure_future(listener.subscribe(channel))
            try:
                record = await self.get_record(task_id)
                if record is None:
                    check(generation)
            except BaseException:
                _release_later(listener, channel, subscribing)
                raise
            if record is not None:
                _release_later(listener, channel, subscribing)
                return record
            fut = await subscribing
        if self.announce is not None:  # subscribed: from now on a completion publishes
            await self.announce(task_id, deadline - time.monotonic())
        try:
            while True:
                check(generation)
                record = await self.get_record(task_id) if read else None
                read = True
                remaining = deadline - time.monotonic()
                if record is not None or remaining <= 0:
                    return record
                if not fut.done():
                    # Awaited directly (a shield costs two more turns of the event loop on
                    # the result's path); this wait's own timeout cancels the waiter, which
                    # is then replaced on the same subscription, and the record read again.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(min(remaining, 1.0)):
                            await fut
                    if fut.cancelled():
                        renewed = listener.renew(channel, fut)
                        check(generation)
                        fut = renewed if renewed is not None else await listener.subscribe(channel)
                        continue
                if fut.done():
                    pushed = None if fut.cancelled() else fut.result()
                    if pushed and pushed != b"1":
                        return pushed  # the completion script publishes the record itself
                    # A bare notification: read again; if already expired, wait anew.
                    listener.release(channel, fut)
                    check(generation)
                    fut = await listener.subscribe(channel)
        finally:
            listener.release(channel, fut)
