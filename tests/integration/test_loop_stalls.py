"""A worker says when its event loop stalled long enough for its leases to lapse.

A user-style test ran a plain function doing ``sum(range(2 * 10**8))`` (one C call: the GIL
held for 15 s, the event loop of the worker starved) with ``visibility_timeout=6``: the task
ran five times and was dead-lettered as "probably crashed", and the only hint in the log
blamed a paused process. ``worker/stalls.py`` now says what happened and what to do.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from blitzq import Queue
from blitzq.worker.stalls import StallWatch
from tests.amqp_server import amqp_url

from .proc_tasks import make_worker, running


def gil_hog(n: int) -> int:
    """Hold the GIL for the whole of one C call (a sum over a range is never interrupted)."""
    return sum(range(n))


@pytest.mark.timeout(120)
async def test_a_thread_task_holding_the_gil_is_named_as_a_stall(
    redis_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = Queue(redis_url=redis_url, namespace=namespace, visibility_timeout=2)
    hog = queue.task(name="stalls.hog")(gil_hog)
    n = 3 * 10**8  # seconds of one C call, more on a loaded machine: over the 1 s bound
    try:
        with caplog.at_level(logging.WARNING, logger="blitzq.worker"):
            async with running(make_worker(queue, concurrency=1)) as worker:
                handle = await hog.enqueue(n)
                assert await handle.result(timeout=100) == n * (n - 1) // 2
                stalls = worker._maintenance.stalls.stalls
    finally:
        await queue.close()
    warned = [r.getMessage() for r in caplog.records if "event loop did not run" in r.getMessage()]
    assert stalls >= 1
    assert warned, [r.getMessage() for r in caplog.records]
    assert "holding the GIL" in warned[0]
    assert "executor='cpu'" in warned[0]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("options", "recovery"),
    [
        ({}, "leases"),
        ({"mode": "fast"}, "none"),
        ({"amqp_url": amqp_url()}, "heartbeats"),  # never connected: aio-pika suffices
    ],
    ids=["streams", "fast", "rabbitmq"],
)
async def test_the_stall_warning_says_what_the_transport_does(
    redis_url: str,
    namespace: str,
    caplog: pytest.LogCaptureFixture,
    options: dict[str, Any],
    recovery: str,
) -> None:
    """A fast-mode worker stopped 20 s was told its leases lapsed and its tasks may run
    again: fast mode has neither. Each transport's warning says what it does (Redis streams:
    leases other workers recover; RabbitMQ: redelivery once the connection's heartbeats
    stop; fast mode: nothing is recovered, a popped task is at most once)."""
    if "amqp_url" in options:
        pytest.importorskip("aio_pika", reason="RabbitMQ needs the 'amqp' extra")
    queue = Queue(redis_url=redis_url, namespace=namespace, visibility_timeout=6, **options)
    try:
        watch = StallWatch.of(queue.visibility_timeout, queue.broker)  # as a worker's
    finally:
        await queue.close()
    assert watch.recovery == recovery
    with caplog.at_level(logging.WARNING, logger="blitzq.worker"):
        assert not watch.woke(1.0, 3.5)  # late by less than half the visibility timeout
        assert watch.woke(1.0, 21.0)
    [warned] = [r.getMessage() for r in caplog.records]
    assert warned.startswith("this worker's event loop did not run for 21.0 s: ")
    assert "executor='cpu'" in warned
    recovered = "may have recovered its running tasks and run them again"
    if recovery == "leases":
        assert "lease renewals stopped" in warned
        assert "after visibility_timeout (6.0 s)" in warned
        assert recovered in warned
    elif recovery == "heartbeats":
        assert "lease" not in warned
        assert "AMQP heartbeats" in warned
        assert "RabbitMQ may have closed its connection and redelivered" in warned
    else:
        assert "lease" not in warned
        assert recovered not in warned
        assert "in fast mode nothing recovers its running tasks" in warned
        assert "at most once" in warned
        assert "raise visibility_timeout" not in warned
