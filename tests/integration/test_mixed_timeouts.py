"""Workers of one namespace with different ``visibility_timeout`` s (the F16 report).

A worker renews its leases at a third of its own timeout; another worker with a shorter one
used to recover them as soon as they were idle longer than *its* timeout, so a healthy
worker's running task ran twice. Each worker now registers its timeout, and recovery leaves a
live worker's deliveries alone until idle longer than that worker's timeout; a dead worker's
(its registration gone) are recovered after the recoverer's own, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue, TaskState, current_task
from blitzq.broker.redis import ReliableRedisBroker

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)

#: The impatient worker's timeout: a maintenance round every 0.1 s.
SHORT = 0.3
#: The patient worker's: its first renewal comes 10 s after its first round.
LONG = 30.0
#: Recovery rounds the impatient worker completes while the patient one's task runs: each
#: follows a sleep of a third of SHORT, so the task's lease is idle over SHORT for most of them.
ROUNDS = 12


async def rounds_done(worker: object, count: int) -> None:
    """Wait until ``worker``'s maintenance has completed ``count`` more recovery rounds
    (counted from its first one)."""
    maintenance: Any = await eventually(
        lambda: asyncio.sleep(0, getattr(worker, "_maintenance", None)),
        lambda m: m is not None and m.recovery_rounds > 0,
    )
    target = maintenance.recovery_rounds + count
    await eventually(lambda: asyncio.sleep(0, maintenance.recovery_rounds), lambda n: n >= target)


async def test_a_short_timeout_never_recovers_a_healthy_long_timeout_workers_task(
    make_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture
) -> None:
    patient_q = make_queue(visibility_timeout=LONG)
    impatient_q = make_queue(visibility_timeout=SHORT)
    started, gate = asyncio.Event(), asyncio.Event()
    runs: list[int] = []

    async def hold() -> str:
        context = current_task()
        assert context is not None
        runs.append(context.attempt)
        started.set()
        await gate.wait()
        return "once"

    task = patient_q.task(name="t.hold")(hold)
    impatient_q.task(name="t.hold")(hold)
    patient = make_worker(patient_q, concurrency=2)
    impatient = make_worker(impatient_q, concurrency=2)
    try:
        async with running(patient):
            handle = await task.enqueue()
            await asyncio.wait_for(started.wait(), 20)
            async with running(impatient):
                try:
                    await rounds_done(impatient, ROUNDS)
                    assert runs == [1]
                finally:
                    gate.set()
                assert await handle.result(timeout=20) == "once"
            record = await patient_q.inspect(handle.id)
            assert record is not None
            assert record.state is TaskState.SUCCEEDED
            assert record.attempts == 1
            assert patient.stale_completions == 0
    finally:
        gate.set()
        await patient_q.close()
        await impatient_q.close()
    assert runs == [1]
    # No recovery round took it back (a stall warning's "may have recovered" is none).
    assert not [r for r in caplog.records if r.getMessage().startswith("recovered")]


async def test_a_dead_long_timeout_workers_task_is_still_recovered(
    make_queue: Callable[..., Queue],
) -> None:
    impatient_q = make_queue(visibility_timeout=SHORT)
    attempts: list[int] = []

    @impatient_q.task(name="t.once")
    async def once() -> str:
        context = current_task()
        assert context is not None
        attempts.append(context.attempt)
        return "recovered"

    # A worker with the long timeout fetches the message, then dies: its registration
    # lapses (it never renews it) and its lease is never renewed.
    state: Any = impatient_q.broker.state
    dead = ReliableRedisBroker(state.conn.url, state.keys.namespace)
    try:
        await dead.prepare_consumer(["default"], "dead-patient")
        handle = await once.enqueue()
        (delivery,) = await dead.fetch("default", 1, 0)
        assert delivery.token is not None
        # An hour: were a lapsed registration still honoured, the result would never come.
        await dead.register_worker("dead-patient", b"", 0.5, visibility_timeout=3600.0)
        await eventually(dead.workers, lambda w: "dead-patient" not in w)
        async with running(make_worker(impatient_q)):
            assert await handle.result(timeout=30) == "recovered"
        assert attempts == [2]
    finally:
        await dead.close()
        await impatient_q.close()
