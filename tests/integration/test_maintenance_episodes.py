"""A background step that fails the same way every maintenance round is logged once when it
starts and once when it works again (``log_episodes.py``; user test: "taking handed messages:
TryAgainError" once per round while a cluster slot's keys were split between two nodes).

Here the failure that lasts is the worker's handed set holding a string (``WRONGTYPE`` on
every ``take_handed.lua`` call) while a task runs, so its queue is looked at each round: the
worker goes through several rounds, logs one WARNING, and one INFO with the count once the
key is deleted. Runs on the session's server and on the embedded Valkey.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue
from blitzq.broker.redis.keys import Keys

from .proc_tasks import eventually, make_worker, running
from .test_mixed_timeouts import rounds_done

pytestmark = [pytest.mark.timeout(90), pytest.mark.both_servers]

ROUNDS = 6


async def test_a_step_failing_each_round_is_logged_once(
    make_queue: Callable[..., Queue],
    namespace: str,
    raw_redis: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = make_queue(mode="reliable", visibility_timeout=1.5)
    gate, started = asyncio.Event(), asyncio.Event()

    @queue.task(name="episodes.held")
    async def held() -> str:
        started.set()
        await gate.wait()
        return "done"

    caplog.set_level(logging.DEBUG, logger="blitzq.worker")
    worker = make_worker(queue)
    try:
        async with running(worker):
            handle = await held.enqueue()  # in flight: the queue is looked at each round
            await asyncio.wait_for(started.wait(), 20)
            consumer = queue.broker.transport.consumer
            key = Keys(namespace).handed(queue.name, consumer)
            await raw_redis.set(key, "oops")
            await rounds_done(worker, ROUNDS)
            failures = worker._maintenance.episodes["handed"]
            await eventually(lambda: asyncio.sleep(0, failures.count), lambda n: n >= ROUNDS)
            await raw_redis.delete(key)
            await eventually(lambda: asyncio.sleep(0, failures.count), lambda n: n == 0)
            gate.set()
            assert await handle.result(timeout=20) == "done"
        lines = [
            (r.levelno, r.getMessage())
            for r in caplog.records
            if r.getMessage().startswith("taking handed messages")
        ]
        shown = [(level, text) for level, text in lines if level > logging.DEBUG]
        assert [level for level, _ in shown] == [logging.WARNING, logging.INFO], shown
        assert "WRONGTYPE" in shown[0][1]
        assert "works again, after" in shown[1][1]
        assert len(lines) - len(shown) >= ROUNDS - 1  # the others at DEBUG
    finally:
        gate.set()
        await queue.close()
