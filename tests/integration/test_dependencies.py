"""Per-worker resources (issue 12, "Dependencies for tasks"): ``@queue.lifespan`` opened once
per worker, given to tasks through ``Depends()`` parameters, closed after the runs; and the
FastAPI dependency that gives endpoints the Queue."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated

import pytest
import redis
from fastapi import FastAPI
from fastapi.testclient import TestClient

from blitzq import ConfigurationError, Depends, Queue, TaskFailed
from blitzq.integrations.asgi import lifespan
from blitzq.integrations.fastapi import QueueDep, get_queue
from tests.polling import wait_until

from .proc_tasks import make_worker, running, worker_thread


@dataclasses.dataclass
class Pool:
    """Stands for a database pool: counts its opens and closes."""

    opened: int = 0
    closed: int = 0
    used: int = 0


class Client:
    """A second resource type."""


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    """A Queue on the test server."""
    q = make_queue()
    yield q
    await q.close()


async def test_lifespan_resources_reach_tasks_once_per_worker(queue: Queue) -> None:
    pool = Pool()
    events: list[str] = []

    @queue.lifespan
    async def database() -> AsyncIterator[Pool]:
        pool.opened += 1
        events.append("open db")
        yield pool
        pool.closed += 1
        events.append("close db")

    @queue.lifespan
    async def http() -> AsyncIterator[Client]:
        events.append("open http")
        yield Client()
        events.append("close http")

    @queue.task(name="di.use")
    async def use(n: int, db: Pool = Depends()) -> int:
        db.used += 1
        return n

    @queue.task(name="di.use_in_thread")
    def use_in_thread(db: Annotated[Pool, Depends()], client: Annotated[Client, Depends()]) -> str:
        db.used += 1
        return type(client).__name__

    async with running(make_worker(queue, concurrency=4)):
        handles = [await use.enqueue(i) for i in range(5)]
        assert [await h.result(timeout=30) for h in handles] == list(range(5))
        assert await (await use_in_thread.enqueue()).result(timeout=30) == "Client"
        assert pool.opened == 1
        assert pool.closed == 0
    assert pool.used == 6
    assert pool.closed == 1
    assert events == ["open db", "open http", "close http", "close db"]


async def test_each_worker_opens_once_however_many_runs_share_it(queue: Queue) -> None:
    """Two tasks x concurrency 3 on each of two workers: all six runs at once, one open per
    worker, every run of a worker holding that worker's resource."""
    pools: list[Pool] = []

    @queue.lifespan
    async def database() -> AsyncIterator[Pool]:
        pool = Pool()
        pools.append(pool)
        pool.opened += 1
        yield pool
        pool.closed += 1

    running_now, all_in = 0, asyncio.Event()

    async def hold(db: Pool) -> int:
        nonlocal running_now
        db.used += 1
        running_now += 1
        if running_now == 6:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 30)  # six at once: each worker's 3 slots busy
        return id(db)

    @queue.task(name="di.first")
    async def first(db: Pool = Depends()) -> int:
        return await hold(db)

    @queue.task(name="di.second")
    async def second(db: Annotated[Pool, Depends()]) -> int:
        return await hold(db)

    workers = [make_worker(queue, concurrency=3), make_worker(queue, concurrency=3)]
    async with running(workers[0]), running(workers[1]):
        handles = [await task.enqueue() for task in (first, second) for _ in range(3)]
        seen = [await h.result(timeout=60) for h in handles]
    assert len(pools) == 2
    assert [p.opened for p in pools] == [1, 1]
    assert [p.closed for p in pools] == [1, 1]
    assert [p.used for p in pools] == [3, 3]
    assert sorted(seen.count(id(p)) for p in pools) == [3, 3]


class ReadPool(Pool):
    """A subclass: matched by an annotation of its base when no exact match exists."""


async def test_the_resource_of_exactly_the_type_else_an_instance_of_it(queue: Queue) -> None:
    exact, derived = Pool(), ReadPool()

    @queue.lifespan
    async def replica() -> AsyncIterator[ReadPool]:
        yield derived

    @queue.lifespan
    async def primary() -> AsyncIterator[Pool]:
        yield exact

    @queue.task(name="di.which")
    async def which(db: Pool = Depends(), read: ReadPool = Depends()) -> list[str]:
        return [
            "exact" if db is exact else "derived",
            "derived" if read is derived else "exact",
        ]

    async with running(make_worker(queue, concurrency=1)):
        assert await (await which.enqueue()).result(timeout=30) == ["exact", "derived"]


