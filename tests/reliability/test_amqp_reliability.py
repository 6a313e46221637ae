"""The reliability invariants on the RabbitMQ transport (``BLITZQ_AMQP_URL`` set for the
test process and its worker subprocesses; state on the test Redis): a SIGKILLed worker's
unacked deliveries come back, a task that kills its worker every time is dead-lettered
after ``max_deliveries``, a message that is not a blitzq envelope is dead-lettered as
malformed while the worker goes on, a SIGTERM mid-run loses nothing, and a worker stalled
past the heartbeat writes nothing for the deliveries RabbitMQ took back (fencing).

Skipped when the shared RabbitMQ does not answer. The RabbitMQ queues of the test's
namespace are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator

import aio_pika
import pytest

from blitzq import Queue, TaskFailed
from blitzq.broker.amqp.channels import DEAD_LETTER_SUFFIX, AmqpLink
from tests.amqp_server import amqp_or_skip
from tests.broker_kinds import is_amqp
from tests.polling import wait_until

from .conftest import Harness
from .reliability_app import BLOCKING, POISON, SLOWFAIL, WORK
from .test_poison import MAX_DELIVERIES, VT, _supervise

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def amqp(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The shared RabbitMQ's URL, set as ``BLITZQ_AMQP_URL`` for the harness's queues and
    workers; afterwards the workers are killed and the namespace's RabbitMQ queues deleted."""
    url = amqp_or_skip()
    monkeypatch.setenv("BLITZQ_AMQP_URL", url)
    harness.env["BLITZQ_AMQP_URL"] = url
    yield url
    for w in harness.workers:
        if w.alive():
            w.kill()
    queues = ("default", "default:high", "default:low", DEAD_LETTER_SUFFIX)  # every level
    names = [f"{harness.namespace}.{q}" for q in queues]
    asyncio.run(_delete(url, names))


async def _delete(url: str, names: list[str]) -> None:
    link = AmqpLink(url, "cleanup", 1)
    try:
        await link.delete(names)
    finally:
        await link.close()


def _queue(harness: Harness, max_deliveries: int = 5) -> Queue:
    """The suite's Queue, checked to be on the RabbitMQ transport."""
    queue = harness.queue(vt=VT, max_deliveries=max_deliveries)
    assert is_amqp(asyncio.run(_broker_of(queue)))
    return queue


async def _broker_of(queue: Queue) -> object:
    broker = queue.broker
    await broker.close()
    return broker


def _all_succeeded(harness: Harness, ids: list[str]) -> None:
    states = harness.states(ids)
    bad = {i: r and r.state for i, r in states.items() if r is None or r.state != "succeeded"}
    assert not bad, bad


def test_a_sigkilled_workers_deliveries_come_back(harness: Harness, amqp: str) -> None:
    queue = _queue(harness)
    first = harness.spawn(concurrency=4, vt=VT)
    ids = [f"k{i}" for i in range(20)]
    harness.enqueue(queue, WORK, [(i, 0.3) for i in ids])
    wait_until(lambda: len(harness.runs()) >= 4, 30, "the first worker runs tasks")
    first.kill()  # SIGKILL: its unacked deliveries go back to the quorum queue
    harness.spawn(concurrency=4, vt=VT)
    wait_until(lambda: harness.all_final(ids), 60, "every task is final")
    _all_succeeded(harness, ids)
    assert set(harness.done()) == set(ids)


def test_a_task_killing_its_worker_is_dead_lettered(harness: Harness, amqp: str) -> None:
    queue = _queue(harness, MAX_DELIVERIES)
    workers = [harness.spawn(concurrency=2, vt=VT, max_deliveries=MAX_DELIVERIES)]
    before = [f"b{i}" for i in range(10)]
    harness.enqueue(queue, WORK, [(label, 0.02) for label in before])
    handle = queue.tasks[POISON].options(task_id="poison").enqueue_sync("poison", 0.3)
    _supervise(harness, workers, ["poison", *before], timeout=60.0)
    assert harness.runs()["poison"] == MAX_DELIVERIES
    with pytest.raises(TaskFailed) as info:
        handle.result_sync(timeout=1.0)
    assert info.value.state == "dead_lettered"
    letters = {d.id: d for d in queue.dead_letters_sync()}
    assert letters["poison"].reason == "max deliveries exceeded"
    assert letters["poison"].task == POISON
    _all_succeeded(harness, before)
    after = [f"a{i}" for i in range(10)]
    harness.enqueue(queue, WORK, [(label, 0.02) for label in after])
    _supervise(harness, workers, after, timeout=30.0)
    _all_succeeded(harness, after)
    assert harness.runs()["poison"] == MAX_DELIVERIES  # never ran again


