"""Size bounds on the shared test server, in both modes (issue 8, section 1).

A result over ``max_result_size`` fails its task with ResultTooLarge; a big record is
announced on its done channel without its body; an undecodable (deeply nested) message is a
"malformed message" dead letter and never breaks listing; dead letters expire after their
TTL and are bounded in bytes; chord joins are bounded; oversized messages keep only a sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from blitzq import ConfigurationError, Queue, ResultTooLarge, TaskFailed, chord, group
from blitzq.broker import Completion, DeadLetterFields
from blitzq.broker.redis.keys import MESSAGE_FIELD, Keys
from blitzq.cli import cli
from blitzq.limits import DEAD_MESSAGE_SAMPLE, NOTIFY_INLINE_MAX

from .proc_tasks import eventually, make_worker, running

#: 200 kB of nested one-element arrays inside an otherwise valid envelope (id, task, queue,
#: args): deeper than any recursion limit.
NESTED = b"\x94\xa9nested-id\xa6t.nest\xa1q" + b"\x91" * 200_000 + b"\xc0"


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


def queue_key(queue: Queue) -> str:
    """The stream or list where ``queue``'s default queue waits."""
    keys = Keys(queue.namespace)
    return keys.stream(queue.name) if queue.mode == "reliable" else keys.list(queue.name)


async def plant(raw_redis: Any, queue: Queue, payload: bytes) -> None:
    """Put ``payload`` on the queue by hand, as a foreign producer would."""
    if queue.mode == "reliable":
        await raw_redis.xadd(queue_key(queue), {MESSAGE_FIELD: payload})
    else:
        await raw_redis.rpush(queue_key(queue), payload)