async def test_a_base_class_parameter_takes_an_instance_of_a_subclass(queue: Queue) -> None:
    derived = ReadPool()

    @queue.lifespan
    async def replica() -> AsyncIterator[ReadPool]:
        yield derived

    @queue.task(name="di.base")
    async def base(db: Pool = Depends()) -> bool:
        return db is derived

    async with running(make_worker(queue, concurrency=1)):
        assert await (await base.enqueue()).result(timeout=30) is True


async def test_a_value_for_a_depends_parameter_is_refused_at_enqueue(queue: Queue) -> None:
    @queue.task(name="di.refuse")
    async def refuse(n: int, db: Pool = Depends()) -> int:
        return n

    with pytest.raises(ConfigurationError, match="filled by the worker"):
        await refuse.enqueue(1, db=Pool())
    with pytest.raises(ConfigurationError, match="filled by the worker"):
        await refuse.enqueue(1, Pool())


async def test_a_missing_resource_fails_the_task_without_retries(queue: Queue) -> None:
    @queue.task(name="di.missing", retries=3)
    async def missing(db: Pool = Depends()) -> None:
        return None

    async with running(make_worker(queue, concurrency=1)):
        handle = await missing.enqueue()
        with pytest.raises(TaskFailed, match="no lifespan of this Queue yields a Pool"):
            await handle.result(timeout=30)
        record = await queue.inspect(handle.id)
        assert record is not None
        assert record.attempts == 1


def test_bad_declarations_are_refused_at_registration(queue: Queue) -> None:
    with pytest.raises(ConfigurationError, match="process task cannot take Depends"):
        queue.task(name="di.proc", executor="process")(_process_task)
    with pytest.raises(ConfigurationError, match="async generator function"):
        queue.lifespan(_not_a_generator)  # type: ignore[arg-type]


def _process_task(db: Pool = Depends()) -> None:
    return None


async def _not_a_generator() -> Pool:
    return Pool()


def test_fastapi_endpoint_gets_the_queue(queue: Queue) -> None:
    app = FastAPI(lifespan=lifespan(queue))

    @app.get("/namespace")
    async def namespace(q: QueueDep) -> dict[str, str]:
        return {"namespace": q.namespace}

    with TestClient(app) as client:
        assert client.get("/namespace").json() == {"namespace": queue.namespace}
    other = Queue(redis_url="memory://di-override", namespace="override")
    app.dependency_overrides[get_queue] = lambda: other
    with TestClient(app) as client:
        assert client.get("/namespace").json() == {"namespace": "override"}


async def test_a_message_passing_a_depends_parameter_fails_without_retries(queue: Queue) -> None:
    pool = Pool()

    @queue.lifespan
    async def database() -> AsyncIterator[Pool]:
        yield pool

    @queue.task(name="di.sent", retries=3)
    async def sent(db: Pool = Depends()) -> int:
        return db.used

    async with running(make_worker(queue, concurrency=1)):
        handle = await queue.send("di.sent", kwargs={"db": {"used": 99}})
        with pytest.raises(TaskFailed, match="filled by the worker"):
            await handle.result(timeout=30)
        record = await queue.inspect(handle.id)
        assert record is not None
        assert record.attempts == 1


def test_fastapi_endpoint_enqueues_through_the_queue_dependency(
    make_queue: Callable[..., Queue],
) -> None:
    """A user's app: an endpoint takes the Queue as ``QueueDep``, enqueues on the test Redis,
    a worker (with its lifespan resource) runs the task, the endpoint returns its result."""
    queue = make_queue()
    pool = Pool()

    @queue.lifespan
    async def database() -> AsyncIterator[Pool]:
        pool.opened += 1
        yield pool

    @queue.task(name="di.report")
    async def report(month: str, db: Pool = Depends()) -> str:
        db.used += 1
        return f"report {month} ({db.used})"

    app = FastAPI(lifespan=lifespan(queue))

    @app.post("/reports/{month}")
    async def create_report(month: str, q: QueueDep) -> dict[str, str]:
        handle = await q.send("di.report", args=(month,))
        return {"task_id": handle.id, "result": await handle.result(timeout=30)}

    with worker_thread(queue, concurrency=2), TestClient(app) as client:
        first = client.post("/reports/2026-11").json()
        second = client.post("/reports/2026-12").json()
    assert first["result"] == "report 2026-11 (1)"
    assert second["result"] == "report 2026-12 (2)"
    assert first["task_id"] != second["task_id"]
    assert pool.opened == 1


