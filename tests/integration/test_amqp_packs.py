"""Packs on RabbitMQ (``broker/amqp/packs.py``): a bulk publish puts several tasks in one
AMQP message; each task still runs, completes, is handed back or dead-lettered on its own.
The dead-letter drain's check of committed tasks is tested here for plain messages too.

On the shared RabbitMQ (skipped when it does not answer) with the state on the test Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from blitzq import ConfigurationError, Queue, records
from blitzq.broker import Broker, Completion
from blitzq.broker.amqp.packs import PACK_HEADER
from blitzq.serialization import Envelope, decode_envelope, encode_envelope
from tests.amqp_server import amqp_brokers, amqp_or_skip, delete_amqp_queues

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(120)


def message(task_id: str, queue: str = "q") -> bytes:
    """An encoded message of a task nobody runs (transport-level tests)."""
    return encode_envelope(Envelope(task_id, "tests.amqp.noop", queue, []), 1 << 20)


def task_id(payload: bytes) -> str:
    return decode_envelope(payload).id


@pytest.fixture
async def amqp(server_url: str, namespace: str) -> AsyncIterator[Callable[..., Broker]]:
    """Factory of AmqpBrokers (``query``: appended to the AMQP URL); their RabbitMQ queues
    are deleted afterwards."""
    async with amqp_brokers(server_url, namespace) as factory:
        yield factory


async def fetch_all(broker: Broker, queue: str, count: int, step: int = 50) -> list[Any]:
    got: list[Any] = []
    while len(got) < count:
        got += await broker.fetch(queue, min(step, count - len(got)), 10)
    return got


async def test_a_bulk_publish_travels_in_packs_and_each_task_is_a_delivery(
    amqp: Callable[..., Broker],
) -> None:
    broker = amqp()
    bodies = [message(f"m{i}") for i in range(256)]
    await broker.publish("pk", bodies)  # 256 // 64: packs of 4
    # The queue's count is of AMQP messages (docs/operations.md): 64 packs.
    assert (await broker.queue_stats(["pk"]))["pk"]["waiting"] == 64
    got = await fetch_all(broker, "pk", 256)
    assert sorted(d.payload for d in got) == sorted(bodies)
    assert all(d.deliveries == 1 for d in got)
    assert len({d.token for d in got}) == 256
    stats = (await broker.queue_stats(["pk"]))["pk"]
    assert stats["in_flight"] == 256
    await broker.complete([Completion("pk", d.token, task_id(d.payload)) for d in got])
    assert (await broker.queue_stats(["pk"]))["pk"] == {"waiting": 0, "in_flight": 0}
    assert await broker.fetch("pk", 1, 0) == []


async def test_pack_1_publishes_one_message_per_task(amqp: Callable[..., Broker]) -> None:
    broker = amqp("?pack=1")
    bodies = [message(f"s{i}") for i in range(200)]
    await broker.publish("single", bodies)
    assert (await broker.queue_stats(["single"]))["single"]["waiting"] == 200
    got = await fetch_all(broker, "single", 200)
    # Oldest first, but not strictly: a get answered while RabbitMQ pushes the prefetch
    # can overtake it (Consumer.top_up), so each task is asserted delivered once.
    assert sorted(d.payload for d in got) == sorted(bodies)
    assert all(d.deliveries == 1 for d in got)
    assert len({d.token for d in got}) == 200
    held = broker.transport.held  # type: ignore[attr-defined]
    assert all(PACK_HEADER not in (h.message.headers or {}) for h in held.values())


async def test_a_bad_pack_option_is_refused_where_it_is_given(
    server_url: str, namespace: str
) -> None:
    url = amqp_or_skip()
    for bad in ("0", "x", "100000"):
        with pytest.raises(ConfigurationError, match="pack="):
            Queue("pk", redis_url=server_url, namespace=namespace, amqp_url=f"{url}?pack={bad}")


async def test_a_redelivered_pack_skips_its_committed_tasks_and_splits_the_rest(
    amqp: Callable[..., Broker],
) -> None:
    first, second = amqp(prefetch=1), amqp()
    bodies = [message(f"r{i}") for i in range(128)]
    await first.publish("redo", bodies)  # packs of 2
    d0, d1 = await fetch_all(first, "redo", 2)
    assert {task_id(d0.payload), task_id(d1.payload)} == {"r0", "r1"}
    done = records.succeeded("r0", "tests.amqp.noop", "redo", 1, 0.0, 0.0, "w")
    r0 = d0 if task_id(d0.payload) == "r0" else d1
    await first.complete([Completion("redo", r0.token, "r0", record=done, record_ttl=600)])
    await first.transport.link.close()  # r1 not done: the pack was not acked
    got = await fetch_all(second, "redo", 127)
    ids = [task_id(d.payload) for d in got]
    assert sorted(ids) == sorted(f"r{i}" for i in range(1, 128))  # r0 is not run again
    by_id = {task_id(d.payload): d for d in got}
    assert by_id["r1"].deliveries == 2  # published again alone, its delivery counted


async def test_a_dead_lettered_pack_leaves_a_dead_letter_per_task_not_committed(
    amqp: Callable[..., Broker],
) -> None:
    broker = amqp(max_deliveries=1)
    holder = amqp(max_deliveries=1, prefetch=1)
    await broker.publish("dead", [message(f"p{i}") for i in range(128)])
    d0, d1 = await fetch_all(holder, "dead", 2)
    first = d0 if task_id(d0.payload) == "p0" else d1
    done = records.succeeded("p0", "tests.amqp.noop", "dead", 1, 0.0, 0.0, "w")
    await holder.complete([Completion("dead", first.token, "p0", record=done, record_ttl=600)])
    await holder.transport.link.close()  # returned once: past the limit, dead-lettered

    async def drained() -> Any:  # a worker's maintenance round drains RabbitMQ's dead letters
        await broker.recover("dead", 60, 100, 1, 60)
        return await broker.get_dead_letter("p1")

    fields = await eventually(drained, lambda f: f is not None, 30)
    assert fields.reason == "max deliveries exceeded"
    assert fields.queue == "dead"
    assert decode_envelope(fields.message).id == "p1"
    assert await broker.get_dead_letter("p0") is None  # committed: not a dead letter


async def test_a_committed_task_whose_ack_was_lost_is_never_dead_lettered(
    amqp: Callable[..., Broker],
) -> None:
    """A plain message whose completion was committed in Redis but whose ack RabbitMQ never
    read (the channel closed first) is returned, past ``x-delivery-limit``, and
    dead-lettered by RabbitMQ: the drain acks it without a dead letter, the record stays
    ``succeeded``; a task not committed is a dead letter as before."""
    broker = amqp("?pack=1", max_deliveries=1)
    holder = amqp(max_deliveries=1, prefetch=2)
    await broker.publish("lost", [message("c0", "lost"), message("c1", "lost")])
    got = await fetch_all(holder, "lost", 2)
    assert {task_id(d.payload) for d in got} == {"c0", "c1"}
    done = records.succeeded("c0", "tests.amqp.noop", "lost", 1, 0.0, 0.0, "w")
    await holder.state.complete([Completion("lost", None, "c0", record=done, record_ttl=600)])
    await holder.transport.link.close()  # the ack is lost: both returned past the limit

    moved = 0

    async def drained() -> int:  # a worker's maintenance round drains RabbitMQ's dead letters
        nonlocal moved
        moved += (await broker.recover("lost", 60, 100, 1, 60))[1]  # messages drained
        return moved

    await eventually(drained, lambda n: n >= 2, 30)  # both messages went through the drain
    assert moved == 2
    assert await broker.get_dead_letter("c1") is not None
    assert await broker.get_dead_letter("c0") is None  # committed: not a dead letter
    assert await broker.get_record("c0") == done
    assert (await broker.queue_stats(["lost"]))["lost"] == {"waiting": 0, "in_flight": 0}


async def test_the_tasks_of_a_pack_in_custody_let_the_pack_be_acked(
    amqp: Callable[..., Broker],
) -> None:
    broker = amqp(prefetch=1)
    await broker.publish("kept", [message(f"k{i}") for i in range(128)])  # packs of 2
    d0, d1 = await fetch_all(broker, "kept", 2)
    transport: Any = broker.transport
    tokens = [d0.token, d1.token]
    tag = transport.held[d0.token].message.tag  # the pack's delivery tag (d1's too)

    # Both run long (heartbeated): handed to custody once held over min_idle. min_idle is
    # also the custody lease: long enough that the same round's recovery never finds the
    # lease just written already lapsed on a busy machine.
    async def handed() -> list[str]:
        await broker.heartbeat("kept", tokens)  # type: ignore[arg-type]
        await broker.recover("kept", 2.0, 100, 5, 60)
        return [getattr(transport.held.get(t), "state", "gone") for t in tokens]

    assert await eventually(handed, lambda states: "held" not in states, 30) == [
        "custody",
        "custody",
    ]
    # Each task handed over settled its share of the pack: the message is acked.
    assert tag not in transport.consumers["kept"].unacked
    await broker.complete([Completion("kept", d1.token, task_id(d1.payload))])
    await transport.link.close()  # nothing of the pack is put back
    other = amqp()
    rest = await fetch_all(other, "kept", 126)
    assert {task_id(d.payload) for d in rest} == {f"k{i}" for i in range(2, 128)}
    assert await other.fetch("kept", 1, 0.2) == []


@pytest.fixture
async def queue(amqp: Callable[..., Broker]) -> AsyncIterator[Queue]:
    """A Queue ``pq`` on an AmqpBroker (visibility timeout 5 s)."""
    q = Queue("pq", broker=amqp(), visibility_timeout=5.0)
    yield q
    await q.close()


async def test_packed_tasks_each_run_once_within_the_concurrency(queue: Queue) -> None:
    runs: dict[int, int] = {}
    active = peak = 0

    @queue.task(name="packs.work")
    async def work(i: int) -> int:
        nonlocal active, peak
        runs[i] = runs.get(i, 0) + 1
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0)
        active -= 1
        return i * 2

    handles = await work.enqueue_many((i,) for i in range(512))  # packs of 8
    async with running(make_worker(queue, concurrency=3)):
        results = [await h.result(timeout=60) for h in handles]
    assert results == [i * 2 for i in range(512)]
    assert runs == dict.fromkeys(range(512), 1)
    assert 1 <= peak <= 3  # a pack of 8 never starts more than the worker's 3 slots
    assert (await queue.broker.queue_stats(["pq"]))["pq"] == {"waiting": 0, "in_flight": 0}


async def test_a_cancelled_task_of_a_pack_is_skipped_and_the_others_run(queue: Queue) -> None:
    runs: dict[int, int] = {}

    @queue.task(name="packs.count")
    async def count(i: int) -> int:
        runs[i] = runs.get(i, 0) + 1
        return i

    handles = await count.enqueue_many((i,) for i in range(256))  # packs of 4
    await queue.cancel(handles[1].id)  # queued: marked revoked, every worker skips it
    async with running(make_worker(queue, concurrency=4)):
        for i, h in enumerate(handles):
            if i != 1:
                assert await h.result(timeout=60) == i
        status = await handles[1].status()
        assert status is not None
        assert status.state.value == "cancelled"
        await eventually(
            lambda: queue.broker.queue_stats(["pq"]),
            lambda s: s["pq"] == {"waiting": 0, "in_flight": 0},
            30,
        )
    assert 1 not in runs
    assert runs == {i: 1 for i in range(256) if i != 1}


async def test_a_shutdown_mid_pack_loses_nothing_and_reruns_nothing_committed(
    queue: Queue,
) -> None:
    runs: dict[int, int] = {}
    gate = asyncio.Event()
    started = asyncio.Event()

    @queue.task(name="packs.gated")
    async def gated(i: int) -> int:
        runs[i] = runs.get(i, 0) + 1
        if len(runs) >= 3:
            started.set()
        if runs[i] == 1 and len(runs) <= 3:
            await gate.wait()
        return i

    handles = await gated.enqueue_many((i,) for i in range(256))  # packs of 4
    worker = make_worker(queue, concurrency=3, shutdown_timeout=30)
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 30)
    # Three tasks of the first pack run; the fourth and the rest wait in the consumer.
    worker.stop()
    await asyncio.sleep(0)
    gate.set()  # the running ones complete during the shutdown; the others are handed back
    await asyncio.wait_for(task, 60)
    ran_first = dict(runs)
    assert ran_first
    assert all(n == 1 for n in ran_first.values())
    async with running(make_worker(queue, concurrency=4)):
        results = [await h.result(timeout=60) for h in handles]
    assert results == list(range(256))
    assert runs == dict.fromkeys(range(256), 1)  # nothing lost, nothing committed ran again


POISON_APP = """
import os, time
import redis
from blitzq import Queue

