"""A Sentinel failover mid-run loses no record of a task that ran (issue 25, item 3).

A private primary, replica and three sentinels (``tests/integration/test_sentinel.py``'s
:class:`SentinelSet`: the first primary has ``min-replicas-to-write 1``); a worker with the
state and the streams on ``redis+sentinel://`` runs tasks that each count their runs in this
process (the count survives the failover, the server's data may not) while ``SENTINEL
FAILOVER`` moves the primary. Once every task whose enqueue returned has its result:

- no task ran without a record (every id that ran reads ``succeeded``);
- with ``wait_replicas=1`` (worker and producer), no enqueue that returned is lost and only
  tasks in flight at the switch ran twice: at most the worker's concurrency;
- with a URL that names no ``wait_replicas`` the same (an enqueue waits for the replicas that
  exist by default); with ``wait_replicas=0`` (the producer's opt-out) an enqueue that
  returned may be lost with the old primary (its task never runs: ``result()`` raises
  ``ResultExpired``), never run without a record.

``test_enqueues_around_a_failover_are_not_lost_by_default`` enqueues without a worker around a
``SENTINEL FAILOVER`` on servers without ``min-replicas-to-write`` (a server's default) and
counts the enqueues that returned and are missing from the new primary's stream.

The figures (runs, duplicates, refused enqueues) are printed; docs/guarantees.md quotes them.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from blitzq import BrokerError, OutcomeUnknown, Queue, ResultExpired, ResultTimeout, Worker
from blitzq.serialization import decode_envelope
from tests.amqp_server import amqp_or_skip, delete_amqp_queues
from tests.chaos.proxy import FaultProxy
from tests.integration.test_sentinel import SERVICE, SentinelSet, sentinels  # noqa: F401
from tests.polling import wait_until

TASKS = 300
CONCURRENCY = 8


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("transport", "query"),
    [
        ("redis", "wait_replicas=1&wait_timeout=0.5"),
        ("redis", ""),
        ("redis", "wait_replicas=0"),
        ("amqp", "wait_replicas=1&wait_timeout=0.5"),
        ("amqp", ""),
    ],
    ids=[
        "redis-wait_replicas",
        "redis-default",
        "redis-opt_out",
        "amqp-wait_replicas",
        "amqp-default",
    ],
)
async def test_a_failover_mid_run_leaves_no_task_that_ran_without_a_record(
    sentinels: SentinelSet,  # noqa: F811
    transport: str,
    query: str,
) -> None:
    namespace = f"failover-{uuid.uuid4().hex[:8]}"
    wait = query != "wait_replicas=0"  # the producer's enqueues wait for the replica
    amqp: dict[str, Any] = {"amqp_url": amqp_or_skip()} if transport == "amqp" else {}
    producer = Queue(redis_url=sentinels.url(query), namespace=namespace, **amqp)
    consumer = Queue(
        redis_url=sentinels.url(query), namespace=namespace, visibility_timeout=6, **amqp
    )
    runs: collections.Counter[str] = collections.Counter()

    async def body(n: int) -> int:
        from blitzq import current_task

        ctx = current_task()
        assert ctx is not None
        runs[ctx.id] += 1
        await asyncio.sleep(0.02)
        return n

    send = producer.task(name="fo.body")(body)
    consumer.task(name="fo.body")(body)
    worker = Worker(consumer, concurrency=CONCURRENCY, block_timeout=0.5)
    running = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    handles: list[Any] = []
    lost: list[str] = []  # enqueues that returned, then were lost with the old primary
    refused = 0
    old_primary = sentinels.primary_port()
    failover: asyncio.Task[Any] | None = None
    after = 0
    try:
        # Enqueue while the tasks run: the failover starts once a quarter ran, and the
        # enqueues go on until the primary moved and TASKS // 2 more were sent, so runs
        # and completions span the switch.
        n = 0
        moved = False
        deadline = loop.time() + 90
        while n < TASKS:
            assert loop.time() < deadline, "the primary did not move"
            if failover is None and len(runs) >= TASKS // 4:
                admin = sentinels.client(sentinels.sentinels[0], sentinel=True)
                failover = asyncio.create_task(
                    asyncio.to_thread(admin.execute_command, "SENTINEL", "FAILOVER", SERVICE)
                )
            try:
                handles.append(await send.enqueue(n))
            except BrokerError:
                refused += 1  # allowed during the switch: a typed error, never a silent loss
            n += 1
            await asyncio.sleep(0.005)
            if failover is not None and failover.done() and not moved:
                await failover  # raises the reason if Sentinel refused
                moved = await asyncio.to_thread(sentinels.primary_port) != old_primary
                if moved:  # as many again after the switch
                    after, n = len(runs), min(n, TASKS // 2)

        async def settle(handle: Any) -> None:
            try:
                await handle.result(timeout=60)
            except ResultExpired:  # gone from the server, never run: the enqueue window
                lost.append(handle.id)
            except ResultTimeout:
                if wait:  # every returned enqueue must run, unless the producer opted out
                    raise
                lost.append(handle.id)  # opted out: it may have gone with the old primary

        # All at once: a lost enqueue waits out its timeout beside the others, not after them.
        await asyncio.gather(*(settle(h) for h in handles))
        records = {task_id: await producer.inspect(task_id) for task_id in list(runs)}
    finally:
        worker.stop()
        await asyncio.wait_for(running, 60)
        if amqp:
            await delete_amqp_queues(amqp["amqp_url"], [producer.broker, consumer.broker])
        await producer.close()
        await consumer.close()
    ran_without_record = [t for t, r in records.items() if r is None or r.state != "succeeded"]
    twice = [t for t, n in runs.items() if n > 1]
    print(
        f"failover ({transport}, {query or 'no wait_replicas'}): "
        f"{len(handles)} enqueued ({after} had run when the primary moved), "
        f"{refused} enqueues refused, {len(lost)} returned enqueues lost, {len(runs)} ran, "
        f"{len(ran_without_record)} ran without a record, {len(twice)} ran twice, stale "
        f"completions {worker.stale_completions}"
    )
    assert not ran_without_record
    assert not set(lost) & set(runs)
    assert {h.id for h in handles} - set(lost) <= set(runs)
    if wait:  # the producer's writes waited for the replica: none of them is lost
        assert not lost
        assert len(twice) <= CONCURRENCY, twice


@pytest.fixture
def unguarded() -> Iterator[SentinelSet]:
    """A :class:`SentinelSet` whose primary takes writes without a replica (no
    ``min-replicas-to-write``: a server's default, and the user report's setup)."""
    servers = SentinelSet(min_replicas=False)
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


def _stream_ids(servers: SentinelSet, port: int, stream: str) -> set[str]:
    """The task ids of the messages in ``stream`` on the server at ``port``."""
    entries = servers.client(port, decode=False).xrange(stream)
    return {decode_envelope(fields[b"m"]).id for _, fields in entries}


def _demoted(servers: SentinelSet, old: int, new: int) -> bool:
    """Whether every sentinel names ``new`` and the server at ``old`` replicates it, in sync:
    nothing more can land on the old primary, and what it held alone is gone."""
    if not all(_names(servers, port) == new for port in servers.sentinels):
        return False
    try:
        info = servers.client(old).info("replication")
    except (redis.RedisError, OSError):
        return False
    return (
        info.get("role") == "slave"
        and int(info.get("master_port", 0)) == new
        and info.get("master_link_status") == "up"
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("query", ["", "wait_replicas=0"], ids=["default", "opt_out"])
async def test_enqueues_around_a_failover_are_not_lost_by_default(
    unguarded: SentinelSet, query: str
) -> None:
    """Enqueues one by one before, during and after ``SENTINEL FAILOVER``, on servers without
    ``min-replicas-to-write`` (the user report: 146 of 300 enqueues lost, none with an
    error, on a URL naming no ``wait_replicas``).

    On a URL that names no ``wait_replicas`` an enqueue now waits for the replica that exists
    (``WAIT``), and one the replica did not acknowledge raises ``OutcomeUnknown``
    (``unreplicated``) instead of returning: every enqueue that returned is on the new
    primary once the old one is demoted. Before, the old primary acknowledged the enqueues
    it took after its replica was promoted, and they went with its data. ``wait_replicas=0``
    (the producer's opt-out) keeps that window: its figure is printed, not asserted.
    """
    servers = unguarded
    namespace = f"window-{uuid.uuid4().hex[:8]}"
    producer = Queue(redis_url=servers.url(query), namespace=namespace)
    send = producer.task(name="window.body")(_noop)
    stream = producer.broker.transport.keys.stream("default")  # type: ignore[attr-defined]
    old_primary = servers.primary_port()
    loop = asyncio.get_running_loop()
    returned: list[str] = []
    unreplicated = refused = 0
    failover: asyncio.Task[Any] | None = None
    try:
        n, moved_at = 0, None
        deadline = loop.time() + 120
        # 50 before the failover, then on until the primary moved and 150 more were sent.
        while moved_at is None or n < moved_at + 150:
            assert loop.time() < deadline, "the primary did not move"
            if n == 50 and failover is None:
                admin = servers.client(servers.sentinels[0], sentinel=True)
                failover = asyncio.create_task(asyncio.to_thread(_failover, admin))
            try:
                returned.append((await send.enqueue(n)).id)
            except OutcomeUnknown as exc:
                unreplicated += exc.unreplicated
                refused += not exc.unreplicated
            except BrokerError:
                refused += 1  # not sent: a failover under way
            n += 1
            await asyncio.sleep(0.005)
            if failover is not None and failover.done() and moved_at is None:
                if not failover.result():  # NOGOODSLAVE: ask again
                    failover = None
                elif await asyncio.to_thread(servers.primary_port) != old_primary:
                    moved_at = n
        new_primary = servers.primary_port()
        await asyncio.to_thread(
            wait_until,
            lambda: _demoted(servers, old_primary, new_primary),
            90,
            "the old primary demoted, in sync with the new one",
        )
        kept = await asyncio.to_thread(_stream_ids, servers, new_primary, stream)
    finally:
        await producer.close()
    lost = [task_id for task_id in returned if task_id not in kept]
    print(
        f"enqueues around a failover ({query or 'no wait_replicas'}): {n} sent, "
        f"{len(returned)} returned, {len(lost)} of them lost; {unreplicated} raised "
        f"OutcomeUnknown (unreplicated), {refused} other errors"
    )
    if not query:
        assert not lost, f"{len(lost)} of {len(returned)} returned enqueues lost"


async def _noop(n: int) -> int:
    return n


@pytest.fixture
def lagging() -> Iterator[tuple[SentinelSet, FaultProxy]]:
    """A :class:`SentinelSet` whose primary is reached through a proxy of the test's own, by
    the replica, the sentinels and the clients (:func:`_stall` freezes the replication link
    alone, the replica answering the sentinels meanwhile), and takes writes without a replica
    (no ``min-replicas-to-write``: the default of a server)."""
    servers = SentinelSet(min_replicas=False)
    proxy = FaultProxy("127.0.0.1", servers.primary)
    proxy.start()
    servers.upstream = proxy.port
    try:
        servers.start()
        yield servers, proxy
    finally:
        servers.stop()
        proxy.stop()


def _last_ids(servers: SentinelSet, port: int, stream: str) -> tuple[str, str]:
    """The last entry id added to ``stream`` on the server at ``port``, and the last one its
    consumer group delivered (the entries hold binary messages: no decoding of replies)."""
    raw = servers.client(port, decode=False)
    last = raw.xinfo_stream(stream)["last-generated-id"]
    groups = raw.xinfo_groups(stream)
    delivered = groups[0]["last-delivered-id"] if groups else b"0-0"
    return last.decode(), delivered.decode()


def _stall(servers: SentinelSet, proxy: FaultProxy) -> None:
    """Freeze the replica's replication link in the proxy: the replica hears nothing more
    from the primary and acknowledges nothing (``WAIT`` gets 0), yet stays up."""
    links = servers.client(servers.primary).client_list(_type="replica")
    assert proxy.freeze_upstream({int(c["addr"].rpartition(":")[2]) for c in links}) == 1


def _failover(sentinel: Any) -> bool:
    """Ask ``sentinel`` for a failover; ``False`` while it answers ``NOGOODSLAVE`` (its last
    INFO from the replica is older than it accepts: it asks every 10 s)."""
    try:
        sentinel.execute_command("SENTINEL", "FAILOVER", SERVICE)
    except redis.ResponseError as exc:
        if "NOGOODSLAVE" not in str(exc):
            raise
        return False
    return True


def _names(servers: SentinelSet, sentinel: int) -> int | None:
    """The primary's port as the sentinel on port ``sentinel`` names it."""
    try:
        address = servers.client(sentinel, sentinel=True).sentinel_get_master_addr_by_name(SERVICE)
    except redis.RedisError:
        return None
    return int(address[1]) if address else None


def _id(entry: str) -> tuple[int, int]:
    ms, _, seq = entry.partition("-")
    return int(ms), int(seq)


@pytest.mark.timeout(300)
async def test_a_task_the_lagging_replica_never_heard_of_does_not_run_before_it_does(
    lagging: tuple[SentinelSet, FaultProxy],
) -> None:
    """The mechanism of issue 25's loss, made deterministic: the replica stops hearing from
    the primary (its replication link frozen in a proxy; it still answers the sentinels, as
    a replica starved of CPU on a loaded machine does), tasks are enqueued (the primary alone
    holds them: the producer says ``wait_replicas=0``; by default the enqueue raises
    ``OutcomeUnknown``, unreplicated) and the worker reads them; then ``SENTINEL FAILOVER``
    promotes the replica, which lacks them.

    Before the fix the worker ran them at once, and acknowledged and recorded them on the
    primary alone: every one ran, its ``result()`` even answered, and then its record went
    with the old primary's data (50 of 50 ran without a record, 0 stale completions). Now a
    worker's fetch and completion wait for the replicas that exist: a task starts only once
    the replica knows it is leased, so these tasks never run (the enqueue window of
    docs/guarantees.md: lost with the old primary), and tasks enqueued after the switch run
    once each, with their record.
    """
    servers, proxy = lagging
    namespace = f"lagging-{uuid.uuid4().hex[:8]}"
    # The producer opts out of waiting (its enqueues land in the window on purpose); one
    # on the default URL has its enqueue refused while the replica lags.
    producer = Queue(redis_url=servers.url("wait_replicas=0"), namespace=namespace)
    durable = Queue(redis_url=servers.url(), namespace=namespace)
    consumer = Queue(redis_url=servers.url(), namespace=namespace, visibility_timeout=6)
    runs: collections.Counter[str] = collections.Counter()

    async def body(n: int) -> int:
        from blitzq import current_task

        ctx = current_task()
        assert ctx is not None
        runs[ctx.id] += 1
        return n

    send = producer.task(name="lag.body")(body)
    consumer.task(name="lag.body")(body)
    worker = Worker(consumer, concurrency=CONCURRENCY, block_timeout=0.5)
    running = asyncio.create_task(worker.run())
    stream = producer.broker.transport.keys.stream("default")  # type: ignore[attr-defined]
    old_primary = servers.primary_port()
    late: Queue | None = None
    try:
        before = [await send.enqueue(n) for n in range(20)]
        for handle in before:
            await handle.result(timeout=60)
        _stall(servers, proxy)  # the replica hears nothing more from the primary
        # The worker idle: a blocking read ended empty and the next one waits (a worker that
        # was idle once read one entry per blocking read after its read's WAIT failed, with
        # a growing backoff: CI's run ran out of time reading them).
        shared = worker._fetcher.shared
        assert shared is not None
        idle_reads = shared.reads
        async with asyncio.timeout(30):
            while shared.reads < idle_reads + 2:
                await asyncio.sleep(0.05)
        stalled = [await send.enqueue(n) for n in range(50)]
        # By default an enqueue waits for the replica: it is not acknowledged (before, it
        # returned like the 50 above and went with the old primary).
        with pytest.raises(OutcomeUnknown) as refused:
            await durable.send("lag.body", (-1,))
        assert refused.value.unreplicated
        assert refused.value.task_id
        last, _ = _last_ids(servers, old_primary, stream)
        await asyncio.to_thread(
            wait_until,
            lambda: _id(_last_ids(servers, old_primary, stream)[1]) >= _id(last),
            150,  # each read fails (WAIT), then backs off up to 5 s: slow on a loaded machine
            "the worker read every task enqueued while the replica lagged",
        )
        admin = servers.client(servers.sentinels[0], sentinel=True)
        await asyncio.to_thread(
            wait_until,
            lambda: _failover(admin),
            60,
            "SENTINEL FAILOVER accepted (a replica it heard from in the last 3 s)",
            0.2,
        )
        await asyncio.to_thread(
            wait_until,
            lambda: all(_names(servers, port) == servers.replica for port in servers.sentinels),
            60,
            "every sentinel names the promoted replica",
        )
        # A producer that starts after the switch (one that was idle through it may send
        # its first enqueues to the old primary before its pool looks again: the enqueue
        # window of a Queue without wait_replicas, docs/guarantees.md).
        late = Queue(redis_url=servers.url(), namespace=namespace)
        after = [await late.send("lag.body", (n,)) for n in range(20)]

        async def settle(handle: Any, timeout: float) -> bool:
            try:
                await handle.result(timeout=timeout)
            except (ResultExpired, ResultTimeout):
                return False
            return True

        # Side by side: a lost one waits out its timeout beside the others.
        done = await asyncio.gather(
            *(settle(h, 10) for h in stalled), *(settle(h, 60) for h in after)
        )
        stalled_done, after_done = done[: len(stalled)], done[len(stalled) :]
        records = {task_id: await late.inspect(task_id) for task_id in list(runs)}
    finally:
        worker.stop()
        await asyncio.wait_for(running, 60)
        await producer.close()
        await durable.close()
        await consumer.close()
        if late is not None:
            await late.close()
    ran_without_record = [t for t, r in records.items() if r is None or r.state != "succeeded"]
    stalled_ran = [h.id for h in stalled if h.id in runs]
    print(
        f"lagging replica promoted: {len(stalled)} enqueued while it lagged "
        f"({sum(stalled_done)} completed, {len(stalled_ran)} ran), {len(runs)} ran in all, "
        f"{len(ran_without_record)} ran without a record, stale completions "
        f"{worker.stale_completions}"
    )
    assert not ran_without_record
    assert all(after_done)
    assert all(runs[h.id] == 1 for h in after)
    # A task the promoted replica never heard of either completed (its record survived) or
    # never ran.
    assert all(done or h.id not in runs for h, done in zip(stalled, stalled_done, strict=True))