def test_a_malformed_message_is_dead_lettered_and_the_worker_goes_on(
    harness: Harness, amqp: str
) -> None:
    queue = _queue(harness)
    worker = harness.spawn(concurrency=2, vt=VT)
    harness.enqueue(queue, WORK, [("m0", 0.01)])  # declares the RabbitMQ queue
    wait_until(lambda: harness.all_final(["m0"]), 30, "the first task is final")
    asyncio.run(_publish_raw(amqp, f"{harness.namespace}.default", b"not an envelope"))
    wait_until(
        lambda: any(d.reason == "malformed message" for d in queue.dead_letters_sync()),
        30,
        "the malformed message is dead-lettered",
    )
    harness.enqueue(queue, WORK, [("m1", 0.01)])
    wait_until(lambda: harness.all_final(["m1"]), 30, "a task after it is final")
    _all_succeeded(harness, ["m0", "m1"])
    assert worker.alive()


async def _publish_raw(url: str, queue: str, body: bytes) -> None:
    conn = await aio_pika.connect(url)
    try:
        channel = await conn.channel()
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await channel.default_exchange.publish(message, routing_key=queue)
    finally:
        await conn.close()


def test_sigterm_mid_run_loses_nothing(harness: Harness, amqp: str) -> None:
    queue = _queue(harness)
    first = harness.spawn(concurrency=4, vt=VT, shutdown_timeout=5.0)
    ids = [f"t{i}" for i in range(20)]
    harness.enqueue(queue, WORK, [(i, 0.3) for i in ids])
    wait_until(lambda: len(harness.runs()) >= 4, 30, "the worker runs tasks")
    first.signal(signal.SIGTERM)
    assert first.wait(30) == 0  # a graceful stop
    harness.spawn(concurrency=4, vt=VT)
    wait_until(lambda: harness.all_final(ids), 60, "every task is final")
    _all_succeeded(harness, ids)


def test_a_paused_workers_delivery_comes_back_after_about_the_visibility_timeout(
    harness: Harness, amqp: str
) -> None:
    """A worker frozen (SIGSTOP) while it holds a task sends no AMQP heartbeats: RabbitMQ
    closes its connection after two to three heartbeat timeouts (a third of the visibility
    timeout each, at least 2 s) and redelivers the task to another worker; once resumed, the
    frozen worker finishes its own run, connects again and goes on (its log says so in one
    line, without a traceback). Nothing is lost, the record ends succeeded. With aio-pika's
    60 s heartbeat the redelivery takes some 3 min."""
    vt = 4.0
    queue = harness.queue(vt=vt)
    paused = harness.spawn(concurrency=1, vt=vt)
    harness.enqueue(queue, WORK, [("p0", 2.0)])
    wait_until(lambda: harness.runs().get("p0") == 1, 30, "the first worker starts p0")
    paused.signal(signal.SIGSTOP)
    try:
        other = harness.spawn(concurrency=2, vt=vt)
        ids = [f"o{i}" for i in range(6)]
        harness.enqueue(queue, WORK, [(i, 0.05) for i in ids])
        wait_until(lambda: harness.runs().get("p0") == 2, 40, "another worker runs p0")
        assert harness.pids()["p0"] == other.pid
        wait_until(lambda: harness.all_final(["p0", *ids]), 30, "every task is final")
    finally:
        paused.signal(signal.SIGCONT)
    wait_until(lambda: harness.done().get("p0") == 2, 30, "the resumed worker ends its run")
    other.kill()  # the resumed worker alone must take what comes next
    after = [f"a{i}" for i in range(4)]
    harness.enqueue(queue, WORK, [(i, 0.05) for i in after])
    wait_until(lambda: harness.all_final(after), 40, "the resumed worker runs new tasks")
    _all_succeeded(harness, ["p0", *ids, *after])
    assert paused.alive()
    assert {harness.pids()[i] for i in after} == {paused.pid}
    # An expected loss: one line saying so (and that it connects again), no traceback.
    log = paused.log.read_text(errors="replace")
    assert "Traceback" not in log, log
    assert "lost connection" in log or "gave up connection" in log
    assert "connecting again" in log


