"""Corrupted state planted in a namespace (a counter that is not an integer, a schedule entry
without a body, a key of another type): the Lua scripts check or repair what they read before
they write, so that a script never fails midway (Redis keeps a failed script's earlier
writes), stats and listings keep working, and the promoter keeps promoting. Each runs on the
session's server and on the embedded Valkey."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from redis.exceptions import ResponseError

from blitzq import BrokerError, Queue
from blitzq.broker import Completion, DeadLetterFields
from blitzq.broker.redis import ReliableRedisBroker, scripts
from blitzq.broker.redis.keys import GROUP

from .proc_tasks import eventually, make_worker, running

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_servers]


def _prefix(namespace: str) -> str:
    return "{" + namespace + "}:"


async def test_a_dead_letter_byte_count_that_is_not_an_integer_is_reset_from_the_sizes(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    p = _prefix(namespace)
    await raw_redis.zadd(p + "dlq", {"old": time.time()})
    await raw_redis.hset(p + "d:old", mapping={"message": b"m", "reason": "failed"})
    await raw_redis.hset(p + "dlq:size", mapping={"old": 100, "bad": "abc"})
    await raw_redis.set(p + "dlq:bytes", "notanint")
    queue = make_queue()
    stats = await queue.stats()  # trims the dead letters: dl_total repairs the count
    assert stats["dead_letters"] == 1
    assert [d.id for d in await queue.dead_letters()] == ["old"]
    assert await raw_redis.get(p + "dlq:bytes") == b"100"
    assert await raw_redis.hget(p + "dlq:size", "bad") == b"0"
    assert await raw_redis.hget(p + "stats", "counters_reset") == b"1"
    await queue.close()


async def test_a_completion_with_a_dead_letter_is_applied_whole_over_a_corrupted_count(
    server_url: str, raw_redis: Any, namespace: str
) -> None:
    p = _prefix(namespace)
    await raw_redis.set(p + "dlq:bytes", "notanint")
    broker = ReliableRedisBroker(server_url, namespace)
    try:
        await broker.prepare_consumer(["q"], "c1")
        await broker.publish("q", [b"body"])
        (delivery,) = await broker.fetch_first(["q"], 1, 0)
        dead = DeadLetterFields(b"body", "failed", "boom", "t.x", "q", time.time())
        stale = await broker.complete(
            [Completion("q", delivery.token, "t1", b"rec", 60, dead_letter=dead)]
        )
        assert stale == []
        assert await broker.get_record("t1") == b"rec"
        assert await raw_redis.zscore(p + "dlq", "t1") is not None
        size = int(await raw_redis.hget(p + "dlq:size", "t1"))
        assert int(await raw_redis.get(p + "dlq:bytes")) == size
        assert await raw_redis.xlen(p + "s:q") == 0  # acked and deleted
        assert await raw_redis.hget(p + "stats", "stale_completions") is None
    finally:
        await broker.close()


async def test_an_unknown_op_is_refused_before_anything_is_written(
    server_url: str, raw_redis: Any, namespace: str
) -> None:
    p = _prefix(namespace)
    broker = ReliableRedisBroker(server_url, namespace)
    try:
        await broker.prepare_consumer(["q"], "c1")
        await broker.publish("q", [b"body"])
        (delivery,) = await broker.fetch_first(["q"], 1, 0)
        token = delivery.token.decode() if isinstance(delivery.token, bytes) else delivery.token
        # A "C" entry that acks, stores a record, then names an op the script does not know.
        entry = ["C", "s", "q", token, "t1", "rec", 60, "", 0, "", "", [["no_such_op"]], ""]
        batch = msgspec.msgpack.encode([entry])
        keys = [p + "sched", p + "sched:m", p + "dlq"]
        args = [p, GROUP, 100, batch, 60, 10**6, 4096, "c1"]
        with pytest.raises(ResponseError, match="unknown completion op"):
            await raw_redis.eval(scripts.load("complete").source, 3, *keys, *args)
        assert await raw_redis.get(p + "t:t1") is None
        pending = await raw_redis.xpending(p + "s:q", GROUP)
        assert pending["pending"] == 1  # not acked
    finally:
        await broker.close()


async def test_a_corrupted_count_and_a_schedule_entry_without_body_block_no_delay(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    p = _prefix(namespace)
    await raw_redis.set(p + "dlq:bytes", "notanint")
    await raw_redis.zadd(p + "sched", {"g8": 1})
    await raw_redis.hset(p + "sched:m", "g8", "snonewline")
    queue = make_queue()

    @queue.task(retries=0)
    async def add(a: int, b: int) -> int:
        return a + b

    @queue.task(retries=0)
    async def boom() -> None:
        raise ValueError("boom")

    async with running(make_worker(queue)):
        handle = await add.options(delay=0.2).enqueue(1, 1)
        assert await handle.result(timeout=20) == 2
        failing = await boom.enqueue()
        dead = await eventually(
            queue.dead_letters, lambda d: {x.id for x in d} >= {"g8", failing.id}, timeout=30
        )
    reasons = {d.id: d.reason for d in dead}
    assert reasons == {"g8": "malformed scheduled entry", failing.id: "failed"}
    assert (await queue.stats())["stale_completions"] == 0
    assert await raw_redis.zcard(p + "sched") == 0
    await queue.close()


async def test_a_stale_count_that_is_not_an_integer_reads_as_zero(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    await raw_redis.hset(_prefix(namespace) + "stats", "stale_completions", "abc")
    queue = make_queue()
    assert (await queue.stats())["stale_completions"] == 0
    await queue.close()


@pytest.mark.parametrize(
    ("mode", "key"),
    [("reliable", "s:default:low"), ("reliable", "s:default"), ("fast", "l:default")],
)
async def test_a_queue_key_of_another_type_is_named_when_the_worker_starts(
    make_queue: Callable[..., Queue],
    raw_redis: Any,
    namespace: str,
    mode: str,
    key: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker starts all the same and serves the queue's other levels; one ERROR names
    the key (docs/guarantees.md: a key of the wrong type stops no other level)."""
    full = _prefix(namespace) + key
    await raw_redis.set(full, "x")
    queue = make_queue(mode=mode)
    caplog.set_level(logging.ERROR, logger="blitzq.worker")

    @queue.task
    async def noop() -> str:
        return "ran"

    try:
        async with running(make_worker(queue)):
            handle = await noop.options(priority="high").enqueue()
            assert await handle.result(timeout=20) == "ran"

            async def named() -> list[str]:
                return [r.getMessage() for r in caplog.records if full in r.getMessage()]

            found = await eventually(named, bool, timeout=20)
            assert f"key '{full}' holds a string" in found[0]
    finally:
        await queue.close()


