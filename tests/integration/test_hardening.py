"""Regressions from a new user's attempts to break blitzq: planted garbage, bad options, bad
calls. Each must end in a clear error or a dead letter while the queue keeps flowing."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import ConfigurationError, Queue, SerializationError, TaskFailed

from .proc_tasks import eventually, make_worker, running


@pytest.mark.parametrize(
    "options",
    [
        {"timeout": -1},
        {"timeout": 0},
        {"delay": math.inf},
        {"delay": math.nan},
        {"eta": math.inf},
        {"queue": "a b"},
        {"queue": "a}b"},
        {"task_id": ""},
        {"task_id": "x y\n"},
        {"priority": "urgent"},
    ],
)
def test_bad_call_options_are_refused_at_the_edge(options: dict[str, Any]) -> None:
    queue = Queue(redis_url="memory://hardening-options")

    @queue.task
    async def noop() -> None:
        return None

    with pytest.raises(ConfigurationError):
        noop.options(**options)


async def test_send_refuses_keyword_names_that_are_not_str(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    queue = make_queue()
    with pytest.raises(SerializationError):
        await queue.send("tasks.echo", kwargs={1: 2})  # type: ignore[dict-item]
    assert await raw_redis.xlen("{" + namespace + "}:s:default") == 0
    await queue.close()


async def test_a_planted_delivery_count_that_is_not_a_number_does_not_stall_the_queue(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    queue = make_queue()

    @queue.task
    async def add(a: int, b: int) -> int:
        return a + b

    async with running(make_worker(queue)):
        await raw_redis.xadd("{" + namespace + "}:s:default", {"m": b"x", "d": b"abc"})
        handle = await add.enqueue(2, 3)
        assert await handle.result(timeout=10) == 5
        dead = await eventually(queue.dead_letters, bool, timeout=30.0)
        assert dead[0].reason == "malformed message"
    await queue.close()


@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_a_planted_schedule_entry_is_dead_lettered_and_delays_keep_working(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str, mode: str
) -> None:
    queue = make_queue(mode=mode)

    @queue.task
    async def add(a: int, b: int) -> int:
        return a + b

    prefix = "{" + namespace + "}:"
    await raw_redis.zadd(prefix + "sched", {"g1": 0})
    await raw_redis.hset(prefix + "sched:m", "g1", "garbage")
    async with running(make_worker(queue)):
        handle = await add.options(delay=0.2).enqueue(1, 1)
        assert await handle.result(timeout=10) == 2
        dead = await queue.dead_letters()
        assert [(d.id, d.reason) for d in dead] == [("g1", "malformed scheduled entry")]
    await queue.close()


@pytest.mark.parametrize("executor", ["async", "thread"])
async def test_a_call_that_does_not_fit_the_signature_fails_once_without_retries(
    make_queue: Callable[..., Queue], executor: str
) -> None:
    queue = make_queue()
    if executor == "async":

        @queue.task(retries=3)
        async def add(a: int, b: int) -> int:
            return a + b

    else:

        @queue.task(retries=3)
        def add(a: int, b: int) -> int:
            return a + b

    async with running(make_worker(queue)):
        handle = await add.enqueue(1)  # type: ignore[call-arg]
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=10)
    assert failed.value.error_type == "TypeError"
    record = await queue.inspect(handle.id)
    assert record is not None
    assert record.attempts == 1
    await queue.close()


async def test_waiting_for_a_result_survives_a_redis_restart(tmp_path: Any) -> None:
    """A waiter keeps waiting (re-reading) while the server restarts, then gets the result."""
    from tests.reliability.conftest import PrivateRedis

    server = PrivateRedis(tmp_path)
    server.start()
    try:
        queue = Queue(redis_url=server.url, namespace="restart")

        @queue.task
        async def slow(x: int) -> int:
            await asyncio.sleep(1.5)
            return x * 2

        worker = make_worker(queue)
        task = asyncio.create_task(worker.run())
        handle = await slow.enqueue(21)
        waiter = asyncio.create_task(handle.result(timeout=30))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(server.shutdown)
        await asyncio.sleep(1.0)
        await asyncio.to_thread(server.start)
        assert await asyncio.wait_for(waiter, timeout=40) == 42
        worker.stop()
        await asyncio.wait_for(task, timeout=30)
        await queue.close()
    finally:
        server.stop()


async def test_a_replayed_dead_letter_keeps_its_options(make_queue: Callable[..., Queue]) -> None:
    """Replay starts attempts and age afresh but keeps every other field of the message."""
    queue = make_queue()

    @queue.task(retries=0)
    async def always_fails() -> None:
        raise RuntimeError("no")

    async with running(make_worker(queue)):
        handle = await always_fails.options(max_age=60, headers={"tenant": "acme"}).enqueue()
        with pytest.raises(TaskFailed):
            await handle.result(timeout=10)
        replayed = await queue.retry(handle.id)
        assert replayed is not None
        dead = await eventually(queue.dead_letters, bool, timeout=30.0)
    from blitzq.serialization import decode_envelope

    env = decode_envelope(dead[0].message)
    assert (env.max_age, env.headers, env.attempt) == (60, {"tenant": "acme"}, 1)
    await queue.close()
