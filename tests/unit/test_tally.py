"""RunTally, the per-run counts behind the worker's metrics: outcome kinds as the middleware
get them, histogram buckets (Prometheus ``le``: inclusive upper bounds), the task-name cap
and the scrape-time snapshot. Pure values: no server, no worker running."""

from __future__ import annotations

import itertools
import time
from bisect import bisect_left
from dataclasses import replace

import pytest

from blitzq import Queue
from blitzq.broker import Completion
from blitzq.broker.transport import Delivery
from blitzq.serialization import Envelope
from blitzq.worker import tally
from blitzq.worker.ending import outcome_kind
from blitzq.worker.execution import Job
from blitzq.worker.tally import BUCKETS, OTHER_TASK, Histogram, RunTally

QUEUE = Queue(redis_url="redis://127.0.0.1:1", namespace="tally-unit")


@QUEUE.task(name="tally.noop")
async def noop() -> None:
    return None


def make_job(task: str = "tally.noop", queue: str = "q", started: float = 0.0) -> Job:
    """A job as the runner holds it; ``started``: its ``started_at`` (0: not started)."""
    env = Envelope("id-1", task, queue, enqueued_at=started - 0.02 if started else time.time())
    job = Job(Delivery(queue, b"1-0", b"", 1), env, noop)
    job.started_at = started
    return job


def counts(t: RunTally) -> dict[tuple[str, str, str], int]:
    return t.snapshot()[0]


def test_a_plain_success_counts_once_with_its_duration() -> None:
    t = RunTally()
    job = make_job(started=time.time() - 0.003)
    t.started(job)
    t.committed(job, None, None, False)
    got, durations, latencies = t.snapshot()
    assert got == {("q", "tally.noop", "succeeded"): 1}
    buckets, total = durations[("q", "tally.noop")]
    assert sum(buckets) == 1
    assert buckets[bisect_left(BUCKETS, total)] == 1
    assert 0.003 <= total < 10.0
    lat_buckets, lat_total = latencies["q"]
    assert lat_buckets[bisect_left(BUCKETS, 0.02)] == 1
    assert sum(lat_buckets) == 1
    assert lat_total == pytest.approx(0.02)


def test_a_short_run_lands_in_the_first_bucket() -> None:
    t = RunTally()
    job = make_job(started=time.time() + 3600.0)  # a clock step back: negative duration
    t.committed(job, None, None, False)
    buckets, total = t.snapshot()[1][("q", "tally.noop")]
    assert buckets[0] == 1
    assert sum(buckets) == 1
    assert total == 0.0


def test_bucket_bounds_are_inclusive_and_the_last_bucket_is_inf() -> None:
    h = Histogram()
    for value in (*BUCKETS, BUCKETS[-1] + 1.0, -1.0):
        h.observe(value)
    assert h.counts == [2] + [1] * (len(BUCKETS) - 1) + [1]
    assert h.count == len(BUCKETS) + 2
    assert h.total == pytest.approx(sum(BUCKETS) + BUCKETS[-1] + 1.0)


COMPLETIONS = {
    "none": None,
    "plain": Completion("q", b"1-0", "id-1"),
    "record": Completion("q", b"1-0", "id-1", record=b"r"),
    "reschedule": Completion("q", b"1-0", "id-1", reschedule=b"m", delay=1.0),
    "requeue": Completion("q", b"1-0", "id-1", requeue=b"m"),
    "dead_letter": Completion("q", b"1-0", "id-1", dead_letter=object()),  # type: ignore[arg-type]
}