async def test_a_stale_completion_resets_a_stale_count_that_is_not_an_integer(
    server_url: str, raw_redis: Any, namespace: str
) -> None:
    p = _prefix(namespace)
    await raw_redis.hset(p + "stats", "stale_completions", "abc")
    broker = ReliableRedisBroker(server_url, namespace)
    try:
        await broker.prepare_consumer(["q"], "c1")
        await broker.publish("q", [b"body"])
        (delivery,) = await broker.fetch_first(["q"], 1, 0)
        done = Completion("q", delivery.token, "t1", b"rec", 60)
        assert await broker.complete([done]) == []
        again = Completion("q", delivery.token, "t1", b"other", 60, requeue=b"x")
        assert len(await broker.complete([again])) == 1  # stale: writes nothing
        assert await broker.get_record("t1") == b"rec"
        assert await raw_redis.hget(p + "stats", "stale_completions") == b"1"
        assert await broker.counters() == {"stale_completions": 1}
    finally:
        await broker.close()


async def test_a_progress_time_that_is_not_a_number_reads_as_absent(
    server_url: str, raw_redis: Any, namespace: str
) -> None:
    from blitzq.broker.effects import Progress

    p = _prefix(namespace)
    broker = ReliableRedisBroker(server_url, namespace)
    try:
        await raw_redis.hset(p + "p:t1", mapping={"at": "abc", "v": b"old"})
        assert await broker.set_progress("t1", b"new", time.time(), 60) is True
        assert await broker.get_progress("t1") == b"new"
        # The same update as a completion effect (complete.lua's "progress" op).
        await raw_redis.hset(p + "p:t2", mapping={"at": "abc", "v": b"old"})
        await broker.prepare_consumer(["q"], "c1")
        await broker.publish("q", [b"body"])
        (delivery,) = await broker.fetch_first(["q"], 1, 0)
        op = Progress("t2", time.time(), b"end", 60)
        assert await broker.complete([Completion("q", delivery.token, "t2", ops=(op,))]) == []
        assert await broker.get_progress("t2") == b"end"
    finally:
        await broker.close()


async def test_the_cli_and_the_dashboard_read_a_namespace_with_a_corrupted_count(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str, server_url: str
) -> None:
    """Issue input: ``SET {ns}:dlq:bytes notanint`` made ``blitzq queue stats`` and
    ``blitzq dead-letter list`` fail, and the dashboard's APIs answer 503."""
    import asyncio
    import json

    from click.testing import CliRunner

    from blitzq.cli import cli

    p = _prefix(namespace)
    await raw_redis.zadd(p + "dlq", {"old": time.time()})
    await raw_redis.hset(p + "d:old", mapping={"message": b"m", "reason": "failed"})
    await raw_redis.hset(p + "dlq:size", "old", 65)
    await raw_redis.set(p + "dlq:bytes", "notanint")
    base = ["--redis-url", server_url, "--namespace", namespace, "--json"]

    def invoke(*args: str) -> Any:
        result = CliRunner().invoke(cli, [*base, *args])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    assert (await asyncio.to_thread(invoke, "queue", "stats"))["dead_letters"] == 1
    listed = await asyncio.to_thread(invoke, "dead-letter", "list")
    assert [d["id"] for d in listed["dead_letters"]] == ["old"]
    assert await raw_redis.get(p + "dlq:bytes") == b"65"

    pytest.importorskip("starlette", reason="the dashboard needs the 'dashboard' extra")
    import httpx

    from blitzq.dashboard import create_app

    await raw_redis.set(p + "dlq:bytes", "notanint")
    queue = make_queue()
    app = create_app(queue)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
        assert (await c.get("/api/queues")).status_code == 200
        r = await c.get("/api/dead-letters")
        assert r.status_code == 200
        assert "old" in r.text
    await queue.close()


