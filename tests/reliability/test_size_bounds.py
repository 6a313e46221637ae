"""Size bounds against a private server configured small (issue 8, section 1).

Sizes are scaled down: ``proto-max-bulk-len 1mb`` (the smallest Redis allows) stands in for
the 512 MB default, and a 64 kB pub/sub output-buffer limit for the 32 MB default. Chunking
is checked structurally, from the server's own command counts (``INFO commandstats``) on a
server no other test uses; ``bench/chunking.py`` measures how long each call holds it.
"""

from __future__ import annotations

import asyncio
import math

import pytest
import redis

from blitzq import Queue, TaskFailed, group
from blitzq.broker import Completion, DeadLetterFields
from blitzq.broker.redis.keys import Keys
from blitzq.limits import CHUNK_ITEMS, CHUNK_WRITES
from blitzq.serialization import dumps
from blitzq.worker.flusher import Flusher
from blitzq.workflow import set_workflow_limits
from tests.integration.proc_tasks import make_worker, running

from .conftest import PrivateRedis

pytestmark = pytest.mark.timeout(180)


def command_calls(url: str) -> dict[str, int]:
    """Calls per command since the last ``CONFIG RESETSTAT`` (``INFO commandstats``)."""
    with redis.Redis.from_url(url) as client:
        stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def reset_stats(url: str) -> None:
    """Zero the server's command counters."""
    with redis.Redis.from_url(url) as client:
        client.config_resetstat()


def configure(url: str, **settings: str) -> None:
    """CONFIG SET on the private server."""
    with redis.Redis.from_url(url) as client:
        for name, value in settings.items():
            client.config_set(name.replace("_", "-"), value)


@pytest.fixture
def small_server(private_redis: PrivateRedis) -> PrivateRedis:
    """The private server with a 1 MB bulk-length limit and a 64 kB pub/sub buffer limit."""
    configure(
        private_redis.url,
        proto_max_bulk_len="1mb",
        client_output_buffer_limit="pubsub 64kb 32kb 60",
        appendfsync="no",
    )
    return private_redis


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.mark.parametrize(
    ("max_result_size", "big", "error_type", "error"),
    [
        # The default limit (8 MiB) refuses a 9 MiB result before it reaches Redis.
        (None, 9 << 20, "blitzq.exceptions.ResultTooLarge", "over the limit of 8388608 bytes"),
        # A limit above what the server takes: the server drops the connection while reading
        # the 6 MiB write; the completion is isolated and replaced, never retried forever.
        (64 << 20, 6 << 20, "blitzq.exceptions.BrokerError", "refused this task's completion"),
    ],
    ids=["result-too-large", "refused-by-server"],
)
async def test_big_result_fails_alone_and_the_rest_commits(
    small_server: PrivateRedis,
    namespace: str,
    mode: str,
    max_result_size: int | None,
    big: int,
    error_type: str,
    error: str,
) -> None:
    limits = {} if max_result_size is None else {"max_result_size": max_result_size}
    queue = Queue(redis_url=small_server.url, namespace=namespace, mode=mode, **limits)
    runs: dict[int, int] = {}
    gate = asyncio.Event()

    @queue.task(name="sz.work")
    async def work(n: int) -> str:
        runs[n] = runs.get(n, 0) + 1
        await gate.wait()  # all eleven finish together: their completions are written together
        return "r" * n

    try:
        async with running(make_worker(queue, concurrency=20)):
            large = await work.enqueue(big)
            small = [await work.enqueue(i) for i in range(1, 11)]
            while len(runs) < 11:
                await asyncio.sleep(0.02)
            gate.set()
            for i, handle in enumerate(small, start=1):
                assert await handle.result(timeout=30) == "r" * i
            with pytest.raises(TaskFailed) as info:
                await large.result(timeout=30)
        assert info.value.error_type == error_type
        assert error in (info.value.error or "")
        assert runs == dict.fromkeys([big, *range(1, 11)], 1)  # nothing ran twice
        # The namespace's run counters count what was written: the big one as a failure.
        counters = await queue.broker.counters()
        assert (counters.get("processed"), counters.get("failed")) == (10, 1), counters
        if mode == "reliable":
            stats = await queue.stats([queue.name])
            assert stats["queues"][queue.name] == {"waiting": 0, "in_flight": 0}
    finally:
        await queue.close()


