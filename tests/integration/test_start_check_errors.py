"""A start check that gets an error reply spends the task's attempts, never loops.

Someone SET a string where a rate bucket (a hash) or a lock's holders (a sorted set) live:
every start check of the task gets ``WRONGTYPE``. That is not an outage (trying again answers
the same): the attempt fails with the error, the task's retries apply, and once they are spent
it is dead-lettered with the error's text, while other tasks on the queue keep running. Before
the fix it went back on the schedule every second forever (90 warnings in 90 s).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue, RetryPolicy, Signal, SignalEvent, TaskFailed, TaskState
from blitzq.broker.amqp import AmqpBroker
from blitzq.broker.redis.keys import Keys
from tests.amqp_server import amqp_or_skip, delete_amqp_queues

from .proc_tasks import make_worker, running

pytestmark = [pytest.mark.timeout(60), pytest.mark.both_servers]

#: Retries of the broken task: 3 attempts in all.
RETRIES = 2
FAST_RETRIES = RetryPolicy(base=0.01, max_delay=0.05, jitter="none")


@pytest.fixture(params=["reliable", "fast", "amqp"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test (``amqp``: RabbitMQ transport, state on Redis)."""
    return str(request.param)


@pytest.fixture
async def queue(
    make_queue: Callable[..., Queue], mode: str, server_url: str, namespace: str
) -> Any:
    """A Queue named ``sc`` in ``mode``, closed after the test (its RabbitMQ queues
    deleted)."""
    if mode != "amqp":
        q = make_queue(name="sc", mode=mode)
        yield q
        await q.close()
        return
    url = amqp_or_skip()
    broker = AmqpBroker(url, server_url, namespace)
    q = Queue("sc", broker=broker)
    yield q
    await q.close()
    await delete_amqp_queues(url, [broker])


@pytest.mark.parametrize("broken", ["rate bucket", "lock key"])
async def test_wrongtype_at_a_start_check_key_dead_letters_after_the_retries(
    queue: Queue, raw_redis: Any, namespace: str, broken: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[int] = []

    @queue.task(
        name="sc.broken",
        rate_limit="1000/s" if broken == "rate bucket" else None,
        lock="item:{n}" if broken == "lock key" else None,
        retries=RETRIES,
        retry_policy=FAST_RETRIES,
    )
    async def broken_task(n: int) -> None:
        runs.append(n)

    @queue.task(name="sc.limited", rate_limit="1000/s")  # a sound bucket of its own
    async def limited(n: int) -> int:
        return n

    @queue.task(name="sc.plain")
    async def plain(n: int) -> int:
        return n

    signals: list[tuple[str, int]] = []

    @queue.on(Signal.TASK_RETRIED)
    @queue.on(Signal.TASK_DEAD_LETTERED)
    async def seen(event: SignalEvent) -> None:
        if event.task == "sc.broken":
            signals.append((event.signal.name, event.attempt))

    keys = Keys(namespace)
    key = keys.rate_limit("sc.broken") if broken == "rate bucket" else keys.lock("item:7")
    await raw_redis.set(key, "not a hash")  # the WRONGTYPE planted where the check looks

    caplog.set_level(logging.WARNING, logger="blitzq.worker")
    caplog.set_level(logging.WARNING, logger="blitzq.worker.outcomes")
    handle = await broken_task.enqueue(7)
    others = [await limited.enqueue(i) for i in range(5)] + [
        await plain.enqueue(i) for i in range(5)
    ]
    async with running(make_worker(queue, concurrency=4)):
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=30)
        assert [await h.result(timeout=30) for h in others] == [*range(5), *range(5)]

    assert runs == []  # the body never ran
    assert failed.value.state == "dead_lettered"
    assert "WRONGTYPE" in (failed.value.error or "")
    record = await handle.status()
    assert record is not None
    assert record.state == TaskState.DEAD_LETTERED
    assert record.attempts == RETRIES + 1  # the usual budget, spent
    assert "WRONGTYPE" in (record.error or "")
    letters = await queue.dead_letters(task="sc.broken")
    assert [(d.id, d.reason) for d in letters] == [(handle.id, "failed")]
    assert "WRONGTYPE" in letters[0].error
    # One record per attempt (as any failed attempt), not one per second.
    failures = [
        getattr(r, "outcome", None)
        for r in caplog.records
        if r.name == "blitzq.worker.outcomes" and getattr(r, "task_id", None) == handle.id
    ]
    assert failures == ["retried"] * RETRIES + ["dead_lettered"]
    assert not [r for r in caplog.records if "could not reach the broker" in r.getMessage()]
    assert await raw_redis.get(key) == b"not a hash"  # nothing overwrote it
    expected = [("TASK_RETRIED", n) for n in range(1, RETRIES + 1)]
    assert sorted(signals) == sorted([*expected, ("TASK_DEAD_LETTERED", RETRIES + 1)])