def test_a_responsive_worker_is_not_cut_off_by_the_short_heartbeat(
    harness: Harness, amqp: str
) -> None:
    """With a 4 s visibility timeout (a 2 s AMQP heartbeat, the least), tasks running
    several heartbeat timeouts -- in a thread and on the event loop -- run once: the event
    loop keeps answering RabbitMQ's heartbeats."""
    vt = 4.0
    queue = harness.queue(vt=vt)
    harness.spawn(concurrency=2, vt=vt)
    harness.enqueue(queue, BLOCKING, [("thread", 9.0)])
    harness.enqueue(queue, WORK, [("loop", 9.0)])
    wait_until(lambda: harness.all_final(["thread", "loop"]), 60, "both tasks are final")
    _all_succeeded(harness, ["thread", "loop"])
    assert harness.runs() == {"thread": 1, "loop": 1}


def test_a_stalled_workers_late_completion_is_fenced(harness: Harness, amqp: str) -> None:
    """A worker SIGSTOPped past the AMQP heartbeat (2 s: ``vt`` 4) while it runs a failing
    task with one retry loses its channel; RabbitMQ delivers the task (and the one its
    consumer had prefetched) to another worker, which runs it as attempt 2 and dead-letters
    it. Once resumed, the stalled worker's run ends in a retry that must write nothing: no
    retry on the schedule (a third run), no record over the other's; the completion is
    counted in ``stale_completions`` and logged. Every record says ``attempts`` <= 2."""
    vt = 4.0
    queue = harness.queue(vt=vt)
    stalled = harness.spawn(concurrency=1, vt=vt)
    ids = ["s0", "s1"]  # s1 waits in the stalled worker's prefetch
    harness.enqueue(queue, SLOWFAIL, [(i, 3.0) for i in ids])
    wait_until(lambda: harness.runs().get("s0") == 1, 30, "the first worker starts s0")
    assert harness.pids()["s0"] == stalled.pid
    stalled.signal(signal.SIGSTOP)
    try:
        other = harness.spawn(concurrency=2, vt=vt)
        wait_until(lambda: harness.all_final(ids), 60, "the other worker ends both tasks")
        assert harness.pids()["s0"] == other.pid
    finally:
        stalled.signal(signal.SIGCONT)
    stats = harness.key("stats")
    wait_until(
        lambda: int(harness.redis.hget(stats, "stale_completions") or 0) >= 1,
        40,
        "the resumed worker's completion of s0 is refused as stale",
    )
    # Nothing of the stale completion was written: no retry waits on the schedule, the
    # records are the other worker's.
    assert harness.redis.zscore(harness.key("sched"), "s0") is None
    assert harness.redis.llen(harness.key("outbox:default")) == 0
    records = harness.states(ids)
    for label, record in records.items():
        assert record is not None, label
        assert record.state == "dead_lettered", (label, record)
        assert record.attempts <= 2, (label, record)
    runs = harness.runs()
    assert runs["s0"] == 2, runs  # the stalled run and the redelivery: no third
    # The prefetched one ran in the other worker; the stalled worker must not start it from
    # its stale buffer (tests/integration/test_amqp_stalled.py), and any run of it there
    # would be fenced as s0's was: at most two runs in any case.
    assert runs["s1"] <= 2, (runs, harness.pids(), stalled.pid)
    assert int(harness.redis.hget(stats, "stale_completions") or 0) == 1
    log = stalled.log.read_text(errors="replace")
    assert "stale completion of task s0" in log, log
    assert "Traceback" not in log, log
