"""Fast mode loses no popped message to a paused worker or a stalled network (issue 28,
item 5).

A fast-mode worker stopped (SIGSTOP) longer than its connection's ``socket_timeout`` (5 s)
while the server answers one of its pops used to time the read out when it resumed, close
the connection and drop the message the server had already popped; so did a network stall
that held the reply back that long. A pop's deadline now counts only the time the worker's
event loop ran, and lasts the block plus 30 s (``broker/redis/popping.py``): the reply is
read when the worker resumes or the network heals. All tasks run; counts are asserted,
never timings.
"""

from __future__ import annotations

import os
import signal
import time
from urllib.parse import urlsplit

import pytest

from blitzq import TaskState
from tests.chaos.proxy import FaultProxy

from .conftest import Harness, wait_until
from .reliability_app import WORK

pytestmark = pytest.mark.timeout(180)

#: Longer than the default socket_timeout (5 s) plus the block: the pause the fix survives.
PAUSE = 7.0


def pause(harness: Harness, pid: int, then: float) -> None:
    """SIGSTOP ``pid``, run ``then`` seconds of nothing, SIGCONT it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(then)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_worker_paused_past_its_socket_timeout_loses_no_popped_message(
    harness: Harness,
) -> None:
    queue = harness.queue(mode="fast")
    worker = harness.spawn(mode="fast", concurrency=4, block_timeout=3.0)
    list_key = harness.key("l:default")
    first = ["p0"]
    rest = [f"p{i}" for i in range(1, 201)]

    # 1. Idle, the worker is blocked in BLMPOP (3 s blocks). Stop it, then enqueue: the
    #    server pops the first message into the stopped worker's blocked read at once.
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        harness.enqueue(queue, WORK, [(label, 0.0) for label in first])
        time.sleep(PAUSE)
        # Nothing is waiting: the server popped it for the stopped worker (or the blocked
        # read had just ended, and the message waits: then this phase proves less).
        popped_while_stopped = harness.redis.llen(list_key) == 0
    finally:
        os.kill(worker.pid, signal.SIGCONT)

    # 2. Busy, the worker pops without blocking (LPOP/script): stop it mid-drain.
    harness.enqueue(queue, WORK, [(label, 0.005) for label in rest])
    wait_until(lambda: len(harness.runs()) >= 20, 60.0, "the drain to start")
    pause(harness, worker.pid, PAUSE)

    ids = first + rest
    wait_until(
        lambda: harness.redis.llen(list_key) == 0 and not harness.in_flight(worker.pid),
        90.0,
        "the list to drain",
    )
    worker.signal(signal.SIGTERM)  # a graceful stop: what was popped ran and is recorded
    assert worker.wait(30.0) == 0
    assert harness.redis.llen(list_key) == 0
    states = harness.states(ids)
    lost = sorted(i for i, r in states.items() if r is None)
    assert lost == [], f"fast mode lost {len(lost)} task(s) to a pause: {lost}"
    assert {r.state for r in states.values() if r is not None} == {TaskState.SUCCEEDED}
    runs = harness.runs()
    assert sorted(runs) == sorted(ids)
    assert set(runs.values()) == {1}  # at-most-once still: nothing ran twice
    assert popped_while_stopped, "the first message was not popped during the pause"


def test_a_network_stall_past_the_socket_timeout_loses_no_popped_message(
    harness: Harness, server_url: str
) -> None:
    url = urlsplit(server_url)
    if url.scheme != "redis" or url.hostname is None or url.port is None:
        pytest.skip("the fault proxy forwards TCP only")
    proxy = FaultProxy(url.hostname, url.port)
    proxy.start()
    try:
        queue = harness.queue(mode="fast")  # the producer talks to the server directly
        harness.worker_url = proxy.url
        worker = harness.spawn(mode="fast", concurrency=4, block_timeout=3.0)
        list_key = harness.key("l:default")
        # Idle, the worker is blocked in BLMPOP. The network stalls; the server pops the
        # message into that read at once, and its reply waits in the proxy.
        proxy.partition()
        try:
            harness.enqueue(queue, WORK, [("s0", 0.0)])
            time.sleep(PAUSE)
            popped_during_stall = harness.redis.llen(list_key) == 0
        finally:
            proxy.heal()
        harness.enqueue(queue, WORK, [("s1", 0.0)])
        # s1 went in after s0: once it ended, s0 ran, runs, or was lost.
        wait_until(lambda: harness.all_final(["s1"]), 60.0, "s1 to end")
        worker.signal(signal.SIGTERM)  # a graceful stop: what was popped ran and is recorded
        assert worker.wait(30.0) == 0
        states = harness.states(["s0", "s1"])
        assert {i: r.state if r else None for i, r in states.items()} == {
            "s0": TaskState.SUCCEEDED,
            "s1": TaskState.SUCCEEDED,
        }
        assert harness.runs() == {"s0": 1, "s1": 1}
        assert popped_during_stall, "the message was not popped during the stall"
    finally:
        proxy.stop()
