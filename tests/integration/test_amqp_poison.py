"""A crash-looping poison task on RabbitMQ does not re-run the tasks fetched with it.

A worker *process* (``blitzq worker --no-supervise``, restarted by the test each time it
dies) fetches one poison task with good ones. The poison task waits until the good tasks'
completions are committed in Redis, then ends the process at once (``os._exit``, from a
thread, so the event loop gets no turn to send the acks it queued after the commit): RabbitMQ
redelivers everything the process held unacked. The redelivered good tasks are acked
without running again (their records show them finished, ``broker/amqp/redelivered.py``);
the poison one crashes each delivery until RabbitMQ dead-letters it (``max_deliveries``).
Each good task ran exactly once (counted in Redis by the task itself).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import redis

from blitzq import Queue
from blitzq.worker.solo import solo_plan
from tests.amqp_server import amqp_or_skip, delete_amqp_queues

pytestmark = pytest.mark.timeout(240)

GOOD = 6
MAX_DELIVERIES = 3

APP = """
import os, time
import redis
from blitzq import Queue

queue = Queue(
    "poison",
    redis_url=os.environ["POISON_REDIS"],
    namespace=os.environ["POISON_NS"],
    amqp_url=os.environ["POISON_AMQP"],
    max_deliveries={max_deliveries},
    visibility_timeout=3,  # a maintenance round (dead letters drained) every second
)
client = redis.Redis.from_url(os.environ["POISON_REDIS"])
RUNS = os.environ["POISON_NS"] + "-runs"


@queue.task(name="poison.good")
async def good(i: int) -> int:
    client.hincrby(RUNS, str(i), 1)
    return i


