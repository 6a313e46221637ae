"""``queue_stats`` on RabbitMQ when a worker dies: what a SIGKILLed worker held unacked is
RabbitMQ's again as soon as its connection closes, so it counts as waiting at once, no longer
in flight -- though the worker's registration (which says what it held) lives on until it
lapses (``broker/amqp/liveness.py``). What a worker keeps in custody (acked on RabbitMQ, in
the state store) stays in flight until its lease lapses.

On the shared RabbitMQ (skipped when it does not answer) with the state on the test Redis;
the worker is a ``blitzq worker --no-supervise`` process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from blitzq import Queue
from blitzq.broker import Broker
from blitzq.serialization import dumps, loads
from tests.amqp_server import amqp_brokers, amqp_or_skip

from .proc_tasks import eventually

pytestmark = pytest.mark.timeout(120)

APP = """
import asyncio, os
from blitzq import Queue

queue = Queue(
    "st",
    redis_url=os.environ["ST_REDIS"],
    namespace=os.environ["ST_NS"],
    amqp_url=os.environ["ST_AMQP"],
    visibility_timeout=30,  # its registration lives 35 s after its last renewal
)


@queue.task(name="st.hold")
async def hold() -> None:
    await asyncio.sleep(120)
"""


def _worker(app_dir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "blitzq", "worker", "app:queue", "--no-supervise", "-c", "2"]
    return subprocess.Popen(
        cmd, cwd=app_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` (no chance to unregister or hand anything back) and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


@pytest.fixture
async def amqp(server_url: str, namespace: str) -> AsyncIterator[Callable[..., Broker]]:
    """Factory of AmqpBrokers; their RabbitMQ queues are deleted afterwards."""
    async with amqp_brokers(server_url, namespace, "?pack=1") as factory:
        yield factory


async def test_a_killed_workers_deliveries_count_as_waiting_at_once(
    tmp_path: Path, server_url: str, namespace: str, amqp: Callable[..., Broker]
) -> None:
    url = amqp_or_skip()
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env.update(
        ST_REDIS=server_url,
        ST_NS=namespace,
        ST_AMQP=url,
        PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
    )
    observer = amqp()  # `blitzq queue stats` in another process
    producer = Queue("st", broker=observer)
    hold = producer.task(name="st.hold")(_stand_in)
    await hold.enqueue_many([((), {}) for _ in range(6)])
    proc = _worker(tmp_path, env)
    try:
        # 2 running, 4 prefetched (RabbitMQ sends a consumer 2 x its free slots ahead).
        want = {"st": {"waiting": 4, "in_flight": 2}}
        await eventually(lambda: observer.queue_stats(["st"]), lambda s: s == want, 60)
        before = await observer.workers()
        assert [loads(i)["pid"] for i in before.values()] == [proc.pid]
        _kill(proc)
        want = {"st": {"waiting": 6, "in_flight": 0}}
        await eventually(lambda: observer.queue_stats(["st"]), lambda s: s == want, 20)
        # Not the registration's lapse: it is still there.
        assert set(await observer.workers()) == set(before)
    finally:
        _kill(proc)
    await observer.purge_queue("st")


async def test_a_gone_connections_custody_stays_in_flight(
    server_url: str, namespace: str, amqp: Callable[..., Broker]
) -> None:
    """A registration whose connection mark is gone counts only what it keeps in custody; one
    whose mark is open (or that has none: an older worker) counts all it says."""
    observer, holder = amqp(), amqp(prefetch=1)
    await observer.publish("mk", [b"x"])
    await holder.fetch("mk", 1, 10)  # the holder's connection now has its mark
    open_mark = holder.transport.mark.current(holder.transport.link.epoch)  # type: ignore[attr-defined]
    assert open_mark.startswith("amq.gen-")
    registry = observer.state.registry
    for key, alive in (("gone", "amq.gen-gone-long-ago"), ("open", open_mark), ("old", None)):
        held: dict[str, Any] = {"by": key, "queues": {"mk": 2}, "kept": {"mk": 3}}
        if alive is not None:
            held["alive"] = alive
        else:
            held = {"by": key, "queues": {"mk": 2}}
        info = dumps({"id": key, "key": key, "pid": 1, "heartbeat_at": 1.0, "in_flight": held})
        await registry.register_worker(key, info, 60)
    stats = await observer.queue_stats(["mk"])
    # gone: 3 kept; open: 2 + 3; old: 2; the holder's own registration is not written here.
    assert stats["mk"]["in_flight"] == 3 + 5 + 2
    for key in ("gone", "open", "old"):
        await registry.unregister_worker(key)


async def _stand_in() -> None:
    """The producer's stand-in for the worker's task (the body never runs here)."""