async def test_eager_mode_and_the_worker_harness_open_the_lifespans(queue: Queue) -> None:
    """docs/dependencies.md, "Tests": the testing helpers run real workers, so a task's
    ``Depends()`` parameter is filled there too (the eager mode: once per drain)."""
    from blitzq.testing import WorkerHarness, eager

    pools: list[Pool] = []

    @queue.lifespan
    async def database() -> AsyncIterator[Pool]:
        pool = Pool(opened=1)
        pools.append(pool)
        yield pool
        pool.closed += 1

    @queue.task(name="di.eager")
    async def use(n: int, db: Pool = Depends()) -> int:
        db.used += 1
        return n * 10

    with eager():
        assert await (await use.enqueue(1)).result(timeout=30) == 10
        assert await (await use.enqueue(2)).result(timeout=30) == 20
    assert [(p.used, p.closed) for p in pools] == [(1, 1), (1, 1)]  # a drain per enqueue
    pools.clear()
    async with WorkerHarness(queue, concurrency=2) as harness:
        handles = [await use.enqueue(n) for n in range(3)]
        await harness.drain()
    assert [await h.result(timeout=30) for h in handles] == [0, 10, 20]
    assert [(p.used, p.closed) for p in pools] == [(3, 1)]


async def test_a_lifespan_that_fails_at_start_stops_the_worker_start(queue: Queue) -> None:
    events: list[str] = []

    @queue.lifespan
    async def first() -> AsyncIterator[Pool]:
        events.append("open first")
        yield Pool()
        events.append("close first")

    @queue.lifespan
    async def broken() -> AsyncIterator[Client]:
        raise RuntimeError("database unreachable")
        yield Client()  # an async generator all the same

    with pytest.raises(RuntimeError, match="database unreachable"):
        await asyncio.wait_for(make_worker(queue, concurrency=1).run(), 30)
    assert events == ["open first", "close first"]  # what was open is closed again
    assert await queue.broker.workers() == {}  # it never registered


PROCESS_APP = """
import dataclasses
import os
import uuid

import redis.asyncio

from blitzq import Depends, Queue

queue = Queue()  # URL and namespace: BLITZQ_REDIS_URL, BLITZQ_NAMESPACE


@dataclasses.dataclass
class Resource:
    token: str


@queue.lifespan
async def resource():
    client = redis.asyncio.Redis.from_url(os.environ["BLITZQ_REDIS_URL"])
    key = "{" + os.environ["BLITZQ_NAMESPACE"] + "}:test:opens"
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    await client.rpush(key, "open " + token)
    try:
        yield Resource(token)
    finally:
        await client.rpush(key, "close " + token)
        await client.aclose()


@queue.task(name="di.where")
async def where(res: Resource = Depends()) -> str:
    return res.token
"""


def test_each_worker_process_opens_its_own_resources(
    tmp_path: Path, redis_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    """``blitzq worker --workers 2``: one open per worker process (none in the supervisor),
    every run holding its own process's resource, each closed once at shutdown."""
    (tmp_path / "di_proc_app.py").write_text(PROCESS_APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env.update(BLITZQ_REDIS_URL=redis_url, BLITZQ_NAMESPACE=namespace, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "blitzq", "worker", "di_proc_app:queue", "--workers", "2"]
    cmd += ["-c", "3", "--shutdown-timeout", "2"]
    log = tmp_path / "supervisor.log"
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    key = "{" + namespace + "}:test:opens"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    producer = make_queue()
    try:

        def two_opened() -> list[str] | None:
            entries: list[str] = client.lrange(key, 0, -1)
            return entries if len(entries) >= 2 else None

        opened = wait_until(two_opened, 60.0, "two worker processes to open their resources")
        tokens = {entry.removeprefix("open ") for entry in opened}
        assert len({t.split("-")[0] for t in tokens}) == 2  # two processes
        assert str(proc.pid) not in {t.split("-")[0] for t in tokens}  # not the supervisor
        handles = [producer.send_sync("di.where") for _ in range(12)]
        assert {h.result_sync(timeout=30) for h in handles} <= tokens
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()[-3000:]
        entries = client.lrange(key, 0, -1)
        assert sorted(entries) == sorted(
            [f"open {t}" for t in tokens] + [f"close {t}" for t in tokens]
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        producer.close_sync()
        client.close()


def test_without_fastapi_the_import_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib

    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "blitzq.integrations.fastapi")
    with pytest.raises(ImportError, match=r"needs FastAPI: pip install fastapi .*\.\[fastapi\]"):
        importlib.import_module("blitzq.integrations.fastapi")
