"""Invariant 2: a message is acknowledged only together with its completion record.

While workers run and are SIGKILLed at random moments, atomic snapshots (MULTI: the whole
stream and every task's record) must always show each enqueued task either still in the
stream (waiting or pending) or with its record written: never acknowledged without a record.
"""

from __future__ import annotations

import random
import time

from blitzq import TaskState
from blitzq.serialization import decode_envelope

from .conftest import Harness, wait_until
from .reliability_app import WORK

VT = 1.5


def _snapshot(harness: Harness, ids: list[str]) -> tuple[set[str], set[str]]:
    """(ids in the stream, ids with a record), read in one transaction."""
    with harness.redis.pipeline(transaction=True) as pipe:
        pipe.xrange(harness.key("s:default"))
        pipe.mget([harness.key("t:" + i) for i in ids])
        entries, records = pipe.execute()
    in_stream = {decode_envelope(fields[b"m"]).id for _, fields in entries}
    recorded = {i for i, r in zip(ids, records, strict=True) if r is not None}
    return in_stream, recorded


def test_no_ack_without_record_under_sigkill(harness: Harness) -> None:
    """Sample the keyspace continuously while killing workers: no task ever vanishes."""
    queue = harness.queue(vt=VT)
    rng = random.Random(11)
    ids = [f"t{i}" for i in range(240)]
    harness.enqueue(queue, WORK, [(i, rng.uniform(0.005, 0.06)) for i in ids])
    workers = [harness.spawn(concurrency=4, vt=VT, wait_ready=False) for _ in range(3)]

    samples = kills = 0
    next_kill = time.monotonic() + 0.4
    deadline = time.monotonic() + 40.0
    while True:
        in_stream, recorded = _snapshot(harness, ids)
        samples += 1
        vanished = set(ids) - in_stream - recorded
        assert not vanished, f"acknowledged without a record: {sorted(vanished)}"
        if len(recorded) == len(ids):
            break
        assert time.monotonic() < deadline, "tasks did not finish in time"
        if kills < 4 and time.monotonic() >= next_kill:
            victim = rng.choice([w for w in workers if w.alive()])
            victim.kill()
            kills += 1
            workers.remove(victim)
            workers.append(harness.spawn(concurrency=4, vt=VT, wait_ready=False))
            next_kill = time.monotonic() + rng.uniform(0.2, 0.5)
        time.sleep(0.005)

    assert kills >= 2, "the tasks finished before the workers could be killed"
    assert samples > 50
    states = harness.states(ids)
    assert all(r is not None and r.state == TaskState.SUCCEEDED for r in states.values())
    wait_until(
        lambda: int(harness.redis.xlen(harness.key("s:default"))) == 0, 5.0, "an empty stream"
    )
