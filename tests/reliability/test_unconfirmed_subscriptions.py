"""Result waits whose subscriptions the server does not confirm (frozen with SIGSTOP here;
a busy server under load) fall back to polling with one WARNING for the episode, not one per
waiting handle, and one INFO with their count once confirmations come back
(``broker/redis/result_listener.py``, ``log_episodes.py``)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from blitzq.broker.redis.client import make_client
from blitzq.broker.redis.result_listener import ResultListener

from .conftest import PrivateRedis

pytestmark = pytest.mark.timeout(60)

WAITS = 40


async def test_unconfirmed_subscriptions_are_one_episode(
    private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "blitzq.broker")
    client = make_client(private_redis.url)
    listener = ResultListener(client)  # one channel per wait, as on a cluster
    try:
        await listener.subscribe("{t}:done:first")  # the pub/sub connection, confirmed
        assert private_redis.proc is not None
        pid = private_redis.proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            waits = [listener.subscribe(f"{{t}}:done:{n}") for n in range(WAITS)]
            futures = await asyncio.gather(*waits)  # each gives up on its confirmation
        finally:
            os.kill(pid, signal.SIGCONT)
        assert len(futures) == WAITS
        assert listener.unconfirmed.count == WAITS
        listener.unconfirmed.settle = 0.0  # the next confirmed subscription ends it
        await listener.subscribe("{t}:done:after")
        lines = [
            (r.levelno, r.getMessage())
            for r in caplog.records
            if r.name == "blitzq.broker" and "subscription" in r.getMessage()
        ]
        assert [level for level, _ in lines] == [logging.WARNING, logging.INFO], lines
        assert "falls back to polling" in lines[0][1]
        assert f"works again, after {WAITS} failure(s)" in lines[1][1]
    finally:
        await listener.close()
        await client.aclose()
