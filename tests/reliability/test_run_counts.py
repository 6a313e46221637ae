"""The namespace's run counters survive a SIGKILL: a worker's runs are added to ``{ns}:stats``
``processed`` / ``failed`` in the same script call as their completions, so a worker killed
with -9 right after its records were written has counted every one of them (they were added
through its registrations, about once a second, which lost a killed worker's last second).

Reliable mode, fast mode with results stored and the RabbitMQ transport (state on Redis);
each waits on the records, never on time, then kills the worker at once.
"""

from __future__ import annotations

import signal

import pytest

from blitzq import Queue

from .conftest import Harness, wait_until
from .reliability_app import FENCED, WORK
from .test_amqp_reliability import _queue as amqp_queue
from .test_amqp_reliability import amqp  # noqa: F401 - the fixture, used by name

pytestmark = [pytest.mark.timeout(120), pytest.mark.both_servers]

#: Tasks that succeed and that fail (each fails its only attempt: no retries).
SUCCEED, FAIL = 36, 9
#: The visibility timeout: long, so that the maintenance (every third of it) registers the
#: worker only at its start in these runs (the counts refresh goes on every second).
VT = 30.0


def _stats(harness: Harness) -> tuple[int, int]:
    """The namespace's ``processed`` / ``failed`` counters."""
    raw = harness.redis.hmget(harness.key("stats"), ["processed", "failed"])
    return int(raw[0] or 0), int(raw[1] or 0)


def _run_then_kill(harness: Harness, queue: Queue, mode: str = "reliable") -> None:
    """Run SUCCEED tasks that succeed and FAIL that fail on one worker, SIGKILL it as soon
    as every record is final, and check that the counters match the records."""
    worker = harness.spawn(mode=mode, concurrency=4, vt=VT)
    good = [f"g{i}" for i in range(SUCCEED)]
    bad = [f"b{i}" for i in range(FAIL)]
    harness.enqueue(queue, WORK, [(label, 0.0) for label in good])
    task = queue.tasks[FENCED]
    for label in bad:
        task.options(task_id=label).enqueue_sync(label, 0.0, True)
    labels = good + bad
    wait_until(lambda: harness.all_final(labels), 60.0, "every record final")
    assert worker.kill() == -signal.SIGKILL
    states = harness.states(labels)
    succeeded = sum(1 for r in states.values() if r is not None and r.state == "succeeded")
    failed = sum(1 for r in states.values() if r is not None and r.state != "succeeded")
    assert (succeeded, failed) == (SUCCEED, FAIL), states
    assert _stats(harness) == (succeeded, failed)


def test_a_sigkilled_reliable_worker_counted_every_run_it_completed(harness: Harness) -> None:
    _run_then_kill(harness, harness.queue(vt=VT))


def test_a_sigkilled_fast_worker_counted_every_run_it_stored(harness: Harness) -> None:
    """Fast mode with results stored: each run's record is a completion write, and counts
    with it (without results nothing is written, and the registrations count the run)."""
    _run_then_kill(harness, harness.queue(mode="fast", vt=VT), mode="fast")


@pytest.mark.usefixtures("amqp")
def test_a_sigkilled_rabbitmq_worker_counted_every_run_it_completed(harness: Harness) -> None:
    """RabbitMQ: the completions go to the Redis state store (commit, then ack), which
    counts the runs with the records."""
    _run_then_kill(harness, amqp_queue(harness))
