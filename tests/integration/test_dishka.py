"""The Dishka integration (issue 12, "Dependencies for tasks"): ``FromDishka[T]`` parameters
filled from a request scope opened per run and closed when it ends, however it ends; ``APP``
objects once per worker, the container closed at worker shutdown. A real Worker on the test
Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from dishka import Provider, Scope, make_async_container

from blitzq import ConfigurationError, Queue, TaskContext, TaskFailed
from blitzq.integrations.dishka import BlitzqProvider, FromDishka, setup_dishka
from blitzq.testing import eager

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(60)


@dataclasses.dataclass
class Pool:
    """An APP-scope object (a database pool)."""

    closed: bool = False


@dataclasses.dataclass
class Session:
    """A REQUEST-scope object: one per run."""

    number: int
    pool: Pool
    task_id: str
    closed: bool = False


class Recorder:
    """Counts what the providers open and close."""

    def __init__(self) -> None:
        self.pools: list[Pool] = []
        self.sessions: list[Session] = []
        self.numbers = itertools.count()

    def open_sessions(self) -> list[Session]:
        return [s for s in self.sessions if not s.closed]


def providers(recorder: Recorder) -> Provider:
    """An APP-scope generator provider (a pool) and a REQUEST-scope one (a session per run,
    knowing the run's TaskContext) that record their opens and closes."""
    p = Provider()

    async def pool() -> AsyncIterator[Pool]:
        made = Pool()
        recorder.pools.append(made)
        yield made
        made.closed = True

    def session(pool: Pool, context: TaskContext) -> Iterator[Session]:
        made = Session(next(recorder.numbers), pool, context.id)
        recorder.sessions.append(made)
        yield made
        made.closed = True

    p.provide(pool, scope=Scope.APP)
    p.provide(session, scope=Scope.REQUEST)
    return p


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    """A Queue on the test server."""
    q = make_queue()
    yield q
    await q.close()


async def _all_closed(recorder: Recorder) -> list[Session]:
    return recorder.open_sessions()


async def _sessions(recorder: Recorder) -> list[Session]:
    return recorder.sessions


async def test_app_once_per_worker_request_per_run(queue: Queue) -> None:
    recorder = Recorder()
    middleware = setup_dishka(make_async_container(providers(recorder), BlitzqProvider()), queue)
    # One extension mechanism: the integration is one middleware and registers nothing else.
    assert queue.middleware == (middleware,)
    assert list(queue.lifespan) == []
    assert list(queue.on_shutdown) == []

    @queue.task(name="dishka.use")
    async def use(n: int, session: FromDishka[Session]) -> list[Any]:
        assert not session.closed
        assert not session.pool.closed
        return [n, session.number, session.task_id]

    @queue.task(name="dishka.thread")
    def in_thread(n: int, session: FromDishka[Session], pool: FromDishka[Pool]) -> bool:
        return session.pool is pool and not session.closed

    @queue.task(name="dishka.plain")
    async def plain(n: int) -> int:
        return n

    async with running(make_worker(queue, concurrency=4)):
        handles = [await use.enqueue(i) for i in range(5)]
        results = [await h.result(timeout=30) for h in handles]
        assert await (await in_thread.enqueue(1)).result(timeout=30) is True
        assert await (await plain.enqueue(7)).result(timeout=30) == 7
        assert [r[0] for r in results] == list(range(5))
        assert len({r[1] for r in results}) == 5  # a session of its own per run
        assert [r[2] for r in results] == [h.id for h in handles]  # the run's TaskContext
        await eventually(lambda: _all_closed(recorder), lambda open_: not open_)
        assert len(recorder.sessions) == 6  # the plain task opened no scope
        assert len(recorder.pools) == 1
        assert not recorder.pools[0].closed
    assert recorder.pools[0].closed  # the container was closed at worker shutdown
    assert len(recorder.pools) == 1
    async with running(make_worker(queue, concurrency=1)):  # a new worker: a new pool
        assert await (await in_thread.enqueue(2)).result(timeout=30) is True
        assert len(recorder.pools) == 2
    assert recorder.pools[1].closed


async def test_a_run_put_back_at_shutdown_closes_its_scope(queue: Queue) -> None:
    recorder = Recorder()
    setup_dishka(make_async_container(providers(recorder), BlitzqProvider()), queue)

    @queue.task(name="dishka.stuck")
    async def stuck(session: FromDishka[Session]) -> None:
        await asyncio.Event().wait()

    async with running(make_worker(queue, concurrency=1, shutdown_timeout=0.2)):
        await stuck.enqueue()
        await eventually(lambda: _sessions(recorder), lambda sessions: len(sessions) == 1)
    await eventually(lambda: _all_closed(recorder), lambda open_: not open_)
    assert recorder.pools[0].closed


async def test_a_failing_or_timed_out_run_still_closes_its_scope(queue: Queue) -> None:
    recorder = Recorder()
    setup_dishka(make_async_container(providers(recorder), BlitzqProvider()), queue)

    @queue.task(name="dishka.fail", retries=0)
    async def fail(session: FromDishka[Session]) -> None:
        raise ValueError(f"session {session.number} failed")

    @queue.task(name="dishka.thread_fail", retries=0)
    def thread_fail(session: FromDishka[Session]) -> None:
        raise ValueError("thread failed")

    @queue.task(name="dishka.hang", retries=0, timeout=0.2)
    async def hang(session: FromDishka[Session]) -> None:
        await asyncio.Event().wait()

    async with running(make_worker(queue, concurrency=2)):
        for task, match in (
            (fail, "failed"),
            (thread_fail, "thread failed"),
            (hang, "TaskTimeout"),
        ):
            handle = await task.enqueue()
            with pytest.raises(TaskFailed, match=match):
                await handle.result(timeout=30)
        await eventually(lambda: _all_closed(recorder), lambda open_: not open_)
        assert len(recorder.sessions) == 3


async def test_a_dependency_that_cannot_be_built_fails_the_attempt(queue: Queue) -> None:
    setup_dishka(make_async_container(Provider()), queue)

    @queue.task(name="dishka.missing", retries=0)
    async def missing(session: FromDishka[Session]) -> None:
        return None

    async with running(make_worker(queue, concurrency=1)):
        with pytest.raises(TaskFailed, match="Session"):
            await (await missing.enqueue()).result(timeout=30)


async def test_refused_early(queue: Queue, make_queue: Callable[..., Queue]) -> None:
    setup_dishka(make_async_container(Provider()), queue)

    @queue.task(name="dishka.refuse")
    async def refuse(n: int, session: FromDishka[Session]) -> int:
        return n

    with pytest.raises(ConfigurationError, match="filled by the worker"):
        await refuse.enqueue(1, session=None)
    with pytest.raises(ConfigurationError, match="process task cannot take session"):
        queue.task(name="dishka.proc", executor="process")(_process_task)

    other = make_queue()  # a process task registered before setup_dishka
    other.task(name="dishka.proc", executor="process")(_process_task)
    with pytest.raises(ConfigurationError, match="process task cannot take its FromDishka"):
        setup_dishka(make_async_container(Provider()), other)
    assert not other.middleware  # nothing half-installed
    with pytest.raises(TypeError, match="AsyncContainer"):
        setup_dishka(object(), other)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="already called"):
        setup_dishka(make_async_container(Provider()), queue)
    await other.close()


def _process_task(session: FromDishka[Session]) -> None:
    return None


async def test_eager_mode_fills_dishka_parameters() -> None:
    recorder = Recorder()
    queue = Queue(namespace="dishka-eager")
    setup_dishka(make_async_container(providers(recorder), BlitzqProvider()), queue)

    @queue.task(name="dishka.eager")
    async def use(n: int, session: FromDishka[Session]) -> int:
        return n + session.number

    with eager():
        handle = await use.enqueue(10)
        assert await handle.result(timeout=30) == 10
        await eventually(lambda: _all_closed(recorder), lambda open_: not open_)
    await queue.close()
    assert recorder.pools[0].closed  # each drain's worker closes the container


def test_without_dishka_the_import_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "dishka", None)  # as if the extra were not installed
    monkeypatch.delitem(sys.modules, "blitzq.integrations.dishka")
    with pytest.raises(ImportError, match=r"needs dishka: pip install dishka .*\.\[dishka\]"):
        importlib.import_module("blitzq.integrations.dishka")