@pytest.mark.parametrize(
    ("key", "completion"),
    [
        ("sched", {"reschedule": b"retry", "delay": 5.0}),
        ("sched:m", {"reschedule": b"retry", "delay": 5.0}),
        ("dlq", {"dead": True}),
        ("d:t1", {"dead": True}),
    ],
)
async def test_a_key_of_another_type_refuses_the_batch_before_anything_is_written(
    server_url: str, raw_redis: Any, namespace: str, key: str, completion: dict[str, Any]
) -> None:
    p = _prefix(namespace)
    broker = ReliableRedisBroker(server_url, namespace)
    try:
        await broker.prepare_consumer(["q"], "c1")
        await broker.publish("q", [b"first", b"second"])
        first, second = await broker.fetch_first(["q"], 2, 0)
        await raw_redis.set(p + key, "planted")
        if completion.pop("dead", False):
            completion["dead_letter"] = DeadLetterFields(b"m", "failed", "e", "t", "q", 1.0)
        batch = [
            Completion("q", first.token, "t0", b"rec0", 60),
            Completion("q", second.token, "t1", b"rec1", 60, **completion),
        ]
        with pytest.raises(BrokerError, match=rf"key {{{namespace}}}:{key} holds a string"):
            await broker.complete(batch)
        assert await broker.get_record("t0") is None  # nothing of the batch was applied
        assert (await raw_redis.xpending(p + "s:q", GROUP))["pending"] == 2
        assert await raw_redis.get(p + key) == b"planted"
    finally:
        await broker.close()


async def test_a_fenced_write_after_the_server_lost_the_stream_is_stale_not_an_error(
    server_url: str, raw_redis: Any, namespace: str
) -> None:
    """A server restarted without persistence lost the stream and its group: a write fenced
    by a delivery of it (the running record, a progress update) used to fail the whole
    script midway (XPENDING: NOGROUP); it is stale, and the rest of the batch applies."""
    p = _prefix(namespace)
    broker = ReliableRedisBroker(server_url, namespace)
    try:
        await broker.prepare_consumer(["q"], "c1")
        await broker.publish("q", [b"body"])
        (delivery,) = await broker.fetch_first(["q"], 1, 0)
        await raw_redis.delete(p + "s:q")  # lost with the restart
        running = Completion("q", None, "t1", b"running", 60, fence=delivery.token)
        other = Completion("q2", None, "t2", b"rec2", 60)
        stale = await broker.complete([running, other])
        assert [c.task_id for c in stale] == ["t1"]
        assert await broker.get_record("t1") is None
        assert await broker.get_record("t2") == b"rec2"
        fence = ("q", delivery.token)
        assert await broker.set_progress("t1", b"p", time.time(), 60, fence=fence) is False
    finally:
        await broker.close()


async def test_a_last_periodic_occurrence_that_is_not_a_number_reads_as_none(
    server_url: str, raw_redis: Any, namespace: str
) -> None:
    p = _prefix(namespace)
    await raw_redis.hset(p + "periodic", mapping={"bad": "notanumber", "good": "12.5"})
    broker = ReliableRedisBroker(server_url, namespace)
    try:
        assert await broker.periodic_last(["bad", "good", "none"]) == {"good": 12.5}
    finally:
        await broker.close()


async def test_a_record_key_of_another_type_is_written_over_as_before(
    server_url: str, raw_redis: Any, namespace: str
) -> None:
    """``complete.lua`` writes a record with ``SET ... GET``, which refuses a key of another
    type: that record is written with a plain ``SET`` instead, and the batch is applied whole,
    as a plain ``SET`` always did."""
    p = _prefix(namespace)
    broker = ReliableRedisBroker(server_url, namespace)
    try:
        await broker.prepare_consumer(["q"], "c1")
        await broker.publish("q", [b"first", b"second"])
        first, second = await broker.fetch_first(["q"], 2, 0)
        await raw_redis.hset(p + "t:t1", "planted", "1")
        await raw_redis.set(p + "t:t0", b"an earlier record")
        batch = [
            Completion("q", first.token, "t0", b"rec0", 60),
            Completion("q", second.token, "t1", b"rec1", 60),
        ]
        assert await broker.complete(batch) == []
        assert await raw_redis.get(p + "t:t0") == b"rec0"
        assert await raw_redis.get(p + "t:t1") == b"rec1"
        assert 0 < await raw_redis.ttl(p + "t:t1") <= 60
        assert (await raw_redis.xpending(p + "s:q", GROUP))["pending"] == 0
    finally:
        await broker.close()
