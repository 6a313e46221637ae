"""The application that the chaos suite's worker and scheduler subprocesses run.

Every task body records each execution under ``{ns}:chaos:exec`` (a hash), written through a
separate *observation* connection that goes straight to the server, not through the fault
proxy, so the test sees true execution times whatever the worker's own connections suffer:

- field ``<kind>|<key>|<task id>|<pid>|<n>`` (``n`` counts executions in that process),
- value ``"<start>"`` when the body starts, ``"<start> <end>"`` when it returns (Unix seconds).

HSET is idempotent, so an observation write retried after a lost reply never counts twice.
Kinds: ``work`` (key: the label, also the task id), ``member`` (key: ``<chord>:<index>``),
``join`` (key: the chord id; the results it got go to ``{ns}:chaos:joined``), ``tick`` (key:
the periodic occurrence, from the task id ``periodic:chaos.tick:<ts>``).

Schedulers log each occurrence they won the claim for in ``{ns}:chaos:claims`` (field
``<occurrence>|<pid>|<n>``).
Processes add their pid to ``{ns}:chaos:ready`` once started.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from typing import Any

import redis
import redis.asyncio as aioredis

from blitzq import Queue, current_task
from blitzq.schedules import Every

WORK = "chaos.work"
MEMBER = "chaos.member"
JOIN = "chaos.join"
TICK = "chaos.tick"

#: Seconds an observation write keeps retrying on connection errors (a restarting server).
OBSERVE_RETRY_FOR = 60.0
#: Interval of the periodic entry (seconds).
TICK_EVERY = 1


def key(namespace: str, suffix: str) -> str:
    """``{ns}:chaos:<suffix>``: observation keys (deleted with the namespace)."""
    return "{" + namespace + "}:chaos:" + suffix


class Observer:
    """Writes execution observations to the server directly (not through a proxy).

    Args:
        url: the real server's URL.
        namespace: the test's namespace.
    """

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self.namespace = namespace
        self._client: aioredis.Redis | None = None
        self._count = itertools.count(1)
        #: Numbers the periodic claims this process won.
        self.claims = itertools.count(1)

    def client(self) -> aioredis.Redis:
        """The observation client (made on first use, in the running loop)."""
        if self._client is None:
            self._client = aioredis.Redis.from_url(
                self.url, socket_timeout=5.0, socket_connect_timeout=5.0
            )
        return self._client

    async def write(self, *commands: tuple[str, ...]) -> None:
        """Run ``commands`` (name, args...) in one MULTI, retrying on connection errors.

        Raises:
            redis.ConnectionError: the server stayed unreachable for OBSERVE_RETRY_FOR s.
        """
        deadline = time.monotonic() + OBSERVE_RETRY_FOR
        while True:
            try:
                async with self.client().pipeline(transaction=True) as pipe:
                    for name, *args in commands:
                        pipe.execute_command(name, *args)
                    await pipe.execute()
                return
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    async def start(self, kind: str, item: str) -> tuple[str, float]:
        """Record the start of an execution; return its field and start time."""
        ctx = current_task()
        task_id = ctx.id if ctx is not None else "?"
        field = f"{kind}|{item}|{task_id}|{os.getpid()}|{next(self._count)}"
        started = time.time()
        await self.write(("HSET", key(self.namespace, "exec"), field, repr(started)))
        return field, started

    async def end(self, field: str, started: float, *extra: tuple[str, ...]) -> None:
        """Record the end of the execution started as ``field`` (plus ``extra`` commands)."""
        value = f"{started!r} {time.time()!r}"
        await self.write(("HSET", key(self.namespace, "exec"), field, value), *extra)

    async def close(self) -> None:
        """Close the observation client."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def build_queue(
    url: str,
    namespace: str,
    observe_url: str,
    visibility_timeout: float = 2.0,
    max_deliveries: int = 50,
) -> tuple[Queue, Observer]:
    """The chaos suite's Queue with its tasks and its periodic entry registered.

    Args:
        url: broker URL the process uses (maybe a fault proxy).
        namespace: the test's namespace.
        observe_url: the real server's URL, for observations.
        visibility_timeout: seconds before an unrenewed delivery is recovered.
        max_deliveries: deliveries before dead-lettering (high: faults are not poison).

    Returns:
        ``(queue, observer)``.
    """
    queue = Queue(
        redis_url=url,
        namespace=namespace,
        visibility_timeout=visibility_timeout,
        max_deliveries=max_deliveries,
    )
    obs = Observer(observe_url, namespace)

    @queue.task(name=WORK, retries=0)
    async def work(label: str, seconds: float) -> str:
        """Sleep ``seconds`` on the loop; return the label."""
        field, started = await obs.start("work", label)
        await asyncio.sleep(seconds)
        await obs.end(field, started)
        return label

    @queue.task(name=MEMBER, retries=0)
    async def member(chord_id: str, index: int, seconds: float) -> int:
        """A chord member: sleep, return its index."""
        field, started = await obs.start("member", f"{chord_id}:{index}")
        await asyncio.sleep(seconds)
        await obs.end(field, started)
        return index

    @queue.task(name=JOIN, retries=0)
    async def join(results: list[int], chord_id: str) -> list[int]:
        """A chord callback: record the results it got."""
        field, started = await obs.start("join", chord_id)
        await asyncio.sleep(0.05)
        joined = ("HSET", key(namespace, "joined"), chord_id, json.dumps(results))
        await obs.end(field, started, joined)
        return results

    @queue.periodic(Every(TICK_EVERY), missed="run_all", name=TICK, retries=0)
    async def tick() -> None:
        """The periodic entry: record which occurrence ran."""
        ctx = current_task()
        occurrence = ctx.id.rsplit(":", 1)[-1] if ctx is not None else "?"
        field, started = await obs.start("tick", occurrence)
        await obs.end(field, started)

    del work, member, join, tick

    async def close_observer() -> None:
        await obs.close()

    queue.on_shutdown.append(close_observer)
    return queue, obs


def log_claims(queue: Queue, observer: Observer) -> None:
    """Make ``queue``'s broker count each won periodic claim in ``{ns}:chaos:claims``."""
    broker: Any = queue.broker
    claim = broker.claim_periodic

    async def counted(
        name: str, occurrence: float, message: bytes, target: str, until: float | None = None
    ) -> bool:
        won = bool(await claim(name, occurrence, message, target, until))
        if won:  # one field per claim won (idempotent if the write is retried)
            field = f"{int(occurrence)}|{os.getpid()}|{next(observer.claims)}"
            await observer.write(("HSET", key(observer.namespace, "claims"), field, "1"))
        return won

    broker.claim_periodic = counted