# ---------------------------------------------------------------------------- results
async def test_result_over_max_result_size_fails_with_result_too_large(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(mode=mode, max_result_size=10_000)
    runs = {"big": 0}

    @queue.task(name="sz.big", retries=3)
    async def big(n: int) -> str:
        runs["big"] += 1
        return "x" * n

    @queue.task(name="sz.odd", retries=3)
    async def odd() -> object:
        return object()  # not plain data: its result cannot be stored either

    try:
        worker = make_worker(queue, concurrency=4)
        async with running(worker):
            small = await big.enqueue(100)
            large = await big.enqueue(20_000)
            unstorable = await odd.enqueue()
            assert await small.result(timeout=10) == "x" * 100
            with pytest.raises(TaskFailed) as info:
                await large.result(timeout=10)
            with pytest.raises(TaskFailed) as odd_info:
                await unstorable.result(timeout=10)
            # Tester's input: the worker counted both dead-lettered runs as succeeded (its
            # record, `queue stats`, the "stopped: 2 succeeded" line); they failed.
            assert (worker.processed, worker.failed) == (1, 2)
        assert odd_info.value.error_type == "blitzq.exceptions.SerializationError"
        assert info.value.error_type == "blitzq.exceptions.ResultTooLarge"
        assert "over the limit of 10000 bytes" in (info.value.error or "")
        record = await queue.inspect(large.id)
        assert record is not None
        assert record.state.value == "dead_lettered"
        assert record.attempts == 1  # not retried: the same call returns as much again
        assert runs["big"] == 2
    finally:
        await queue.close()


def test_limits_are_checked_at_the_edge() -> None:
    for bad in (
        {"max_result_size": 10},
        {"dead_letter_ttl": 0},
        {"dead_letter_max_bytes": 10},
        {"dead_letter_cap": 0},
    ):
        with pytest.raises(ConfigurationError):
            Queue(redis_url="memory://", **bad)
    error = ResultTooLarge(20, 10)
    assert (error.size, error.limit) == (20, 10)


async def test_big_record_is_announced_without_its_body(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any
) -> None:
    queue = make_queue(mode=mode)

    @queue.task(name="sz.echo")
    async def echo(n: int) -> str:
        return "y" * n

    keys = Keys(queue.namespace)
    pubsub = raw_redis.pubsub(ignore_subscribe_messages=True)
    try:
        async with running(make_worker(queue, concurrency=2)):
            small = echo.options(task_id="small-one")
            large = echo.options(task_id="large-one")
            await pubsub.subscribe(keys.done_channel("small-one"), keys.done_channel("large-one"))
            h1 = await small.enqueue(10)
            h2 = await large.enqueue(NOTIFY_INLINE_MAX * 3)
            assert await h1.result(timeout=10) == "y" * 10
            assert await h2.result(timeout=10) == "y" * (NOTIFY_INLINE_MAX * 3)
            seen: dict[bytes, bytes] = {}
            deadline = time.monotonic() + 10
            while len(seen) < 2 and time.monotonic() < deadline:
                message = await pubsub.get_message(timeout=1.0)
                if message is not None:
                    seen[message["channel"]] = message["data"]
        assert seen[keys.done_channel("large-one").encode()] == b"1"
        small_push = seen[keys.done_channel("small-one").encode()]
        assert small_push != b"1"
        assert b"succeeded" in small_push
    finally:
        await pubsub.aclose()
        await queue.close()


# ------------------------------------------------------------------ undecodable messages
async def test_an_argument_at_the_nesting_limit_runs_and_one_past_it_is_refused(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    """One limit for arguments and results: what enqueue accepts, a worker decodes, runs and
    stores back; a result past the limit fails the task with the limit named."""
    from blitzq import SerializationError
    from blitzq.limits import MAX_NESTING

    def nested(levels: int) -> list[Any]:
        value: list[Any] = []
        for _ in range(levels - 1):
            value = [value]
        return value

    queue = make_queue(mode=mode)

    @queue.task(retries=0)
    async def same(value: Any) -> Any:
        return value

    @queue.task(retries=0)
    async def deeper(value: Any) -> Any:
        return [value]

    with pytest.raises(SerializationError, match=f"deeper than {MAX_NESTING} levels"):
        await same.enqueue(nested(MAX_NESTING + 1))
    async with running(make_worker(queue, concurrency=2)):
        at = nested(MAX_NESTING)
        assert await (await same.enqueue(at)).result(timeout=20) == at
        handle = await deeper.enqueue(at)
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=20)
    assert f"deeper than {MAX_NESTING} levels" in str(failed.value)
    assert "blitzq.limits.MAX_NESTING" in str(failed.value)


async def test_deeply_nested_message_is_a_malformed_dead_letter(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any
) -> None:
    queue = make_queue(mode=mode)

    @queue.task(name="t.nest")
    async def nest(*args: Any) -> int:
        return len(args)

    try:
        async with running(make_worker(queue, concurrency=2)):
            await plant(raw_redis, queue, NESTED)
            after = await nest.enqueue(1, 2)
            assert await after.result(timeout=10) == 2  # the worker keeps going
            await eventually(queue.dead_letter_count, lambda n: n == 1)
        (dead,) = await queue.dead_letters()
        assert dead.reason == "malformed message"
        assert "recursion" in dead.error
        assert dead.message == NESTED
        assert dead.args is None
    finally:
        await queue.close()


async def test_listing_survives_bad_dead_letters(
    make_queue: Callable[..., Queue], raw_redis: Any
) -> None:
    queue = make_queue()
    keys = Keys(queue.namespace)
    good = DeadLetterFields(b"\x93\xa1g\xa1t\xa1q", "failed", "boom", "t", "q", time.time())
    try:
        await queue.broker.complete([Completion("q", None, "good", dead_letter=good)])
        planted = {
            "nested": {"message": NESTED, "failed_at": str(time.time())},
            "garbage": {"message": b"\xc1\xff", "failed_at": "not-a-time", "reason": b"\xff"},
        }
        for task_id, fields in planted.items():
            await raw_redis.hset(keys.dead_letter(task_id), mapping=fields)
            await raw_redis.zadd(keys.dead_letters, {task_id: time.time()})
        listed = {d.id: d for d in await queue.dead_letters()}
        assert set(listed) == {"good", "nested", "garbage"}
        assert listed["good"].args == []
        assert listed["nested"].args is None
        assert listed["garbage"].failed_at == 0.0
    finally:
        await queue.close()


def test_cli_dead_letter_list_survives_a_nested_message(redis_url: str, namespace: str) -> None:
    keys = Keys(namespace)
    client = redis.Redis.from_url(redis_url)
    try:
        client.hset(
            keys.dead_letter("nested"),
            mapping={"message": NESTED, "reason": "failed", "failed_at": str(time.time())},
        )
        client.zadd(keys.dead_letters, {"nested": time.time()})
    finally:
        client.close()
    env: dict[str, str | None] = {"BLITZQ_REDIS_URL": None, "BLITZQ_NAMESPACE": None}
    result = CliRunner().invoke(
        cli,
        ["--redis-url", redis_url, "--namespace", namespace, "dead-letter", "list", "--json"],
        env=env,
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert '"nested"' in result.stdout


async def test_oversized_message_keeps_only_a_sample_in_its_dead_letter(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any
) -> None:
    queue = make_queue(mode=mode, max_message_size=2048)

    @queue.task(name="t.any")
    async def anything(*args: Any) -> None:
        return None

    try:
        async with running(make_worker(queue, concurrency=2)):
            await plant(raw_redis, queue, b"\x93\xa1i\xa5t.any\xa1q" + b"z" * 50_000)
            await eventually(queue.dead_letter_count, lambda n: n == 1)
        (dead,) = await queue.dead_letters()
        assert dead.reason == "message too large"
        assert len(dead.message) == DEAD_MESSAGE_SAMPLE
        assert f"first {DEAD_MESSAGE_SAMPLE} bytes" in dead.error
    finally:
        await queue.close()


# ------------------------------------------------------------------------- dead letters
def dead(task_id: str, size: int) -> Completion:
    """A completion dead-lettering ``task_id`` with a message of ``size`` bytes."""
    fields = DeadLetterFields(b"m" * size, "failed", "boom", "t", "q", time.time())
    return Completion("q", None, task_id, dead_letter=fields)


async def test_dead_letters_expire_after_their_ttl(
    make_queue: Callable[..., Queue], raw_redis: Any
) -> None:
    queue = make_queue(dead_letter_ttl=1)
    keys = Keys(queue.namespace)
    try:
        await queue.broker.complete([dead("old", 100)])
        ttl = await raw_redis.pttl(keys.dead_letter("old"))
        assert 0 < ttl <= 1000
        assert await queue.dead_letter_count() == 1
        await eventually(lambda: raw_redis.exists(keys.dead_letter("old")), lambda n: n == 0)
        assert await queue.dead_letters() == []
        assert await queue.dead_letter_count() == 0  # the index entry goes too
        assert await raw_redis.exists(keys.dead_letters, keys.dead_letter_bytes) == 0
    finally:
        await queue.close()


async def test_default_dead_letter_ttl_is_seven_days(
    make_queue: Callable[..., Queue], raw_redis: Any
) -> None:
    queue = make_queue()
    try:
        await queue.broker.complete([dead("week", 10)])
        ttl = await raw_redis.ttl(Keys(queue.namespace).dead_letter("week"))
        assert 7 * 86400 - 60 < ttl <= 7 * 86400
    finally:
        await queue.close()


async def test_dead_letters_are_bounded_in_bytes(
    make_queue: Callable[..., Queue], raw_redis: Any
) -> None:
    queue = make_queue(dead_letter_max_bytes=5000)
    keys = Keys(queue.namespace)
    try:
        for i in range(6):
            await queue.broker.complete([dead(f"d{i}", 1500)])
        kept = [d.id for d in await queue.dead_letters()]
        assert kept == ["d5", "d4", "d3"]  # newest first; 3 x (1500 + overhead) <= 5000
        total = int(await raw_redis.get(keys.dead_letter_bytes))
        assert 4500 < total <= 5000
        for gone in ("d0", "d1", "d2"):
            assert await raw_redis.exists(keys.dead_letter(gone)) == 0
        assert await queue.purge_dead_letters() == 3
        assert await raw_redis.exists(keys.dead_letter_bytes, keys.dead_letter_sizes) == 0
    finally:
        await queue.close()


async def test_replay_and_count_cap_keep_the_byte_count(
    make_queue: Callable[..., Queue], raw_redis: Any
) -> None:
    queue = make_queue(dead_letter_cap=2)
    keys = Keys(queue.namespace)
    try:
        await queue.broker.complete([dead(f"c{i}", 100) for i in range(4)])
        assert await queue.dead_letter_count() == 2
        assert int(await raw_redis.get(keys.dead_letter_bytes)) == 2 * (100 + 4 + 64)
        assert await queue.broker.replay_dead_letter("c3", "q", b"msg")
        assert int(await raw_redis.get(keys.dead_letter_bytes)) == 100 + 4 + 64
    finally:
        await queue.close()


# ------------------------------------------------------------------------------ chords
async def test_chord_join_over_the_limit_fails_the_workflow(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(mode=mode, max_message_size=4096, max_result_size=4096)
    runs = {"total": 0}

    @queue.task(name="sz.blob")
    async def blob(n: int) -> str:
        return "b" * n

    @queue.task(name="sz.total")
    async def total(parts: list[str]) -> int:
        runs["total"] += 1
        return sum(map(len, parts))

    try:
        async with running(make_worker(queue, concurrency=4)):
            fits = await queue.apply(chord([blob.s(100) for _ in range(3)], total.s()))
            assert await fits.get(timeout=10) == 300
            over = await queue.apply(chord([blob.s(2000) for _ in range(3)], total.s()))
            with pytest.raises(TaskFailed) as info:
                await over.get(timeout=10)
            assert info.value.error_type == "blitzq.exceptions.ResultTooLarge"
            listed = await queue.apply(group(blob.s(2000) for _ in range(3)))
            with pytest.raises(TaskFailed) as info2:
                await listed.get(timeout=10)
            assert info2.value.error_type == "blitzq.exceptions.ResultTooLarge"
        assert runs["total"] == 1
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(queue.close(), 10)
