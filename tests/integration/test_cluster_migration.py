"""One queue's slot migrating on the spread layout holds up that queue only (tester finding 3).

On the session's local 3-primary Redis Cluster (``redis_cluster``), one queue's slot is put in
``MIGRATING``/``IMPORTING`` (``SlotMigration``) and kept so while the broker works:

- a batch of completions of two queues is applied for the queue whose slot is stable; the
  migrating queue's are held back (``HeldBack``: applied, stale and held listed), nothing
  of them written, and applied once the migration ends;
- the leases of the migrating queue's deliveries are renewed throughout: on the source while
  its stream is there, on the target (``ASK`` followed: the renewal script declares its only
  key) once the keys moved; a fetch there neither fails nor waits;
- a script refused because its slot migrates ("non local key") is a transient, ``unavailable``
  broker error, never a failure.

The same with workers running tasks (duplicates counted) is tests/reliability/
test_cluster_migration.py.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import AskError, ResponseError

from blitzq.broker import Completion
from blitzq.broker.redis.client import broker_error
from blitzq.broker.redis.homes import homed_id
from blitzq.broker.redis.spread import SpreadKeys, SpreadRedisBroker
from blitzq.broker.values import HeldBack
from tests.cluster_server import LocalCluster, SlotMigration
from tests.contract.test_broker_contract import message

from . import test_cluster_spread
from .test_cluster_spread import spread_queues

#: The fresh namespace of each test (the spread layout tests' fixture).
cluster_ns = test_cluster_spread.cluster_ns

pytestmark = pytest.mark.timeout(120)


def test_a_refusal_for_a_migrating_slot_is_transient() -> None:
    refused = broker_error(
        ResponseError("Script attempted to access a non local key in a cluster node script")
    )
    assert refused.transient
    assert refused.unavailable
    assert broker_error(AskError("2879 127.0.0.1:17002")).unavailable
    assert not broker_error(ResponseError("ERR Error running script")).transient


def slot_migration(cluster: LocalCluster, key: str) -> SlotMigration:
    """A migration of ``key``'s slot to another node (not begun)."""
    source = cluster.owner(key)
    with cluster.node(source) as node:
        slot = int(node.execute_command("CLUSTER", "KEYSLOT", key))
    return SlotMigration(cluster, slot, next(p for p in cluster.ports if p != source))


async def test_a_migrating_queue_slot_holds_back_only_its_completions(
    redis_cluster: LocalCluster, cluster_ns: str
) -> None:
    moving, steady = spread_queues(redis_cluster, cluster_ns, 2)
    broker = SpreadRedisBroker(redis_cluster.url(), cluster_ns)
    loop = asyncio.get_running_loop()
    migration = slot_migration(redis_cluster, SpreadKeys(cluster_ns).queue_tag(moving))
    moved = ended = False
    try:
        await broker.prepare_consumer([moving, steady], "mig-consumer")
        ids = {q: [homed_id(q) for _ in range(3)] for q in (moving, steady)}
        for q, task_ids in ids.items():
            await broker.publish(q, [message(i, q) for i in task_ids])
        fetched = {q: await broker.fetch(q, 3, 0) for q in (moving, steady)}
        assert all(len(d) == 3 for d in fetched.values())
        batch = [
            Completion(q, d.token, i, record=b"done " + i.encode(), record_ttl=60)
            for q in (moving, steady)
            for d, i in zip(fetched[q], ids[q], strict=True)
        ]
        tokens = [d.token for d in fetched[moving] if d.token is not None]
        migration.begin()
        with pytest.raises(HeldBack) as caught:
            await broker.complete(batch)
        held = caught.value
        assert held.unavailable
        assert [c.queue for c in held.applied] == [steady] * 3
        assert [c.queue for c in held.held] == [moving] * 3
        assert held.stale == []
        assert await broker.get_records(ids[steady]) == [b"done " + i.encode() for i in ids[steady]]
        # The leases of the held completions' deliveries are renewed on the source ...
        assert await broker.heartbeat(moving, tokens) == 3
        await loop.run_in_executor(None, migration.move_keys)
        moved = True
        # ... and on the target once the keys moved (ASK followed), where a fetch works.
        assert await broker.heartbeat(moving, tokens) == 3
        assert await broker.fetch(moving, 3, 0) == []
        with pytest.raises(HeldBack) as caught:  # still migrating: held again, whole
            await broker.complete(held.held)
        assert caught.value.applied == []
        await loop.run_in_executor(None, migration.end)
        ended = True
        assert await broker.complete(held.held) == []  # applied on the new owner
        assert await broker.get_records(ids[moving]) == [b"done " + i.encode() for i in ids[moving]]
        stats = await broker.queue_stats([moving, steady])
        assert stats == {q: {"waiting": 0, "in_flight": 0} for q in (moving, steady)}
    finally:
        if not moved:
            await loop.run_in_executor(None, migration.move_keys)
        if not ended:
            await loop.run_in_executor(None, migration.end)
        await broker.close()
