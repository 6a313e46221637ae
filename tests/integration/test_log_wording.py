"""Log lines say what is known (issue: misleading lines after a pause or a server restart).

- A fetch that ends in a client-side timeout while the server answers at once (after the
  process was paused by SIGSTOP, or its event loop blocked) is not logged as a failed fetch.
- A stale completion names both causes the worker cannot tell apart: its lease lapsed and
  another worker took the message over, or the server lost the delivery (a restart without
  persistence).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import BrokerError, Queue
from blitzq.broker import Completion
from blitzq.worker.fetch import Fetcher
from blitzq.worker.flusher import Flusher

pytestmark = pytest.mark.timeout(60)


class AWorker:
    """What a Fetcher reads of its worker at construction: its key."""

    key = "wording-test"


_TIMEOUT = BrokerError("TimeoutError: Timeout reading from 127.0.0.1:6379", True)


async def test_a_client_side_timeout_with_a_server_that_answers_is_not_a_failed_fetch(
    make_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue()
    caplog.set_level(logging.WARNING, logger="blitzq.worker")
    fetcher = Fetcher(AWorker(), queue.broker, None, {})  # type: ignore[arg-type]
    try:
        assert await fetcher._timed_out_here("default", _TIMEOUT) is True
        (line,) = [r.getMessage() for r in caplog.records]
        assert "fetch from default: no reply read within the client's time limit" in line
        assert "the server answers at once: this process's event loop did not run" in line
        assert "holding the GIL" in line
        assert "failed" not in line
        # Another error is not a timeout on this side: logged as a failure by the loop.
        other = BrokerError("ResponseError: WRONGTYPE", False)
        assert await fetcher._timed_out_here("default", other) is False
    finally:
        await queue.close()


async def test_a_client_side_timeout_with_a_server_that_does_not_answer_is_a_failure() -> None:
    queue = Queue(redis_url="redis://127.0.0.1:1/0?socket_connect_timeout=0.5", namespace="w")
    fetcher = Fetcher(AWorker(), queue.broker, None, {})  # type: ignore[arg-type]
    try:
        assert await fetcher._timed_out_here("default", _TIMEOUT) is False
    finally:
        await queue.close()


async def test_a_stale_completion_names_both_causes(
    make_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture
) -> None:
    queue = make_queue()
    broker: Any = queue.broker
    caplog.set_level(logging.WARNING, logger="blitzq.worker")
    try:
        await broker.prepare_consumer(["q"], "c1")
        await broker.publish("q", [b"body"])
        (delivery,) = await broker.fetch_first(["q"], 1, 0)
        assert await broker.complete([Completion("q", delivery.token, "t1", b"rec", 60)]) == []
        flusher = Flusher(broker)
        writer = asyncio.create_task(flusher.run())
        flusher.add(Completion("q", delivery.token, "t1", b"again", 60, requeue=b"x"))
        await asyncio.wait_for(flusher.flush(), 30)
        flusher.close()
        await asyncio.wait_for(writer, 30)
        assert flusher.stale == 1
        (line,) = [r.getMessage() for r in caplog.records if "stale completion" in r.getMessage()]
        assert "its lease lapsed and another worker took the message over" in line
        assert "or the server lost it: a restart without persistence" in line
        assert "recovered the message" not in line
    finally:
        await queue.close()