async def test_big_results_do_not_drop_the_shared_subscriber(
    small_server: PrivateRedis, namespace: str
) -> None:
    queue = Queue(redis_url=small_server.url, namespace=namespace)
    gate = asyncio.Event()

    @queue.task(name="sz.blob")
    async def blob(n: int) -> str:
        await gate.wait()
        return "p" * n

    def listener() -> str | None:
        """Id of the connection the four waits listen on, once it subscribed: the process's
        completion pattern (``{ns}:done:*``), or the four done channels where the pattern
        is not used."""
        with redis.Redis.from_url(small_server.url) as client:
            for c in client.client_list():
                if int(c.get("psub", 0)) == 1 or int(c.get("sub", 0)) == 4:
                    return str(c["id"])
        return None

    def connected(client_id: str) -> bool:
        with redis.Redis.from_url(small_server.url) as client:
            return any(str(c["id"]) == client_id for c in client.client_list())

    try:
        async with running(make_worker(queue, concurrency=10)):
            handles = [await blob.enqueue(200_000) for _ in range(3)]
            handles.append(await blob.enqueue(10))
            # All four wait on one pub/sub connection before any result is written.
            waits = [asyncio.ensure_future(h.result(timeout=30)) for h in handles]
            subscriber = None
            for _ in range(1500):  # 30 s
                subscriber = listener()
                if subscriber is not None:
                    break
                await asyncio.sleep(0.02)
            assert subscriber is not None, "no connection subscribed for the waits"
            gate.set()
            results = await asyncio.gather(*waits)
            assert [len(r) for r in results] == [200_000, 200_000, 200_000, 10]
            assert connected(subscriber)  # never dropped for its output buffer
    finally:
        await queue.close()


async def test_enqueue_many_is_chunked(
    private_redis: PrivateRedis, namespace: str, mode: str
) -> None:
    n = 2 * CHUNK_ITEMS + 500
    calls = math.ceil(n / CHUNK_ITEMS)
    transactions = math.ceil(n / CHUNK_WRITES)
    url = private_redis.url
    queue = Queue(redis_url=url, namespace=namespace, mode=mode)

    @queue.task(name="sz.noop")
    async def noop(i: int) -> None:
        return None

    try:
        await noop.enqueue(0)  # the queue is known from here on
        await noop.enqueue_many([(-1,), (-2,)])  # scripts loaded: no NOSCRIPT retries below
        await noop.options(delay=3600).enqueue_many([(-3,)])
        reset_stats(url)
        await noop.options(delay=3600).enqueue_many([(i,) for i in range(n)])
        stats = command_calls(url)
        # one schedule.lua call per chunk, not one for all
        assert stats["evalsha"] + stats.get("eval", 0) == transactions
        reset_stats(url)
        await noop.enqueue_many([(i,) for i in range(n)])
        stats = command_calls(url)
        if mode == "reliable":
            assert stats["evalsha"] + stats.get("eval", 0) == calls
        else:
            assert stats["rpush"] == calls
        counts = await queue.stats([queue.name])
        assert counts["scheduled"] == n + 1
        assert counts["queues"][queue.name]["waiting"] == n + 3
    finally:
        await queue.close()


async def test_track_state_records_and_dead_letter_purge_are_chunked(
    private_redis: PrivateRedis, namespace: str
) -> None:
    n = 2 * CHUNK_ITEMS + 1
    writes = math.ceil(n / CHUNK_WRITES)
    url = private_redis.url
    queue = Queue(redis_url=url, namespace=namespace, track_state=True)

    @queue.task(name="sz.noop", unique=True)
    async def noop(i: int) -> None:
        return None

    try:
        await noop.enqueue_many([(-1,), (-2,)])  # queue known, scripts loaded
        reset_stats(url)
        await noop.enqueue_many([(i,) for i in range(n)])
        stats = command_calls(url)
        # The unique claims with their messages (unique_enqueue.lua: one atomic step, so a
        # lost reply leaves no claim without its task) and the "queued" records, each one
        # script per CHUNK_WRITES.
        assert stats["evalsha"] + stats.get("eval", 0) == 2 * writes
        assert stats["set"] >= 2 * n  # the unique keys and the "queued" records
        dead = [
            Completion(
                "q", None, f"d{i}", dead_letter=DeadLetterFields(b"m", "failed", "e", "t", "q", i)
            )
            for i in range(n)
        ]
        for start in range(0, n, 500):
            await queue.broker.complete(dead[start : start + 500])
        await queue.broker.purge_dead_letters()  # loads the script
        for start in range(0, n, 500):
            await queue.broker.complete(dead[start : start + 500])
        reset_stats(url)
        assert await queue.purge_dead_letters() == n
        stats = command_calls(url)
        assert stats["evalsha"] + stats.get("eval", 0) == writes
        assert await queue.dead_letter_count() == 0
    finally:
        await queue.close()


