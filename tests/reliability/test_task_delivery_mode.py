"""Per-task delivery mode: a task declared ``@queue.task(mode="fast")`` on a reliable Queue
travels the fast path (a Redis list, at-most-once) while the Queue's other tasks stay on
their stream; the Queue's workers (real subprocesses) run both, and a SIGKILL loses the fast
one it was running while the reliable one is recovered by another worker."""

from __future__ import annotations

import pytest

from blitzq import ConfigurationError, Queue, TaskState
from blitzq.broker.redis.keys import Keys
from blitzq.serialization import decode_envelope

from .conftest import Harness, wait_until
from .reliability_app import FAST_WORK, FENCED, WORK


def test_a_fast_task_travels_the_list_and_a_reliable_one_the_stream(harness: Harness) -> None:
    queue = harness.queue(fast_task=True)
    keys = Keys(harness.namespace)
    fast, reliable = queue.tasks[FAST_WORK], queue.tasks[WORK]
    assert fast.fast
    assert not reliable.fast
    harness.enqueue(queue, FAST_WORK, [("f1", 0.0)])  # with a task id: the batch path
    fast.enqueue_sync("f2", 0.0)  # the one-message path
    queue.send_sync(FAST_WORK, ["f3", 0.0])  # by name
    harness.enqueue(queue, WORK, [("r1", 0.0)])
    waiting = harness.redis.lrange(keys.list("default"), 0, -1)
    assert sorted(decode_envelope(m).args[0] for m in waiting) == ["f1", "f2", "f3"]
    assert {decode_envelope(m).task for m in waiting} == {FAST_WORK}
    entries = harness.redis.xrange(keys.stream("default"))
    assert [decode_envelope(fields[b"m"]).task for _, fields in entries] == [WORK]
    # `queue.stats()` (and `blitzq queue stats`) count both paths.
    assert queue.stats_sync(["default"])["queues"]["default"]["waiting"] == 4

    harness.spawn(fast_task=True)
    wait_until(lambda: harness.all_final(["f1", "r1"]), 30.0, "both tasks run")
    states = harness.states(["f1", "r1"])
    assert {i: r.state for i, r in states.items() if r} == {
        "f1": TaskState.SUCCEEDED,
        "r1": TaskState.SUCCEEDED,
    }
    wait_until(lambda: harness.runs().keys() >= {"f2", "f3"}, 30.0, "the other fast calls run")
    assert harness.redis.llen(keys.list("default")) == 0


def test_a_kill_loses_the_fast_task_and_the_reliable_one_is_recovered(harness: Harness) -> None:
    queue = harness.queue(fast_task=True)
    keys = Keys(harness.namespace)
    victim = harness.spawn(fast_task=True, concurrency=4)
    harness.enqueue(queue, FAST_WORK, [("f", 120.0)])
    # The reliable one sleeps on its first attempt only: its redelivery returns at once.
    queue.tasks[FENCED].options(task_id="r").enqueue_sync("r", 120.0, False)
    wait_until(
        lambda: set(harness.in_flight(victim.pid)) >= {"f", "r"}, 30.0, "both running in the victim"
    )
    victim.kill()
    harness.spawn(fast_task=True, concurrency=4)
    wait_until(lambda: harness.all_final(["r"]), 60.0, "the reliable task recovered")
    states = harness.states(["f", "r"])
    assert states["r"] is not None
    assert states["r"].state == TaskState.SUCCEEDED
    assert harness.runs()["r"] == 2  # the first run was killed, the redelivery finished
    # The fast one ran once, in the killed worker, and nothing is left to deliver it again:
    # no record, not on its list, not on the stream, not scheduled.
    assert harness.runs()["f"] == 1
    assert states["f"] is None
    assert harness.redis.llen(keys.list("default")) == 0
    assert harness.redis.xlen(keys.stream("default")) == 0
    assert harness.redis.zcard(keys.schedule) == 0


@pytest.mark.parametrize("mode", ["reliable", "FAST", 1])
def test_a_task_mode_other_than_fast_is_refused(mode: object) -> None:
    queue = Queue("modes", redis_url="redis://127.0.0.1:1")  # never connects
    with pytest.raises(ConfigurationError, match="mode must be 'fast'"):
        queue.task(name="t", mode=mode)(lambda: None)  # type: ignore[arg-type]
