"""A relay process SIGKILLed mid-batch loses nothing (the outbox relay is at-least-once).

A real process (``relay_child.py``) relays a foreign pairing's outbox and SIGKILLs itself
after taking a batch (nothing published) or after publishing it (not released). Its batch
stays taken under its lease; once the lease lapses a worker's relay puts it back and
publishes it, and every task runs: once when the dead relay published nothing, twice when it
had published the batch already (the duplicate at-least-once allows).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from blitzq import Queue, current_task
from blitzq.broker import Scheduled
from blitzq.serialization import Envelope, encode_envelope
from tests.foreign import TRANSPORT_SUFFIX, ForeignPairing, delete_namespace
from tests.integration.proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)

CHILD = Path(__file__).resolve().parent / "relay_child.py"
Q = "relayed"
N = 20


@pytest.fixture
async def pairing(redis_url: str, namespace: str) -> AsyncIterator[ForeignPairing]:
    """A foreign pairing on the test's namespace; the transport's keys are deleted after."""
    made = ForeignPairing(redis_url, namespace)
    yield made
    await made.close()
    await delete_namespace(redis_url, namespace + TRANSPORT_SUFFIX)


@pytest.mark.parametrize(("point", "runs_each"), [("after_take", 1), ("after_publish", 2)])
async def test_a_relay_process_killed_mid_batch_loses_nothing(
    pairing: ForeignPairing, redis_url: str, namespace: str, point: str, runs_each: int
) -> None:
    state, relay = pairing.state, pairing.relay
    assert relay is not None
    ids = [f"k{i}" for i in range(N)]
    await state.schedule(
        [
            Scheduled(i, Q, encode_envelope(Envelope(i, "kill.add", Q, [1, 1]), 1 << 20), 0.0)
            for i in ids
        ]
    )
    # The store's own promotion, below the facade: the messages wait in the outbox.
    await eventually(lambda: state.promote_due(100), lambda r: r[0] == N)
    assert await relay.outbox.waiting([Q]) == {Q: N}

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        redis_url,
        namespace,
        point,
        "0.5",
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
    assert set(runs) == set(ids)
    assert set(runs.values()) == {runs_each}


async def _total(runs: Counter[str]) -> int:
    """Runs so far (a coroutine, for ``eventually``)."""
    return sum(runs.values())
