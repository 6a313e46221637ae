"""Fast mode is honest about at-most-once: a SIGKILL may lose the tasks a worker was running,
but no task ever runs twice, and every task that has a record ran exactly once."""

from __future__ import annotations

import random
import signal
from typing import Any

from blitzq import TaskState
from blitzq.serialization import decode_envelope

from .conftest import Harness, wait_until
from .reliability_app import WORK

CONCURRENCY = 4


def test_fast_mode_never_runs_a_task_twice(harness: Harness) -> None:
    """Kill a busy fast-mode worker twice (with replacements), drain the list, stop the rest
    gracefully: run counts are <= 1 everywhere, == 1 for recorded tasks, and only the killed
    workers lost tasks: ones they had started, and at most their free slots of popped ones."""
    queue = harness.queue(mode="fast")
    rng = random.Random(5)
    ids = [f"f{i}" for i in range(200)]
    workers = [harness.spawn(mode="fast", concurrency=CONCURRENCY) for _ in range(2)]
    harness.enqueue(queue, WORK, [(i, rng.uniform(0.01, 0.06)) for i in ids])

    list_key = harness.key("l:default")
    kills = 0
    killed: set[int] = set()
    for _ in range(2):
        victim = rng.choice(workers)

        def busy_or_drained(v: Any = victim, after_a_kill: bool = kills > 0) -> str:
            # After the first kill a drained list ends the wait at once (the second kill
            # used to wait out its 30 s deadline whenever the work was done before it).
            if harness.in_flight(v.pid):
                return "busy"
            return "drained" if after_a_kill and harness.redis.llen(list_key) == 0 else ""

        try:
            state = wait_until(busy_or_drained, 30.0, "a busy victim")
        except AssertionError:
            break
        if state == "drained":
            break
        assert victim.kill() == -signal.SIGKILL
        kills += 1
        killed.add(victim.pid)
        workers.remove(victim)
        workers.append(harness.spawn(mode="fast", concurrency=CONCURRENCY))
    assert kills >= 1

    wait_until(lambda: harness.redis.llen(list_key) == 0, 20.0, "the list to drain")
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(15.0) == 0

    runs = harness.runs()
    states = harness.states(ids)
    waiting = {decode_envelope(m).id for m in harness.redis.lrange(list_key, 0, -1)}
    twice = {i: n for i, n in runs.items() if n > 1}
    assert not twice, f"fast mode ran tasks more than once: {twice}"
    recorded = {i for i, r in states.items() if r is not None}
    for i in recorded:
        assert states[i].state == TaskState.SUCCEEDED  # type: ignore[union-attr]
        assert runs.get(i) == 1
    for i in waiting:
        assert i not in runs  # handed back untouched by a graceful stop
    lost = set(ids) - recorded - waiting
    # Only the killed workers lose tasks: those they started (running, or finished with the
    # completion not yet flushed; a busy machine can hold several of those) ...
    pids = harness.pids()
    started = {i for i in lost if i in runs}
    assert {i: pids[i] for i in started if pids[i] not in killed} == {}
    # ... and those they had popped but not started yet (at most their free slots).
    assert len(lost - started) <= kills * CONCURRENCY, sorted(lost - started)
