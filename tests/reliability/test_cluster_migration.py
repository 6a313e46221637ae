"""Workers keep running every queue once while one queue's slot migrates (tester finding 3).

On the session's local 3-primary Redis Cluster, spread layout: two workers serve a queue
whose slot is about to migrate (``moving``) and one whose slot stays (``steady``). The
``moving`` tasks are started, the slot is put in ``MIGRATING``/``IMPORTING``
(``SlotMigration.begin``) and they end: their completions cannot be written (the completion
script is refused on the source, and held back after its keys moved). It stays so for many
visibility timeouts (counted in the workers' maintenance rounds, never in seconds), first
with the keys on the source, then with them on the target, while 200 ``steady`` tasks run;
then the migration ends.

Before the fix the workers held every queue's completions behind the migrating slot
("completions cannot be written (AskError ...): fetching paused") and renewed no lease of a
task whose completion waited: the leases lapsed, and the tasks were recovered and ran twice
(the tester counted hundreds). Now: every held task runs exactly once and none is
recovered, no completion is stale, every ``steady`` result arrives meanwhile, and the
``moving`` results arrive once the migration ends.
"""

from __future__ import annotations

import asyncio
import collections
import logging

import pytest

from blitzq import Queue, current_task
from blitzq.broker.redis.spread import SpreadKeys
from tests.cluster_server import LocalCluster
from tests.integration import test_cluster_spread
from tests.integration.proc_tasks import eventually, make_worker, running
from tests.integration.test_cluster_migration import slot_migration
from tests.integration.test_cluster_spread import spread_queues
from tests.integration.test_mixed_timeouts import rounds_done

#: The fresh namespace of each test (the spread layout tests' fixture).
cluster_ns = test_cluster_spread.cluster_ns

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: The workers' visibility timeout (seconds): a maintenance round every third of it. Two
#: seconds: a machine loaded by a whole parallel suite stalls an event loop for a second at
#: times, and a lease of one second then lapses whatever the migration does.
VT = 2.0
#: Maintenance rounds waited in each phase of the migration: three visibility timeouts.
ROUNDS = 9
MOVING_TASKS = 8
STEADY_TASKS = 200


async def test_a_migrating_queue_slot_makes_no_task_run_twice(
    redis_cluster: LocalCluster, cluster_ns: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="blitzq")
    moving, steady = spread_queues(redis_cluster, cluster_ns, 2)
    runs: collections.Counter[str] = collections.Counter()
    gate = asyncio.Event()
    queues = [
        Queue(redis_url=redis_cluster.url(), namespace=cluster_ns, visibility_timeout=VT)
        for _ in range(2)
    ]
    for queue in queues:

        @queue.task(name="mig.held", queue=moving)
        async def held(i: int) -> int:
            context = current_task()
            assert context is not None
            runs[context.id] += 1
            await gate.wait()
            return i

        @queue.task(name="mig.steady", queue=steady)
        async def steady_task(i: int) -> int:
            context = current_task()
            assert context is not None
            runs[context.id] += 1
            await asyncio.sleep(0.005)
            return i

    migration = slot_migration(redis_cluster, SpreadKeys(cluster_ns).queue_tag(moving))
    loop = asyncio.get_running_loop()
    workers = [make_worker(queue, concurrency=MOVING_TASKS) for queue in queues]
    began = moved = ended = False
    try:
        async with running(workers[0]), running(workers[1]):
            handles = [await held.enqueue(i) for i in range(MOVING_TASKS)]
            await eventually(lambda: asyncio.sleep(0, len(runs)), lambda n: n == MOVING_TASKS)
            migration.begin()
            began = True
            gate.set()  # they end now: their completions wait for the slot
            await eventually(
                lambda: asyncio.sleep(0, [w._flusher.lane_blocked(moving) for w in workers]),
                lambda lanes: any(lanes),
            )
            others = [await steady_task.enqueue(i) for i in range(STEADY_TASKS)]
            assert [await h.result(timeout=60) for h in others] == list(range(STEADY_TASKS))
            await rounds_done(workers[0], ROUNDS)  # the source still holds the keys
            await loop.run_in_executor(None, migration.move_keys)
            moved = True
            await rounds_done(workers[0], ROUNDS)  # the target holds them, still importing
            assert any(w._flusher.lane_blocked(moving) for w in workers)  # still held back
            await loop.run_in_executor(None, migration.end)
            ended = True
            assert [await h.result(timeout=60) for h in handles] == list(range(MOVING_TASKS))
        assert set(runs) == {h.id for h in handles + others}
        assert {runs[h.id] for h in handles} == {1}  # no held task ran twice
        assert [w.stale_completions for w in workers] == [0, 0]
        # No recovery round took a held task back ("recovered N abandoned message(s) on
        # <moving>"); a stall warning of a loaded machine also says "may have recovered",
        # which is no recovery. The steady queue is only asserted to go on (every result
        # above): a lease of its running tasks may lapse in a stall of a loaded machine, and
        # at-least-once then runs one again, as it would without a migration.
        lines = [r.getMessage() for r in caplog.records]
        assert not [m for m in lines if m.startswith("recovered") and m.endswith(f" on {moving}")]
    finally:
        gate.set()
        if began and not moved:
            await loop.run_in_executor(None, migration.move_keys)
        if began and not ended:
            await loop.run_in_executor(None, migration.end)
        for queue in queues:
            await queue.close()