@queue.task(name="poison.crash", executor="thread", retries=0)
def crash(ids: list[str]) -> None:
    client.hincrby(RUNS, "crash", 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until every good completion is committed
        states = [queue.inspect_sync(i) for i in ids]
        if all(s is not None and s.state.is_final for s in states):
            break
    os._exit(1)
"""


def _worker(app_dir: Path, env: dict[str, str], concurrency: int = 8) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "blitzq", "worker", "app:queue", "--no-supervise"]
    cmd += ["-c", str(concurrency)]
    return subprocess.Popen(
        cmd, cwd=app_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


async def test_a_poison_task_crashing_its_worker_does_not_rerun_the_good_ones(
    tmp_path: Path, server_url: str, namespace: str
) -> None:
    url = amqp_or_skip()
    (tmp_path / "app.py").write_text(textwrap.dedent(APP).format(max_deliveries=MAX_DELIVERIES))
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env.update(
        POISON_REDIS=server_url,
        POISON_NS=namespace,
        POISON_AMQP=url,
        PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
    )
    producer = Queue(
        "poison",
        redis_url=server_url,
        namespace=namespace,
        amqp_url=url,
        max_deliveries=MAX_DELIVERIES,
    )
    good = producer.task(name="poison.good")(_stand_in)
    crash = producer.task(name="poison.crash")(_stand_in)
    client = redis.Redis.from_url(server_url)
    runs = namespace + "-runs"
    logs: list[str] = []
    try:
        handles = [
            await good.options(task_id=f"{namespace}-good-{i}").enqueue(i) for i in range(GOOD)
        ]
        poison = await crash.enqueue([h.id for h in handles])
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
        assert counts.pop("crash") == MAX_DELIVERIES
        assert counts == {str(i): 1 for i in range(GOOD)}, "\n".join(logs)[-5000:]
        for h in handles:
            assert await h.result(timeout=10) == int(h.id.rsplit("-", 1)[1])
    finally:
        client.delete(runs)
        client.close()
        await producer.broker.prepare_consumer(["poison"], "cleanup")
        await delete_amqp_queues(url, [producer.broker])
        await producer.close()


async def _stand_in(*_args: object) -> None:  # the producer's name for the task
    return None


BYSTANDERS_APP = """
import asyncio, os, time
import redis
from blitzq import Queue

queue = Queue(
    "bystanders",
    redis_url=os.environ["POISON_REDIS"],
    namespace=os.environ["POISON_NS"],
    amqp_url=os.environ["POISON_AMQP"],
    max_deliveries={max_deliveries},
    visibility_timeout=3,
)
client = redis.Redis.from_url(os.environ["POISON_REDIS"])
RUNS = os.environ["POISON_NS"] + "-runs"


@queue.task(name="bystanders.good")
async def good(i: int) -> int:
    client.hincrby(RUNS, str(i), 1)
    await asyncio.sleep(0.3)
    return i


@queue.task(name="bystanders.crash", executor="thread", retries=0)
def crash(i: int) -> None:
    client.hincrby(RUNS, "crash" + str(i), 1)
    time.sleep(0.1)
    os._exit(1)
"""


@pytest.mark.parametrize("poisons", [1, 3])
async def test_poison_tasks_dead_letter_only_themselves(
    tmp_path: Path, server_url: str, namespace: str, poisons: int
) -> None:
    """Poison tasks enqueued first, then good ones, one worker process of concurrency 4
    (restarted by the test each time it dies): the good tasks running beside a poison task
    or prefetched die with its process, and RabbitMQ counts a return for each. Only the solo
    runs of a redelivered task count against it (worker/solo.py): every good task succeeds,
    the poison tasks alone are dead-lettered, each after at most ``max_deliveries`` runs."""
    url = amqp_or_skip()
    app = textwrap.dedent(BYSTANDERS_APP).format(max_deliveries=MAX_DELIVERIES)
    (tmp_path / "app.py").write_text(app)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env.update(
        POISON_REDIS=server_url,
        POISON_NS=namespace,
        POISON_AMQP=url,
        PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
    )
    producer = Queue(
        "bystanders",
        redis_url=server_url,
        namespace=namespace,
        amqp_url=url,
        max_deliveries=MAX_DELIVERIES,
    )
    good = producer.task(name="bystanders.good")(_stand_in)
    crash = producer.task(name="bystanders.crash")(_stand_in)
    client = redis.Redis.from_url(server_url)
    runs = namespace + "-runs"
    logs: list[str] = []
    try:
        bad = [await crash.enqueue(i) for i in range(poisons)]
        handles = [await good.enqueue(i) for i in range(20)]
        ids = [h.id for h in bad + handles]
        deadline = time.monotonic() + 200
        proc = _worker(tmp_path, env, concurrency=4)
        try:
            while True:  # restart the worker each time it dies, until every task is final
                records = [await producer.inspect(i) for i in ids]
                if all(r is not None and r.state.is_final for r in records):
                    break
                assert time.monotonic() < deadline, "\n".join(logs)[-5000:]
                if proc.poll() is not None:
                    logs.append(proc.communicate()[0].decode(errors="replace"))
                    assert proc.returncode == 1, logs[-1]  # a poison task's os._exit
                    proc = _worker(tmp_path, env, concurrency=4)
                await asyncio.sleep(0.1)
        finally:
            proc.terminate()
            logs.append(proc.communicate(timeout=30)[0].decode(errors="replace"))
        for i, h in enumerate(handles):
            assert await h.result(timeout=10) == i, "\n".join(logs)[-5000:]
        counts = {k.decode(): int(v) for k, v in client.hgetall(runs).items()}
        for i, h in enumerate(bad):
            record = await producer.inspect(h.id)
            assert record is not None
            assert record.state.value == "dead_lettered"
            assert record.error_type == "MaxDeliveriesExceeded"
            # Its solo runs all ran; its runs beside others may not have started.
            assert solo_plan(MAX_DELIVERIES)[1] <= counts[f"crash{i}"] <= MAX_DELIVERIES
        assert {d.id for d in await producer.dead_letters()} == {h.id for h in bad}
    finally:
        client.delete(runs)
        client.close()
        await producer.broker.prepare_consumer(["bystanders"], "cleanup")
        await delete_amqp_queues(url, [producer.broker])
        await producer.close()