queue = Queue(
    "pp",
    redis_url=os.environ["PACK_REDIS"],
    namespace=os.environ["PACK_NS"],
    amqp_url=os.environ["PACK_AMQP"],
    max_deliveries=3,
    visibility_timeout=3,  # a maintenance round (dead letters drained) every second
)
client = redis.Redis.from_url(os.environ["PACK_REDIS"])
RUNS = os.environ["PACK_NS"] + "-runs"


@queue.task(name="packs.good")
async def good(i: int) -> int:
    client.hincrby(RUNS, str(i), 1)
    return i


@queue.task(name="packs.crash", executor="thread", retries=0)
def crash(ids: list[str]) -> None:
    client.hincrby(RUNS, "crash", 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until every good completion is committed
        states = [queue.inspect_sync(i) for i in ids]
        if all(s is not None and s.state.is_final for s in states):
            break
    os._exit(1)
"""


GOOD = 255  # with the poison: 256 tasks, packs of 4


def _worker(app_dir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "blitzq", "worker", "app:queue", "--no-supervise", "-c", "8"]
    return subprocess.Popen(
        cmd, cwd=app_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


@pytest.mark.timeout(240)
async def test_a_poison_task_in_a_pack_is_dead_lettered_and_its_pack_runs_once(
    tmp_path: Path, server_url: str, namespace: str
) -> None:
    """The poison task ends its worker process (``os._exit``, from a thread: the acks queued
    after the good tasks' commits are never sent) once the good tasks are committed; RabbitMQ
    delivers its pack again, which is split (the committed tasks dropped, the poison one
    published alone), and the poison one crashes until it is dead-lettered. Each good task
    ran once (counted in Redis by the task itself)."""
    url = amqp_or_skip()
    (tmp_path / "app.py").write_text(textwrap.dedent(POISON_APP))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env.update(
        PACK_REDIS=server_url,
        PACK_NS=namespace,
        PACK_AMQP=url,
        PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
    )
    producer = Queue(
        "pp", redis_url=server_url, namespace=namespace, amqp_url=url, max_deliveries=3
    )
    producer.task(name="packs.good")(_stand_in)
    producer.task(name="packs.crash")(_stand_in)
    client = redis.Redis.from_url(server_url)
    runs = namespace + "-runs"
    logs: list[str] = []
    try:
        ids = [f"{namespace}-good-{i}" for i in range(GOOD)]
        items: list[Any] = [("packs.good", (i,), None, {"task_id": ids[i]}) for i in range(GOOD)]
        items.append(("packs.crash", (ids,), None))  # the last pack: 3 good ones and it
        *handles, poison = await producer.send_many(items)
        assert (await producer.broker.queue_stats(["pp"]))["pp"]["waiting"] == 64
        deadline = time.monotonic() + 180
        proc = _worker(tmp_path, env)
        try:
            while True:  # restart the worker each time it dies, until the poison is dead
                record = await producer.inspect(poison.id)
                if record is not None and record.state.value == "dead_lettered":
                    break
                assert time.monotonic() < deadline, "\n".join(logs)[-5000:]
                if proc.poll() is not None:
                    logs.append(proc.communicate()[0].decode(errors="replace"))
                    assert proc.returncode == 1, logs[-1]  # the poison task's os._exit
                    proc = _worker(tmp_path, env)
                await asyncio.sleep(0.1)
        finally:
            proc.terminate()
            logs.append(proc.communicate(timeout=30)[0].decode(errors="replace"))
        counts = {k.decode(): int(v) for k, v in client.hgetall(runs).items()}
        assert counts.pop("crash") == 3  # max_deliveries
        assert counts == {str(i): 1 for i in range(GOOD)}, "\n".join(logs)[-5000:]
        assert any("delivered again" in log for log in logs)  # the pack was split
        for i, h in enumerate(handles):
            assert await h.result(timeout=10) == i
        dead = await producer.broker.get_dead_letter(poison.id)
        assert dead is not None
    finally:
        client.delete(runs)
        client.close()
        await producer.broker.prepare_consumer(["pp"], "cleanup")
        await delete_amqp_queues(url, [producer.broker])
        await producer.close()


async def _stand_in(*_args: object) -> None:  # the producer's name for the task
    return None


async def test_queue_stats_say_a_ready_pack_counts_once(
    amqp: Callable[..., Broker], server_url: str, namespace: str
) -> None:
    """RabbitMQ tells only how many AMQP messages are ready: ``waiting`` counts a ready
    pack once, and ``blitzq queue stats`` says so under its table and in its JSON
    (``count_note``), as ``purge`` does under its count."""
    from click.testing import CliRunner

    from blitzq.cli import cli

    broker = amqp()
    assert broker.count_note is not None
    assert "pack" in broker.count_note
    await broker.publish("note", [message(f"n{i}", "note") for i in range(256)])  # 64 packs
    base = ["--redis-url", server_url, "--namespace", namespace, "--amqp-url", amqp_or_skip()]

    def stats(*extra: str) -> Any:
        return CliRunner().invoke(cli, [*base, *extra, "queue", "stats", "-Q", "note"])

    result = await asyncio.to_thread(stats)
    assert result.exit_code == 0, result.output
    assert "a pack" in " ".join(result.output.split())
    result = await asyncio.to_thread(stats, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["queues"]["note"] == {"waiting": 64, "in_flight": 0}
    assert doc["count_note"] == broker.count_note
