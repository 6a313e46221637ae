"""Unit tests of the in-process MemoryBroker."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from blitzq.broker import Completion, DeadLetterFields, Guarantee, Scheduled, memory
from blitzq.broker.memory import MemoryBroker
from blitzq.serialization import Envelope, encode_envelope, loads


class FakeClock:
    """Stands in for the ``time`` module inside ``blitzq.broker.memory``."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_700_000_000.0 + self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(memory, "time", fake)
    return fake


def in_thread(factory: Callable[[], Coroutine[Any, Any, Any]], delay: float = 0.0) -> list[Any]:
    """Run a coroutine in a new thread's own event loop; the result lands in the list."""
    out: list[Any] = []

    def run() -> None:
        time.sleep(delay)
        out.append(asyncio.run(factory()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out.append(thread)
    return out


def envelope(task_id: str, task: str = "tasks.add") -> bytes:
    return encode_envelope(Envelope(id=task_id, task=task, queue="q"), 1 << 20)


def dead(reason: str, failed_at: float, message: bytes = b"m") -> DeadLetterFields:
    return DeadLetterFields(message, reason, "boom", "tasks.add", "q", failed_at)


async def test_contract_basics() -> None:
    broker = MemoryBroker()
    assert broker.guarantee is Guarantee.EPHEMERAL
    assert broker.supports_recovery
    await broker.ping()
    await broker.publish("q", [b"a", b"b", b"c"])
    got = await broker.fetch("q", 2, 0)
    assert [d.payload for d in got] == [b"a", b"b"]
    assert all(d.queue == "q" and d.deliveries == 1 and d.token for d in got)
    assert len({d.token for d in got}) == 2
    assert await broker.queue_stats(["q", "x"]) == {
        "q": {"waiting": 1, "in_flight": 2},
        "x": {"waiting": 0, "in_flight": 0},
    }
    await broker.prepare_consumer(["p"], "worker-1")
    await broker.remember_queues(["r"])
    assert await broker.known_queues() == ["p", "q", "r"]
    assert await broker.purge_queue("q") == 1
    assert await broker.fetch("q", 10, 0) == []
    await broker.close()
    assert await broker.queue_stats(["q"]) == {"q": {"waiting": 0, "in_flight": 2}}


def test_named_registry_shares_instances() -> None:
    assert MemoryBroker.named("shared-a") is MemoryBroker.named("shared-a")
    assert MemoryBroker.named("shared-a") is not MemoryBroker.named("shared-b")


async def test_fetch_times_out_empty() -> None:
    broker = MemoryBroker()
    start = time.monotonic()
    assert await broker.fetch("q", 1, 0) == []
    assert await broker.fetch("q", 1, 0.1) == []
    assert 0.09 <= time.monotonic() - start < 5.0  # generous upper bound: a busy machine
    assert not broker._fetchers  # the timed-out waiter was removed


async def test_blocking_fetch_woken_by_publish_from_another_threads_loop() -> None:
    broker = MemoryBroker()
    out = in_thread(lambda: broker.publish("q", [b"x", b"y"]), delay=0.1)
    start = time.monotonic()
    got = await broker.fetch("q", 5, 10)
    assert time.monotonic() - start < 5
    assert [d.payload for d in got] == [b"x", b"y"]
    out[0].join(5)


async def test_fetch_blocked_in_another_thread_woken_by_this_loop() -> None:
    broker = MemoryBroker()
    out = in_thread(lambda: broker.fetch("q", 1, 10))
    while not broker._fetchers:  # wait until the other loop is blocked
        await asyncio.sleep(0.01)
    await broker.publish("q", [b"x"])
    out[0].join(5)
    assert [d.payload for d in out[1]] == [b"x"]


async def test_two_blocked_fetchers_share_messages() -> None:
    broker = MemoryBroker()
    first = asyncio.create_task(broker.fetch("q", 1, 5))
    second = asyncio.create_task(broker.fetch("q", 1, 0.3))
    await asyncio.sleep(0.05)
    await broker.publish("q", [b"only"])
    results = await asyncio.gather(first, second)
    assert sorted(len(r) for r in results) == [0, 1]


async def test_wait_for_record_woken_from_another_thread() -> None:
    broker = MemoryBroker()
    assert await broker.wait_for_record("t1", 0) is None
    out = in_thread(lambda: broker.set_record("t1", b"done", 60), delay=0.1)
    assert await broker.wait_for_record("t1", 10) == b"done"
    out[0].join(5)
    assert await broker.wait_for_record("t2", 0.05) is None


async def test_complete_ack_removes_in_flight() -> None:
    broker = MemoryBroker()
    await broker.publish("q", [b"a"])
    (d,) = await broker.fetch("q", 1, 0)
    await broker.complete([Completion("q", d.token, "t1")])
    assert await broker.queue_stats(["q"]) == {"q": {"waiting": 0, "in_flight": 0}}
    assert await broker.get_record("t1") is None


async def test_complete_record_notifies_waiter() -> None:
    broker = MemoryBroker()
    await broker.publish("q", [b"a"])
    (d,) = await broker.fetch("q", 1, 0)
    waiter = asyncio.create_task(broker.wait_for_record("t1", 5))
    await asyncio.sleep(0.01)
    await broker.complete([Completion("q", d.token, "t1", record=b"rec", record_ttl=60)])
    assert await waiter == b"rec"
    assert await broker.get_record("t1") == b"rec"
    assert (await broker.queue_stats(["q"]))["q"]["in_flight"] == 0


async def test_complete_reschedule(clock: FakeClock) -> None:
    broker = MemoryBroker()
    await broker.publish("q", [b"a"])
    (d,) = await broker.fetch("q", 1, 0)
    await broker.complete([Completion("q", d.token, "t1", reschedule=b"retry", delay=50.0)])
    assert await broker.scheduled_count() == 1
    assert await broker.fetch("q", 1, 0) == []
    due = clock.time() + 50.0  # the delay counts from when the completion is applied
    clock.now += 49.0
    assert await broker.promote_due(10) == (0, due, clock.time())
    clock.now += 1.0
    assert await broker.promote_due(10) == (1, None, clock.time())
    assert [x.payload for x in await broker.fetch("q", 1, 0)] == [b"retry"]


async def test_complete_dead_letter_newest_first_and_capped() -> None:
    broker = MemoryBroker(dead_letter_cap=2)
    await broker.publish("q", [b"a", b"b", b"c"])
    ds = await broker.fetch("q", 3, 0)
    await broker.complete(
        [
            Completion("q", ds[0].token, "t1", dead_letter=dead("failed", 1.0)),
            Completion("q", ds[1].token, "t2", dead_letter=dead("failed", 3.0)),
        ]
    )
    await broker.complete([Completion("q", ds[2].token, "t3", dead_letter=dead("failed", 2.0))])
    assert await broker.dead_letter_count() == 2
    assert [tid for tid, _ in await broker.dead_letters(0, 10)] == ["t2", "t3"]
    assert [tid for tid, _ in await broker.dead_letters(1, 1)] == ["t3"]
    assert await broker.get_dead_letter("t1") is None
    assert await broker.get_dead_letter("t2") == dead("failed", 3.0)
    assert (await broker.queue_stats(["q"]))["q"]["in_flight"] == 0
    assert await broker.purge_dead_letters() == 2
    assert await broker.dead_letter_count() == 0


async def test_complete_requeue_goes_to_head() -> None:
    broker = MemoryBroker()
    await broker.publish("q", [b"a", b"b"])
    (d,) = await broker.fetch("q", 1, 0)
    await broker.complete([Completion("q", d.token, "t1", requeue=b"again")])
    got = await broker.fetch("q", 5, 0)
    assert [(x.payload, x.deliveries) for x in got] == [(b"again", 1), (b"b", 1)]


async def test_promote_due(clock: FakeClock) -> None:
    broker = MemoryBroker()
    base = clock.time()
    await broker.schedule(
        [
            Scheduled("t1", "q", b"one", delay=10.0),
            Scheduled("t2", "q", b"two", eta=base + 20.0),
            Scheduled("t3", "r", b"three", delay=30.0),
        ]
    )
    await broker.schedule([Scheduled("t2", "q", b"two-b", 15.0)])  # keyed by task id: replaces
    assert await broker.scheduled_count() == 3
    clock.now += 5.0
    assert await broker.promote_due(10) == (0, base + 10.0, base + 5.0)
    clock.now += 15.0
    assert await broker.promote_due(1) == (1, base + 15.0, base + 20.0)
    assert await broker.promote_due(10) == (1, base + 30.0, base + 20.0)
    assert [d.payload for d in await broker.fetch("q", 10, 0)] == [b"one", b"two-b"]
    clock.now += 80.0
    assert await broker.promote_due(10) == (1, None, base + 100.0)
    assert [d.payload for d in await broker.fetch("r", 10, 0)] == [b"three"]
    assert await broker.scheduled_count() == 0


async def test_promote_due_wakes_blocked_fetch() -> None:
    broker = MemoryBroker()
    fetching = asyncio.create_task(broker.fetch("q", 1, 5))
    await asyncio.sleep(0.01)
    await broker.schedule([Scheduled("t1", "q", b"due", eta=1.0)])
    await broker.promote_due(10)
    assert [d.payload for d in await fetching] == [b"due"]


async def test_replay_is_atomic_across_threads() -> None:
    broker = MemoryBroker()
    await broker.complete([Completion("q", None, "t1", record=b"r", record_ttl=60)])
    await broker.complete([Completion("q", None, "t1", dead_letter=dead("failed", 1.0))])
    barrier = threading.Barrier(8)

    async def replay() -> bool:
        barrier.wait()
        return await broker.replay_dead_letter("t1", "q", b"replayed")

    runs = [in_thread(replay) for _ in range(8)]
    for run in runs:
        run[0].join(5)
    assert sorted(run[1] for run in runs) == [False] * 7 + [True]
    assert await broker.get_dead_letter("t1") is None
    assert await broker.get_record("t1") is None
    assert [d.payload for d in await broker.fetch("q", 10, 0)] == [b"replayed"]
    assert await broker.replay_dead_letter("t1", "q", b"replayed") is False


async def test_record_expiry(clock: FakeClock) -> None:
    broker = MemoryBroker()
    await broker.set_record("t1", b"rec", 10)
    clock.now += 9.9
    assert await broker.get_record("t1") == b"rec"
    clock.now += 0.1
    assert await broker.get_record("t1") is None
    assert await broker.wait_for_record("t1", 0) is None


async def test_workers_expire(clock: FakeClock) -> None:
    broker = MemoryBroker()
    await broker.register_worker("w1", b"info1", 10)
    await broker.register_worker("w2", b"info2", 30)
    assert await broker.workers() == {"w1": b"info1", "w2": b"info2"}
    clock.now += 20
    assert await broker.workers() == {"w2": b"info2"}
    await broker.unregister_worker("w2")
    assert await broker.workers() == {}


async def test_heartbeat_renews_only_in_flight(clock: FakeClock) -> None:
    broker = MemoryBroker()
    await broker.publish("q", [b"a", b"b"])
    a, b = await broker.fetch("q", 2, 0)
    assert a.token is not None
    assert b.token is not None
    clock.now += 20
    assert await broker.heartbeat("q", [a.token, b"unknown"]) == 1
    clock.now += 15
    assert await broker.recover("q", 30, 10, 5) == (1, 0)  # only b was idle > 30 s
    assert await broker.heartbeat("q", [b.token]) == 0  # recovered: no longer ours
    got = await broker.fetch("q", 5, 0)
    assert [(d.payload, d.deliveries) for d in got] == [(b"b", 2)]


async def test_recover_with_max_deliveries(clock: FakeClock) -> None:
    broker = MemoryBroker()
    message = envelope("task-1")
    await broker.publish("q", [message, b"\xc1not msgpack"])
    await broker.fetch("q", 2, 0)
    clock.now += 1
    assert await broker.recover("q", 0.5, 1, 2) == (1, 0)  # count limits the batch
    assert await broker.recover("q", 0.5, 10, 2) == (1, 0)
    got = await broker.fetch("q", 5, 0)
    assert [(d.payload, d.deliveries) for d in got] == [(message, 2), (b"\xc1not msgpack", 2)]
    assert await broker.recover("q", 0.5, 10, 2) == (0, 0)  # not idle long enough yet
    waiter = asyncio.create_task(broker.wait_for_record("task-1", 5))
    await asyncio.sleep(0.01)
    clock.now += 1
    assert await broker.recover("q", 0.5, 10, 2, record_ttl=100) == (0, 2)
    assert await broker.queue_stats(["q"]) == {"q": {"waiting": 0, "in_flight": 0}}

    error = (
        "delivered 2 times without completing (max_deliveries=2); "
        "the worker running it probably crashed"
    )
    failed_at = clock.time()
    record = await waiter
    assert record is not None
    assert loads(record) == {
        "id": "task-1",
        "task": "tasks.add",
        "queue": "q",
        "state": "dead_lettered",
        "attempts": 2,
        "error_type": "MaxDeliveriesExceeded",
        "error": error,
        "finished_at": failed_at,
    }
    assert await broker.get_dead_letter("task-1") == DeadLetterFields(
        message, "max deliveries exceeded", error, "tasks.add", "q", failed_at
    )
    # The malformed message is keyed by its delivery token and has no task name.
    letters = dict(await broker.dead_letters(0, 10))
    assert len(letters) == 2
    (bad_id,) = set(letters) - {"task-1"}
    assert letters[bad_id].task == ""
    assert letters[bad_id].message == b"\xc1not msgpack"
    assert await broker.get_record(bad_id) is not None
    clock.now += 100
    assert await broker.get_record("task-1") is None
