"""The worker's thread pool (growth for abandoned calls) and slot grants, without a server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from blitzq.worker.executors import ThreadPool
from blitzq.worker.limiter import Limiter, Slots


def _wait(predicate: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_thread_pool_grows_by_one_thread_per_abandoned_call_and_shrinks_back() -> None:
    pool = ThreadPool(2, "t")
    gate = threading.Event()
    try:
        hung = [pool.submit(gate.wait, 30) for _ in range(2)]
        _wait(lambda: pool.threads == 2)
        queued = pool.submit(lambda: "ran")
        time.sleep(0.05)
        assert not queued.done(), "a third call ran with a limit of two threads"
        pool.abandon()
        assert queued.result(10) == "ran"  # the abandoned call's extra thread took it
        assert pool.threads == 3
        assert all(t.daemon for t in threading.enumerate() if t.name.startswith("t-"))
        pool.returned()
        gate.set()
        assert all(f.result(10) for f in hung)
        assert pool.submit(lambda: 1).result(10) == 1
        _wait(lambda: pool.threads <= 2)
    finally:
        gate.set()
        pool.shutdown(wait=True)
    assert pool.threads == 0
    with pytest.raises(RuntimeError):
        pool.submit(lambda: None)


def test_thread_pool_passes_errors_and_keyword_arguments() -> None:
    pool = ThreadPool(1)
    try:

        def fail(message: str) -> None:
            raise ValueError(message)

        with pytest.raises(ValueError, match="boom"):
            pool.submit(fail, message="boom").result(10)
        assert pool.submit(lambda a, b=0: a + b, 1, b=2).result(10) == 3
    finally:
        pool.shutdown()


def test_shutdown_cancels_calls_not_started() -> None:
    pool = ThreadPool(1)
    gate = threading.Event()
    running = pool.submit(gate.wait, 30)
    waiting = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    assert waiting.cancelled()
    gate.set()
    assert running.result(10) is True


async def test_grant_takes_only_free_slots_and_returns_unused_queue_slots() -> None:
    g, q = Limiter(3), Limiter(2)
    slots = Slots(g, q)
    assert await slots.reserve(1) == 1
    slots.global_limiter.release(1)  # a blocking fetch holds the queue slot only
    g.take(2)  # other queues took two global slots meanwhile
    assert slots.grant(3, 1) == 1  # three arrived; one global slot free
    assert (g.free, q.free) == (0, 1)
    slots.release(1)
    g.release(2)
    # Nothing free globally: the queue slot the fetch held is given back.
    await slots.reserve(1)
    g.release(1)
    g.take(3)
    assert slots.grant(2, 1) == 0
    assert q.free == 2
    # Without a queue limiter only global slots count.
    free = Slots(Limiter(2), None)
    assert free.grant(3, 1) == 2
    assert free.global_limiter.free == 0


async def test_drained_can_leave_out_the_slots_of_runs_not_waited_for() -> None:
    """A stopping worker waits for its running tasks, not for the threads abandoned at
    their hard timeout, which keep their slots (maybe for ever): ``drained(kept=...)``
    returns once only those are taken, also when a run is abandoned (a ``wake``, no
    release) while it waits."""
    limiter = Limiter(4)
    assert limiter.take(3) == 3
    abandoned = [1]  # one of the three runs was abandoned
    waiting = asyncio.ensure_future(limiter.drained(lambda: len(abandoned)))
    await asyncio.sleep(0)
    limiter.release(1)
    await asyncio.sleep(0)
    assert not waiting.done()  # 2 taken, 1 of them abandoned: one run still going
    abandoned.append(1)  # the last running one passes its hard timeout
    limiter.wake()
    await asyncio.wait_for(waiting, 10)
    assert limiter.in_use == 2
    # Without ``kept`` every slot must come back.
    everything = asyncio.ensure_future(limiter.drained())
    await asyncio.sleep(0)
    assert not everything.done()
    limiter.release(2)
    await asyncio.wait_for(everything, 10)


async def test_a_release_wakes_every_reserve_parked_on_a_full_limiter() -> None:
    """A release sets the limiter's event only while a waiter is parked on it (a release per
    task): two fetch loops waiting on one full global limiter both wake, take what is free,
    and the one that found none waits again until the next release."""
    g = Limiter(2)
    a, b = Slots(g, None), Slots(g, Limiter(5))
    assert a.take(2) == 2
    first = asyncio.ensure_future(a.reserve(1))
    second = asyncio.ensure_future(b.reserve(1))
    await asyncio.sleep(0)
    assert not first.done()
    assert not second.done()
    a.release(1)  # one slot: one of the two gets it, the other parks again
    done, pending = await asyncio.wait({first, second}, timeout=10, return_when="FIRST_COMPLETED")
    assert len(done) == 1
    assert g.free == 0
    await asyncio.sleep(0)
    assert not pending.pop().done()
    g.release(1)  # a bare Limiter's release also wakes it
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    assert g.free == 0
    # Nobody waits: releases only count.
    a.release(1)
    b.release(1)
    assert g.free == 2
    assert b.queue_limiter is not None
    assert b.queue_limiter.free == 5
