"""A relay process SIGKILLed mid-batch loses nothing (the outbox relay is at-least-once).

A real process (``relay_child.py``) relays a foreign pairing's outbox and SIGKILLs itself
after taking a batch (nothing published) or after publishing it (not released). Its batch
stays taken under its lease; once the lease lapses a worker's relay puts it back and
publishes it, and every task runs: once when the dead relay published nothing, twice when it
had published the batch already (the duplicate at-least-once allows). On the spread layout
(``SpreadRedisBroker``, here on the single test server) the batch keeps its id through the
lapsed lease and the second publish adds nothing: every task runs once at either point.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from blitzq import Queue, current_task
from blitzq.broker import Broker, Scheduled
from blitzq.broker.redis.spread import SpreadRedisBroker
from blitzq.serialization import Envelope, encode_envelope
from tests.foreign import TRANSPORT_SUFFIX, ForeignPairing, delete_namespace
from tests.integration.proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)

CHILD = Path(__file__).resolve().parent / "relay_child.py"
Q = "relayed"
N = 20


@pytest.fixture
async def pairing(redis_url: str, namespace: str, layout: str) -> AsyncIterator[Broker]:
    """A foreign pairing (or the spread layout's broker) on the test's namespace; the
    transport's keys are deleted after."""
    made = (
        SpreadRedisBroker(redis_url, namespace)
        if layout == "spread"
        else ForeignPairing(redis_url, namespace)
    )
    yield made
    await made.close()
    await delete_namespace(redis_url, namespace + TRANSPORT_SUFFIX)
    await delete_namespace(redis_url, namespace + ":q:" + Q)


@pytest.mark.parametrize(
    ("layout", "point", "runs_each"),
    [
        ("foreign", "after_take", 1),
        ("foreign", "after_publish", 2),
        ("spread", "after_take", 1),
        ("spread", "after_publish", 1),
    ],
)
async def test_a_relay_process_killed_mid_batch_loses_nothing(
    pairing: Broker, redis_url: str, namespace: str, layout: str, point: str, runs_each: int
) -> None:
    state, relay = pairing.state, pairing.relay
    assert relay is not None
    ids = [f"k{i}" for i in range(N)]
    await state.scheduling.schedule(
        [
            Scheduled(i, Q, encode_envelope(Envelope(i, "kill.add", Q, [1, 1]), 1 << 20), 0.0)
            for i in ids
        ]
    )
    # The store's own promotion, below the facade: the messages wait in the outbox.
    await eventually(lambda: state.scheduling.promote_due(100), lambda r: r[0] == N)
    assert await relay.outbox.waiting([Q]) == {Q: N}

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        redis_url,
        namespace,
        point,
        "0.5",
        layout,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == -signal.SIGKILL, output
    assert await relay.outbox.waiting([Q]) == {Q: 0}  # taken by the dead relay

    queue = Queue(name=Q, namespace=namespace, broker=pairing)
    runs: Counter[str] = Counter()

    @queue.task(name="kill.add")
    async def add(a: int, b: int) -> int:
        runs[current_task().id] += 1
        return a + b

    async with running(make_worker(queue, concurrency=8)):
        await eventually(
            lambda: pairing.get_records(ids), lambda rs: all(r is not None for r in rs)
        )
        await eventually(lambda: _total(runs), lambda total: total == N * runs_each)
        # The dead relay's batch was put back and relayed again (its lease lapsed), and
        # whatever that added to the queue has run.
        await eventually(relay.outbox.pending, lambda names: names == [])
        await eventually(lambda: _settled(pairing), bool)
    assert set(runs) == set(ids)
    assert set(runs.values()) == {runs_each}


async def _settled(broker: Broker) -> bool:
    """Whether no relay holds a batch and the queue has nothing waiting or in flight."""
    client: Any = broker.state.client  # type: ignore[attr-defined]
    keys = broker.state.keys  # type: ignore[attr-defined]
    held = await client.zcard(keys.relays)
    lapsed = await client.llen(keys.handoffs)
    stats = (await broker.queue_stats([Q]))[Q]
    return held == 0 and lapsed == 0 and stats == {"waiting": 0, "in_flight": 0}


async def _total(runs: Counter[str]) -> int:
    """Runs so far (a coroutine, for ``eventually``)."""
    return sum(runs.values())
