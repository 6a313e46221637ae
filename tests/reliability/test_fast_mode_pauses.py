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

import functools
import os
import signal
import time
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from blitzq import Queue, TaskState
from tests.chaos.proxy import FaultProxy
from tests.polling import wait_until
from tests.procfs import proc_state

from .conftest import Harness
from .reliability_app import WORK

pytestmark = pytest.mark.timeout(180)

#: Longer than the default socket_timeout (5 s) plus the block: the pause the fix survives.
PAUSE = 7.0

#: Attempts at catching the idle worker inside its blocked read (it leaves it for a few
#: milliseconds every 3 s, or has not entered it yet just after it started).
ATTEMPTS = 10


def pause(pid: int, then: float) -> None:
    """SIGSTOP ``pid``, run ``then`` seconds of nothing, SIGCONT it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(then)
    finally:
        os.kill(pid, signal.SIGCONT)


def hold_a_popped_reply(
    harness: Harness,
    queue: Queue,
    prefix: str,
    freeze: Callable[[], None],
    thaw: Callable[[], None],
) -> list[str]:
    """Freeze the idle worker (or its network) while it is blocked in BLMPOP, and enqueue one
    message: the server pops it into that read at once, and its reply cannot reach the
    worker. Try again (thawed, the message runs normally) when the worker was caught
    outside the read.

    Returns:
        The labels enqueued; the last one's reply is held, and the worker is left frozen.

    Raises:
        AssertionError: the worker was never caught inside its read.
    """
    list_key = harness.key("l:default")
    labels: list[str] = []
    for attempt in range(ATTEMPTS):
        label = f"{prefix}{attempt}"
        labels.append(label)
        freeze()
        harness.enqueue(queue, WORK, [(label, 0.0)])
        # Redis serves a blocked read in the push's own turn: an empty list now means popped.
        if harness.redis.llen(list_key) == 0:
            return labels
        thaw()
        wait_until(functools.partial(harness.all_final, [label]), 60.0, f"{label} to run")
    raise AssertionError(f"the worker was not inside a blocked read in {ATTEMPTS} attempts")


def test_a_worker_paused_past_its_socket_timeout_loses_no_popped_message(
    harness: Harness,
) -> None:
    queue = harness.queue(mode="fast")
    worker = harness.spawn(mode="fast", concurrency=4, block_timeout=3.0)
    list_key = harness.key("l:default")

    # 1. Idle, the worker is blocked in BLMPOP (3 s blocks): stopped, with a popped reply
    #    waiting in its socket, for longer than its socket_timeout.
    first = hold_a_popped_reply(
        harness,
        queue,
        "p0-",
        lambda: os.kill(worker.pid, signal.SIGSTOP),
        lambda: os.kill(worker.pid, signal.SIGCONT),
    )
    pause(worker.pid, PAUSE)  # already stopped: this only makes the pause PAUSE long

    # 2. Busy, the worker pops without blocking (LPOP/script): stop it mid-drain.
    rest = [f"p{i}" for i in range(1, 201)]
    harness.enqueue(queue, WORK, [(label, 0.005) for label in rest])
    wait_until(lambda: len(harness.runs()) >= 20, 60.0, "the drain to start")
    pause(worker.pid, PAUSE)

    ids = first + rest
    try:
        wait_until(lambda: harness.all_final(ids), 90.0, "every task to end")
    except AssertionError as exc:
        states = harness.states(ids)
        lost = sorted(i for i, r in states.items() if r is None)
        raise AssertionError(
            f"{exc}: fast mode lost {len(lost)} task(s) to a pause: {lost} "
            f"({harness.redis.llen(list_key)} waiting, worker state {proc_state(worker.pid)})"
        ) from None
    worker.signal(signal.SIGTERM)
    assert worker.wait(30.0) == 0
    assert harness.redis.llen(list_key) == 0
    states = harness.states(ids)
    assert {r.state for r in states.values() if r is not None} == {TaskState.SUCCEEDED}
    runs, done = harness.runs(), harness.done()
    assert sorted(runs) == sorted(ids)
    twice = {i: (n, done.get(i)) for i, n in runs.items() if n != 1}
    assert twice == {}, f"(runs, returns) of tasks started more than once: {twice}"


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
        # Idle, the worker is blocked in BLMPOP. The network stalls; the server pops the
        # message into that read at once, and its reply waits in the proxy.
        held = hold_a_popped_reply(harness, queue, "s0-", proxy.partition, proxy.heal)
        try:
            time.sleep(PAUSE)
        finally:
            proxy.heal()
        harness.enqueue(queue, WORK, [("s1", 0.0)])
        # s1 went in after the held one: once it ended, that one ran, runs, or was lost.
        wait_until(lambda: harness.all_final(["s1"]), 60.0, "s1 to end")
        worker.signal(signal.SIGTERM)  # a graceful stop: what was popped ran and is recorded
        assert worker.wait(30.0) == 0
        ids = [*held, "s1"]
        states = harness.states(ids)
        assert {i: r.state if r else None for i, r in states.items()} == dict.fromkeys(
            ids, TaskState.SUCCEEDED
        )
        assert harness.runs() == dict.fromkeys(ids, 1)
    finally:
        proxy.stop()
