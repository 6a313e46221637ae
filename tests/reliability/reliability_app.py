"""The application the reliability suite's worker subprocesses run.

Every task records what it did under ``{ns}:obs:*`` keys so the test process can observe
executions from outside the worker:

- ``{ns}:obs:runs``  hash label -> number of times the task body started
- ``{ns}:obs:pid``   hash label -> pid of the process that last started it
- ``{ns}:obs:done``  hash label -> number of times the body returned
- ``{ns}:obs:ready`` set of worker pids that finished starting up

Observation writes retry for a while on connection errors, so a task running while Redis
restarts still records its run (a failed observation would otherwise fail the task itself).
Each is one script call with a token of its own (``{ns}:obs:tok:<token>``, an hour): a retry
whose first try was applied but whose reply timed out (a worker paused past its
``socket_timeout``) counts once, so a count of 2 is always a body that started twice.
The namespace fixture deletes every ``{ns}:*`` key after the test, these included.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from typing import Any

import redis
import redis.asyncio as aioredis

from blitzq import Queue, RetryPolicy, current_task
from blitzq.broker.redis.cluster import split_layout

#: Names of the tasks (explicit, so the test process and the workers agree).
WORK = "rel.work"
BLOCKING = "rel.blocking"
POISON = "rel.poison"
QUIET = "rel.quiet"
FENCED = "rel.fenced"
SLOWFAIL = "rel.slowfail"
#: ``work`` declared ``mode="fast"`` (registered with ``build_queue(..., fast_task=True)``).
FAST_WORK = "rel.fast_work"

#: Seconds an observation write keeps retrying on connection errors.
OBSERVE_RETRY_FOR = 20.0


def sync_redis(url: str, **kwargs: Any) -> Any:
    """A sync client on ``url``: a cluster client for ``redis+cluster://`` (the cluster
    tests' worker URL), else a plain one; a ``layout`` option is the broker's, dropped."""
    url = split_layout(url)[0]
    if url.startswith("redis+cluster://"):
        return redis.RedisCluster.from_url("redis://" + url.partition("://")[2], **kwargs)
    return redis.Redis.from_url(url, **kwargs)


def async_redis(url: str) -> Any:
    """An asyncio client on ``url`` (a cluster client for ``redis+cluster://``)."""
    url = split_layout(url)[0]
    if url.startswith("redis+cluster://"):
        return aioredis.RedisCluster.from_url("redis://" + url.partition("://")[2])
    return aioredis.Redis.from_url(url)


#: One observation, applied once however often it is sent: KEYS[1] the counter hash, KEYS[2]
#: the pid hash, KEYS[3] the observation's token; ARGV[1] the label, ARGV[2] the pid ("": none).
OBSERVE = """
if not redis.call('SET', KEYS[3], '1', 'NX', 'EX', 3600) then return 0 end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
if ARGV[2] ~= '' then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
return 1
"""


def obs_key(namespace: str, kind: str) -> str:
    """Key of one observation structure (``runs``, ``pid``, ``done``, ``ready``)."""
    return "{" + namespace + "}:obs:" + kind


def build_queue(
    url: str | None,
    namespace: str,
    mode: str = "reliable",
    visibility_timeout: float = 1.5,
    max_deliveries: int = 5,
    fast_task: bool = False,
) -> Queue:
    """Make the suite's Queue with its tasks registered.

    Args:
        url: broker URL; ``None`` uses the environment / embedded default.
        namespace: key namespace of the test.
        mode: ``"reliable"`` or ``"fast"``.
        visibility_timeout: seconds before an unrenewed delivery is recovered.
        max_deliveries: deliveries before a message is dead-lettered.
        fast_task: also register :data:`FAST_WORK`, ``work`` declared ``mode="fast"`` (the
            workers of such a Queue also fetch from the fast lists).

    Returns:
        The Queue; its tasks are in ``queue.tasks`` under :data:`WORK`, :data:`QUIET`,
        :data:`BLOCKING`, :data:`POISON`, :data:`FENCED` and :data:`SLOWFAIL`.
    """
    queue = Queue(
        redis_url=url,
        namespace=namespace,
        mode=mode,  # type: ignore[arg-type]
        visibility_timeout=visibility_timeout,
        max_deliveries=max_deliveries,
    )
    runs, pids, done = (obs_key(namespace, k) for k in ("runs", "pid", "done"))
    state: dict[str, Any] = {}

    def async_client() -> aioredis.Redis:
        client = state.get("async")
        if client is None:
            client = state["async"] = async_redis(queue.url)
        return client

    def sync_client() -> redis.Redis:
        client = state.get("sync")
        if client is None:
            client = state["sync"] = sync_redis(queue.url)
        return client

    def observation(label: str, key: str, pid: bool) -> tuple[Any, ...]:
        """The arguments of one observation's script call: a token of its own, so that a
        retry whose first try was applied (its reply timed out: a paused worker) counts once."""
        token = obs_key(namespace, "tok:" + uuid.uuid4().hex)
        return (OBSERVE, 3, key, pids, token, label, os.getpid() if pid else "")

    async def observe(label: str, key: str, pid: bool) -> None:
        deadline = time.monotonic() + OBSERVE_RETRY_FOR
        args = observation(label, key, pid)
        while True:
            try:
                await async_client().eval(*args)
                return
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    def observe_sync(label: str, key: str, pid: bool) -> None:
        deadline = time.monotonic() + OBSERVE_RETRY_FOR
        args = observation(label, key, pid)
        while True:
            try:
                sync_client().eval(*args)
                return
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    @queue.task(name=WORK, retries=0)
    async def work(label: str, seconds: float) -> str:
        """Record the start, sleep ``seconds`` on the event loop, record the end."""
        await observe(label, runs, True)
        await asyncio.sleep(seconds)
        await observe(label, done, False)
        return label

    if fast_task:
        queue.task(name=FAST_WORK, retries=0, mode="fast")(work.fn)

    @queue.task(name=QUIET, retries=0)
    async def quiet(label: str, seconds: float) -> str:
        """Record the start, sleep ``seconds``; returns without touching Redis again."""
        await observe(label, runs, True)
        await asyncio.sleep(seconds)
        return label

    @queue.task(name=FENCED, retries=0)
    async def fenced(label: str, seconds: float, fail_first: bool) -> int:
        """Record the start; the first attempt sleeps ``seconds`` and then fails when
        ``fail_first`` (else returns its pid); a redelivery returns its pid at once."""
        await observe(label, runs, True)
        context = current_task()
        assert context is not None
        if context.attempt == 1:
            await asyncio.sleep(seconds)
            if fail_first:
                raise RuntimeError(f"first run of {label} failed")
        return os.getpid()

    @queue.task(name=SLOWFAIL, retries=1, retry_policy=RetryPolicy(base=0.2, jitter="none"))
    async def slowfail(label: str, seconds: float) -> None:
        """Record the start, sleep ``seconds``, raise (one retry)."""
        await observe(label, runs, True)
        await asyncio.sleep(seconds)
        raise RuntimeError(f"slow failure of {label}")

    @queue.task(name=BLOCKING, retries=0)
    def blocking(label: str, seconds: float) -> str:
        """Like ``work`` but in a worker thread, blocking it with ``time.sleep``."""
        observe_sync(label, runs, True)
        time.sleep(seconds)
        observe_sync(label, done, False)
        return label

    @queue.task(name=POISON, retries=0)
    async def poison(label: str, delay: float) -> None:
        """Record the start, then SIGKILL the worker process running it after ``delay`` s."""
        await observe(label, runs, True)
        await asyncio.sleep(delay)
        os.kill(os.getpid(), signal.SIGKILL)

    async def close_clients() -> None:
        client = state.pop("async", None)
        if client is not None:
            await client.aclose()

    queue.on_shutdown.append(close_clients)
    return queue
