"""Invariant 3: while a worker is alive and its task runs, no other worker runs the message."""

from __future__ import annotations

from blitzq import TaskState

from .conftest import Harness, wait_until
from .reliability_app import BLOCKING, WORK

VT = 1.0


def test_task_longer_than_visibility_timeout_runs_once(harness: Harness) -> None:
    """Tasks running 3x the visibility timeout (one on the event loop, one blocking a thread)
    keep their leases: an idle second worker, recovering every interval, never takes them."""
    queue = harness.queue(vt=VT)
    owner = harness.spawn(concurrency=2, vt=VT)
    harness.enqueue(queue, WORK, [("long-async", 3 * VT)])
    harness.enqueue(queue, BLOCKING, [("long-thread", 3 * VT)])
    labels = ["long-async", "long-thread"]
    wait_until(
        lambda: sorted(harness.in_flight(owner.pid)) == labels, 5.0, "both running on the owner"
    )
    thief = harness.spawn(concurrency=4, vt=VT)

    wait_until(lambda: harness.all_final(labels), 30.0, "both long tasks to finish")
    states = harness.states(labels)
    assert harness.runs() == {"long-async": 1, "long-thread": 1}
    for label in labels:
        record = states[label]
        assert record is not None
        assert record.state == TaskState.SUCCEEDED
        assert record.attempts == 1
        assert record.worker is not None
        assert f":{owner.pid}:" in record.worker
    assert harness.pids() == {"long-async": owner.pid, "long-thread": owner.pid}
    assert int(harness.redis.xlen(harness.key("s:default"))) == 0
    assert owner.alive()
    assert thief.alive()
