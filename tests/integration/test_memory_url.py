"""``memory://[name]``: the Redis brokers and their Lua on this process's private Valkey.

What a user of ``memory://`` relies on: Queues of one name share their tasks within the
process (whatever their ``namespace=``), queues of different names never see each other's,
``mode=`` picks the reliable or fast code as on any server, the broker says its messages are
ephemeral, the server is started once per process, and schedulers of one name claim each
periodic occurrence once.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from blitzq import Queue
from blitzq.broker import Guarantee
from blitzq.broker.redis import ListsTransport, StreamsTransport, ephemeral
from blitzq.scheduler import Scheduler
from blitzq.schedules import Every

from .proc_tasks import make_worker, running


def memory_url() -> str:
    return "memory://mem-" + uuid.uuid4().hex[:12]


async def test_queues_of_one_name_share_tasks_and_other_names_are_apart() -> None:
    url = memory_url()
    producer = Queue(redis_url=url, namespace="one")
    consumer = Queue(redis_url=url, namespace="two")  # the memory name decides, not this
    stranger = Queue(redis_url=url + "-b")
    queues = [producer, consumer, stranger]
    try:
        for q in queues:

            @q.task(name="m.double")
            async def double(x: int) -> int:
                return 2 * x

        handle = await producer.tasks["m.double"].enqueue(21)
        assert (await stranger.broker.queue_stats(["default"]))["default"]["waiting"] == 0
        assert await stranger.inspect(handle.id) is None
        async with running(make_worker(consumer)):
            assert await handle.result(timeout=10) == 42
        assert await stranger.inspect(handle.id) is None
        assert await consumer.inspect(handle.id) is not None
    finally:
        for q in queues:
            await q.close()


@pytest.mark.parametrize(
    ("mode", "transport", "recovery"),
    [("reliable", StreamsTransport, True), ("fast", ListsTransport, False)],
)
async def test_mode_picks_the_redis_code_and_the_guarantee_is_ephemeral(
    mode: str, transport: type, recovery: bool
) -> None:
    queue = Queue(redis_url=memory_url(), mode=mode)  # type: ignore[arg-type]
    try:
        broker = queue.broker
        assert isinstance(broker.transport, transport)
        assert broker.guarantee is Guarantee.EPHEMERAL
        assert broker.supports_recovery is recovery
        assert queue.url.startswith("memory://")  # the URL the user gave is kept

        @queue.task(name="m.echo")
        async def echo(x: str) -> str:
            return x

        async with running(make_worker(queue)):
            assert await (await echo.enqueue("hi")).result(timeout=10) == "hi"
    finally:
        await queue.close()


async def test_one_server_per_process_shared_by_every_name_and_loop() -> None:
    url = memory_url()
    first, second = Queue(redis_url=url), Queue(redis_url=url + "-b")
    try:
        server = ephemeral.ensure_server()
        for q in (first, second):
            assert q.broker.state.conn.url == server  # type: ignore[attr-defined]

        def in_another_loop() -> int:  # a thread with its own loop: a broker of its own
            async def count() -> int:
                stats = await first.broker.queue_stats(["default"])
                await first.broker.close()
                return stats["default"]["waiting"]

            return asyncio.run(count())

        await first.send("m.anything", args=(1,))
        assert await asyncio.to_thread(in_another_loop) == 1
    finally:
        await first.close()
        await second.close()


async def test_memory_queues_of_one_name_claim_each_occurrence_once() -> None:
    """``memory://`` runs the Redis claim (same Lua) on this process's private server:
    schedulers of Queues sharing a memory URL dispatch each occurrence once, on the server's
    clock, and a Queue of another memory name keeps a history of its own."""
    url = memory_url()
    queues = [Queue(redis_url=url) for _ in range(3)]
    other = Queue(redis_url=url + "-other")
    try:
        broker = queues[0].broker
        now = await broker.server_time()
        # Daily, 12 h either side of now: nothing comes due while the test runs.
        schedule = Every(86400, offset=(now + 43200.0) % 86400.0)
        for q in [*queues, other]:
            q.periodic(schedule, name="beat", missed="run_all")(lambda: None)
        last = schedule.next_after(now) - 86400.0  # the newest occurrence before now
        # A last run three days back: the state a scheduler down for three days leaves.
        assert await broker.claim_periodic("beat", last - 3 * 86400, b"old", "default")
        schedulers = [Scheduler(q) for q in queues]
        assert sum([await s.tick() for s in schedulers]) == 3
        assert sum([await s.tick() for s in schedulers]) == 0
        # An occurrence not yet due by the server's clock is refused whoever asks.
        assert not await broker.claim_periodic("beat", last + 86400, b"early", "default")
        assert await broker.periodic_last(["beat", "none"]) == {"beat": last}
        stats = await broker.queue_stats(["default"])
        assert stats["default"]["waiting"] == 4  # "old" and the three catch-up runs
        assert await Scheduler(other).tick() == 0  # no history of its own: starts from now
        assert await other.broker.periodic_last(["beat"]) == {}
        assert (await other.broker.queue_stats(["default"]))["default"]["waiting"] == 0
    finally:
        for q in [*queues, other]:
            await q.close()