@pytest.mark.parametrize(
    ("completion", "failed", "cancelled", "encode_error", "started"),
    list(itertools.product(COMPLETIONS, (False, True), (False, True), (False, True), (0, 1))),
)
def test_the_outcome_counted_is_the_kind_the_middleware_get(
    completion: str, failed: bool, cancelled: bool, encode_error: bool, started: int
) -> None:
    t = RunTally()
    job = make_job(started=time.time() if started else 0.0)
    if encode_error:
        job.encode_error = TypeError("not encodable")
    error = ValueError("boom") if failed else None
    c = COMPLETIONS[completion]
    c = replace(c) if c is not None else None  # a fresh copy: counted marks it
    t.committed(job, c, error, cancelled)
    kind = outcome_kind(job, c, error, cancelled)
    expected = {} if kind in (None, "requeued") else {("q", "tally.noop", kind): 1}
    if c is not None:  # fenced (it has a token): counted once the broker applied it
        assert t.snapshot()[0] == {}
        t.written([c], [])
        t.written([c], [])  # a mark is counted once
    got, durations, _ = t.snapshot()
    assert got == expected
    assert (("q", "tally.noop") in durations) == bool(started)


def test_ended_counts_deliveries_that_never_ran() -> None:
    t = RunTally()
    t.ended("q", "tally.noop", "expired")
    t.ended("q", "", "rejected")
    fenced = Completion("q", b"1-0", "id-1")
    t.ended("q", "", "rejected", fenced)
    assert t.snapshot()[0] == {("q", "tally.noop", "expired"): 1, ("q", OTHER_TASK, "rejected"): 1}
    t.written([fenced], [])
    got, durations, latencies = t.snapshot()
    assert got == {("q", "tally.noop", "expired"): 1, ("q", OTHER_TASK, "rejected"): 2}
    assert durations == {}
    assert latencies == {}


@pytest.mark.parametrize("outcome", ["succeeded", "failed", "expired", "rejected"])
def test_a_stale_completion_is_never_counted_and_no_count_goes_down(outcome: str) -> None:
    """The broker refused the completion (another worker recovered the delivery): this
    worker counts nothing for it, neither now nor later, and takes nothing back."""
    t = RunTally()
    applied, stale = Completion("q", b"1-0", "id-1"), Completion("q", b"2-0", "id-2")
    for c in (applied, stale):
        if outcome in ("expired", "rejected"):
            t.ended("q", "tally.noop", outcome, c)
        else:
            t.committed(make_job(), c, ValueError("x") if outcome == "failed" else None, False)
    before = t.snapshot()[0]
    t.written([applied, stale], [stale])
    after = t.snapshot()[0]
    assert all(after.get(k, 0) >= v for k, v in before.items())
    kind = outcome
    if outcome == "failed":
        kind = str(outcome_kind(make_job(), applied, ValueError("x"), False))
    assert after == {("q", "tally.noop", kind): 1}
    t.written([stale], [])  # even if seen again: its mark is gone
    assert t.snapshot()[0] == after


def test_task_names_past_the_cap_share_one_label(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tally, "MAX_TASK_NAMES", 2)
    t = RunTally()
    for name in ("t0", "t1", "t2", "t3", "t0"):
        t.committed(make_job(name), None, None, False)
    t.committed(make_job("t1", queue="other"), None, None, False)  # known name, new queue
    t.committed(make_job("t2", queue="other"), None, None, False)
    assert counts(t) == {
        ("q", "t0", "succeeded"): 2,
        ("q", "t1", "succeeded"): 1,
        ("q", OTHER_TASK, "succeeded"): 2,
        ("other", "t1", "succeeded"): 1,
        ("other", OTHER_TASK, "succeeded"): 1,
    }
    assert len(t.slots) == 5  # names past the cap add no slot of their own


def test_a_snapshot_is_a_copy() -> None:
    t = RunTally()
    job = make_job(started=time.time())
    t.started(job)
    t.committed(job, None, None, False)
    got, durations, latencies = t.snapshot()
    t.started(job)
    t.committed(job, None, None, False)
    assert got[("q", "tally.noop", "succeeded")] == 1
    assert sum(durations[("q", "tally.noop")][0]) == 1
    assert sum(latencies["q"][0]) == 1
    assert counts(t)[("q", "tally.noop", "succeeded")] == 2
