"""Invariant 4: a message that keeps killing its worker is dead-lettered after max_deliveries
deliveries with a reason; it never loops forever and the replacement workers go on working."""

from __future__ import annotations

import signal
import time

import pytest

from blitzq import TaskFailed, TaskState
from blitzq.worker.solo import solo_plan

from .conftest import Harness, WorkerProcess
from .reliability_app import POISON, WORK

VT = 1.0
MAX_DELIVERIES = 3


def _supervise(
    harness: Harness,
    workers: list[WorkerProcess],
    until: list[str],
    timeout: float,
    concurrency: int = 2,
) -> list[int]:
    """Replace dead workers until every id in ``until`` is final; return the exit codes seen.

    Raises:
        AssertionError: not done within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    exits: list[int] = []
    while not harness.all_final(until):
        assert time.monotonic() < deadline, f"not final after {timeout} s: {until}"
        for i, w in enumerate(workers):
            if not w.alive():
                exits.append(w.proc.returncode)
                workers[i] = harness.spawn(
                    concurrency=concurrency,
                    vt=VT,
                    max_deliveries=MAX_DELIVERIES,
                    wait_ready=False,
                )
        time.sleep(0.05)
    return exits


def test_worker_killing_task_is_dead_lettered(harness: Harness) -> None:
    """The poison task SIGKILLs its worker on every delivery: after MAX_DELIVERIES runs it is
    dead-lettered ("max deliveries exceeded"), result() raises TaskFailed, and every other
    task, before and after, succeeds on the replacement workers."""
    queue = harness.queue(vt=VT, max_deliveries=MAX_DELIVERIES)
    workers = [harness.spawn(concurrency=2, vt=VT, max_deliveries=MAX_DELIVERIES) for _ in range(2)]
    before = [f"b{i}" for i in range(30)]
    harness.enqueue(queue, WORK, [(label, 0.02) for label in before[:15]])
    handle = queue.tasks[POISON].options(task_id="poison").enqueue_sync("poison", 0.3)
    harness.enqueue(queue, WORK, [(label, 0.02) for label in before[15:]])

    exits = _supervise(harness, workers, ["poison", *before], timeout=30.0)
    assert harness.runs()["poison"] == MAX_DELIVERIES
    assert exits.count(-signal.SIGKILL) == MAX_DELIVERIES
    with pytest.raises(TaskFailed) as info:
        handle.result_sync(timeout=1.0)
    assert info.value.task_id == "poison"
    assert info.value.state == "dead_lettered"
    assert info.value.error_type == "MaxDeliveriesExceeded"
    record = queue.inspect_sync("poison")
    assert record is not None
    assert record.state == TaskState.DEAD_LETTERED
    assert record.attempts == MAX_DELIVERIES
    letters = {d.id: d for d in queue.dead_letters_sync()}
    assert set(letters) == {"poison"}
    assert letters["poison"].reason == "max deliveries exceeded"
    assert letters["poison"].task == POISON

    after = [f"a{i}" for i in range(30)]
    harness.enqueue(queue, WORK, [(label, 0.02) for label in after])
    _supervise(harness, workers, after, timeout=15.0)
    states = harness.states(before + after)
    assert all(r is not None and r.state == TaskState.SUCCEEDED for r in states.values())
    assert harness.runs()["poison"] == MAX_DELIVERIES  # never ran again
    assert int(harness.redis.xlen(harness.key("s:default"))) == 0


@pytest.mark.parametrize("poisons", [1, 3])
def test_poison_tasks_dead_letter_only_themselves(harness: Harness, poisons: int) -> None:
    """Poison tasks enqueued first, then good tasks, one worker of concurrency 4 (restarted
    each time it dies): the good tasks running or fetched beside a poison task die with its
    worker, each crash counted as a delivery of theirs too. A redelivered task runs alone
    from its third delivery and only its solo runs count against it (worker/solo.py): every
    good task succeeds, only the poison tasks are dead-lettered."""
    queue = harness.queue(vt=VT, max_deliveries=MAX_DELIVERIES)
    bad = [f"poison{i}" for i in range(poisons)]
    good = [f"g{i}" for i in range(20)]
    for label in bad:
        queue.tasks[POISON].options(task_id=label).enqueue_sync(label, 0.2)
    harness.enqueue(queue, WORK, [(label, 0.3) for label in good])
    workers = [harness.spawn(concurrency=4, vt=VT, max_deliveries=MAX_DELIVERIES)]

    _supervise(harness, workers, bad + good, timeout=120.0, concurrency=4)
    states = harness.states(good)
    failed = {i: r for i, r in states.items() if r is None or r.state != TaskState.SUCCEEDED}
    assert not failed, harness.logs()
    runs = harness.runs()
    for label in bad:
        record = queue.inspect_sync(label)
        assert record is not None
        assert record.state == TaskState.DEAD_LETTERED
        assert record.error_type == "MaxDeliveriesExceeded"
        # Its solo runs all ran; its runs beside others may not have started (fetched
        # while another poison task ran).
        assert solo_plan(MAX_DELIVERIES)[1] <= runs[label] <= MAX_DELIVERIES
    assert {d.id for d in queue.dead_letters_sync()} == set(bad)