async def test_revoked_ids_are_read_in_chunks(private_redis: PrivateRedis, namespace: str) -> None:
    n = 2 * CHUNK_ITEMS + 10
    url = private_redis.url
    queue = Queue(redis_url=url, namespace=namespace)
    expiry = 4_000_000_000.0  # all marks share one expiry: paging must not loop or skip
    try:
        with redis.Redis.from_url(url) as client:
            client.zadd(Keys(namespace).revoked, {f"id{i}": expiry for i in range(n)})
            client.zadd(Keys(namespace).revoked, {"expired": 1.0})
        reset_stats(url)
        revoked = await queue.broker.revoked()  # type: ignore[attr-defined]
        assert len(revoked) == n
        assert "expired" not in revoked
        assert command_calls(url)["zrangebyscore"] == math.ceil((n + 1) / CHUNK_ITEMS)
    finally:
        await queue.close()


@pytest.mark.parametrize("size", [2 << 20, 8 << 20], ids=["error-reply", "dropped"])
async def test_flusher_splits_a_refused_batch(
    small_server: PrivateRedis, namespace: str, size: int
) -> None:
    # One batch of 21 completions, one of them over the server's 1 MB bulk limit: the server
    # answers an error (2 MiB) or drops the connection while reading (8 MiB). The 20 others
    # commit; the big one is replaced by a failure record.
    queue = Queue(redis_url=small_server.url, namespace=namespace)
    broker = queue.broker

    def record(task_id: str, result: str) -> bytes:
        return dumps({"id": task_id, "task": "t", "queue": "q", "state": "succeeded"} | {
            "attempts": 1, "result": result,
        })  # fmt: skip

    batch = [Completion("q", None, f"t{i}", record(f"t{i}", str(i)), 60) for i in range(20)]
    batch.insert(7, Completion("q", None, "huge", record("huge", "h" * size), 60))
    flusher = Flusher(broker, max_bytes=32 << 20)
    try:
        for completion in batch:
            flusher.add(completion)
        assert len(flusher._take()) == 21  # one batch
        flusher.close()
        await asyncio.wait_for(flusher.run(), 60)
        for i in range(20):
            stored = await queue.inspect(f"t{i}")
            assert stored is not None
            assert stored.result == str(i)
        huge = await queue.inspect("huge")
        assert huge is not None
        assert huge.state.value == "failed"
        assert huge.task == "t"
        assert huge.error_type == "blitzq.exceptions.BrokerError"
    finally:
        await queue.close()


async def test_big_group_is_started_in_chunks(private_redis: PrivateRedis, namespace: str) -> None:
    n = 2 * CHUNK_ITEMS + 10
    url = private_redis.url
    queue = Queue(redis_url=url, namespace=namespace)

    @queue.task(name="sz.member")
    async def member(i: int) -> int:
        return i

    previous = set_workflow_limits(max_group_size=n)  # above the default 1000 members
    try:
        await queue.apply(group(member.s(i) for i in range(2)))  # scripts loaded
        reset_stats(url)
        await queue.apply(group(member.s(i) for i in range(n)))
        # n + 1 ops (the state, then one per member): one script call per CHUNK_ITEMS ops.
        assert command_calls(url)["evalsha"] == math.ceil((n + 1) / CHUNK_ITEMS)
        counts = await queue.stats([queue.name])
        assert counts["queues"][queue.name]["waiting"] == n + 2
    finally:
        set_workflow_limits(previous.max_depth, previous.max_group_size)
        await queue.close()
