"""Invariant 1: reliable mode loses no task when workers are SIGKILLed, and any live worker
recovers abandoned messages within visibility_timeout plus one maintenance interval."""

from __future__ import annotations

import random
import signal
import time

from blitzq import TaskState

from .conftest import Harness, WorkerProcess, wait_until
from .reliability_app import BLOCKING, WORK

VT = 1.5
#: The worker's maintenance interval for VT (a third of it).
INTERVAL = VT / 3


def _stream_counts(harness: Harness) -> tuple[int, int]:
    """(entries in the queue's stream, entries pending in its consumer group)."""
    stream = harness.key("s:default")
    length = int(harness.redis.xlen(stream))
    pending = int(harness.redis.xpending(stream, "blitzq")["pending"]) if length else 0
    return length, pending


def _busy(harness: Harness, workers: list[WorkerProcess]) -> list[WorkerProcess]:
    """The workers in ``workers`` running a task now."""
    return [w for w in workers if harness.in_flight(w.pid)]


def test_sigkilled_workers_lose_no_task(harness: Harness) -> None:
    """600 tasks, three workers, one SIGKILLed mid-task several times: every task succeeds,
    the tasks that were running in a killed worker ran again, and the stream ends empty."""
    queue = harness.queue(vt=VT)
    rng = random.Random(7)
    labels = [f"k{i}" for i in range(600)]
    durations = {label: rng.uniform(0.005, 0.12) for label in labels}
    workers = [harness.spawn(concurrency=3, vt=VT) for _ in range(3)]

    interrupted: list[str] = []
    kills = 0
    # Each kill's quarter of the tasks is enqueued just before it, so that a busy machine
    # cannot drain the whole backlog before the later kills (a user test: 600 at once did).
    for quarter in (labels[i::4] for i in range(4)):
        harness.enqueue(queue, WORK, [(label, durations[label]) for label in quarter])
        try:
            wait_until(lambda: _busy(harness, workers), 30.0, "a busy victim")
        except AssertionError:
            continue  # this quarter drained first
        busy = _busy(harness, workers)
        if not busy:
            continue
        victim = rng.choice(busy)
        assert victim.kill() == -signal.SIGKILL
        kills += 1
        # Read after the kill: a body that returned (and whose completion was written)
        # between the check above and the kill was not interrupted.
        interrupted += harness.in_flight(victim.pid)
        workers.remove(victim)
        workers.append(harness.spawn(concurrency=3, vt=VT))

    assert kills >= 2, "the backlog drained before the workers could be killed mid-run"
    wait_until(lambda: harness.all_final(labels), 60.0, "every task to reach a final state")
    states = harness.states(labels)
    not_succeeded = {i: r for i, r in states.items() if r is None or r.state != TaskState.SUCCEEDED}
    assert not not_succeeded, f"tasks lost or failed: {not_succeeded}"
    assert all(states[i].result == i for i in labels)  # type: ignore[union-attr]
    runs = harness.runs()
    assert set(runs) == set(labels)
    for label in interrupted:
        # Killed mid-run, so its body started again on another worker and finished there.
        assert runs[label] >= 2, (label, runs[label])
    wait_until(lambda: _stream_counts(harness) == (0, 0), 60.0, "an empty stream")
    for w in workers:
        assert w.alive()


def test_busy_survivor_recovers_within_visibility_timeout(harness: Harness) -> None:
    """A survivor with concurrency 1 that is busy with a long blocking task still recovers
    a killed worker's messages within visibility_timeout + one maintenance interval, then
    runs them once its slot frees."""
    queue = harness.queue(vt=VT)
    survivor = harness.spawn(concurrency=1, vt=VT)
    harness.enqueue(queue, BLOCKING, [("busy", 10.0)])
    wait_until(lambda: harness.pids().get("busy") == survivor.pid, 30.0, "survivor busy")

    victim = harness.spawn(concurrency=4, vt=VT)
    abandoned = ["a0", "a1", "a2"]
    harness.enqueue(queue, WORK, [(label, 0.6) for label in abandoned])
    wait_until(
        lambda: sorted(harness.in_flight(victim.pid)) == abandoned, 5.0, "victim runs all three"
    )
    victim.kill()
    killed_at = time.monotonic()

    def recovered() -> bool:
        entries = harness.redis.xrange(harness.key("s:default"))
        return sum(1 for _, fields in entries if fields.get(b"d") == b"2") == len(abandoned)

    wait_until(recovered, VT + INTERVAL + 5.0, "the abandoned messages back in the stream")
    elapsed = time.monotonic() - killed_at
    # VT + one maintenance interval, plus generous slack for a busy machine; still well
    # before the survivor's 10 s task ends (checked next).
    assert elapsed <= VT + INTERVAL + 3.0, f"recovery took {elapsed:.2f} s"
    assert "busy" not in harness.done(), "the survivor was not busy during recovery"

    wait_until(lambda: harness.all_final([*abandoned, "busy"]), 40.0, "survivor runs them")
    states = harness.states(abandoned)
    pids = harness.pids()
    runs = harness.runs()
    for label in abandoned:
        record = states[label]
        assert record is not None
        assert record.state == TaskState.SUCCEEDED
        assert record.attempts == 2
        assert pids[label] == survivor.pid
        assert runs[label] == 2
    assert survivor.alive()
