"""Fencing with real worker processes: a worker paused past its lease writes nothing.

W1 starts a task and is SIGSTOPped longer than the visibility timeout; W2 recovers the
message and finishes it. After SIGCONT, W1's late completion (a success, or a failure that
would dead-letter the task) is refused as stale: the record stays W2's, no dead letter is
made, the namespace's ``stale_completions`` counter is 1 and W1 logs one WARNING.
"""

from __future__ import annotations

import signal

import pytest

from blitzq import TaskState

from .conftest import Harness, wait_until
from .reliability_app import FENCED

VT = 1.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fail_first", [False, True], ids=["late-success", "late-failure"])
def test_a_paused_worker_cannot_overwrite_the_recovered_run(
    harness: Harness, fail_first: bool
) -> None:
    queue = harness.queue(vt=VT)
    w1 = harness.spawn(concurrency=2, vt=VT)
    label = "fenced-" + ("fail" if fail_first else "ok")
    queue.tasks[FENCED].options(task_id=label).enqueue_sync(label, 2.0, fail_first)
    wait_until(lambda: harness.pids().get(label) == w1.pid, 20.0, "W1 to start the task")
    w1.signal(signal.SIGSTOP)
    try:
        w2 = harness.spawn(concurrency=2, vt=VT)
        wait_until(lambda: harness.all_final([label]), 30.0, "W2 to recover and finish it")
        before = harness.states([label])[label]
        assert before is not None
        assert before.state is TaskState.SUCCEEDED
        assert before.worker is not None
        assert f":{w2.pid}:" in before.worker
        assert before.result == w2.pid
    finally:
        w1.signal(signal.SIGCONT)

    def warned() -> bool:
        text = w1.log.read_text(errors="replace")
        return f"stale completion of task {label} from queue default" in text

    wait_until(warned, 30.0, "W1 to log its stale completion")
    after = harness.states([label])[label]
    assert after is not None
    assert after.state is TaskState.SUCCEEDED
    assert after.worker == before.worker
    assert after.result == w2.pid
    assert harness.runs()[label] == 2
    assert harness.redis.zcard(harness.key("dlq")) == 0
    assert harness.redis.exists(harness.key("d:" + label)) == 0
    assert harness.redis.hget(harness.key("stats"), "stale_completions") == b"1"
    log = w1.log.read_text(errors="replace")
    assert log.count(f"stale completion of task {label}") == 1
    assert "WARNING" in next(line for line in log.splitlines() if "stale completion" in line)
    assert int(harness.redis.xlen(harness.key("s:default"))) == 0
    assert w1.alive()
    assert w2.alive()
