"""The dashboard's task list, actions and charts through httpx's ASGI transport, against a
real Redis and real Workers: every listing state with its filters and cursor, every action
(each refused without its confirmation), the series the workers sample, and the index of
ended tasks with ``store_results=False`` (and none with ``recent_index=0``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette", reason="the dashboard needs the 'dashboard' extra")

from blitzq import Queue
from blitzq.dashboard import create_app
from blitzq.schedules import Every
from tests.integration.proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)


def client(app: Any) -> httpx.AsyncClient:
    """An httpx client calling ``app`` in-process."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    """A Queue that keeps no results (``store_results=False``, no ``track_state``) with a
    task that adds, one that fails, one that waits on an event, and a periodic entry."""
    q = make_queue(store_results=False)

    @q.task(name="math.add")
    async def add(a: int, b: int) -> int:
        return a + b

    @q.task(name="math.boom", retries=0)
    async def boom(payload: str) -> None:
        raise ValueError(f"bad {payload}")

    q.add_periodic(add, Every(3600), name="hourly", args=(40, 2))
    yield q
    await q.close()


async def post(c: httpx.AsyncClient, path: str, payload: dict[str, Any]) -> httpx.Response:
    """POST ``payload`` as JSON."""
    return await c.post(path, json=payload)


async def listing(c: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    """``GET /api/tasks`` with ``params``; its JSON (asserting a 200)."""
    answer = await c.get("/api/tasks", params={k: v for k, v in params.items() if v is not None})
    assert answer.status_code == 200, answer.text
    doc: dict[str, Any] = answer.json()
    return doc


async def pages(c: httpx.AsyncClient, state: str, limit: int) -> list[str]:
    """The ids of every page of ``state``'s list, ``limit`` a page, following ``next``."""
    seen: list[str] = []
    cursor = None
    while True:
        page = await listing(c, state=state, limit=limit, cursor=cursor)
        seen += [row["id"] for row in page["items"]]
        cursor = page["next"]
        if cursor is None:
            return seen


@pytest.mark.parametrize("limit", [1, 3, 4, 7])
async def test_pages_cut_a_group_of_one_time_without_skipping_any(queue: Queue, limit: int) -> None:
    """Ended tasks written in one batch share their time, as do tasks enqueued together
    with one delay: a page cut inside such a group leaves the rest for the next page (a
    cursor of the time alone skipped them: a flaky CI test)."""
    at = time.time()
    ended = [f"{n:032x}" for n in range(1, 10)]
    browse = queue.broker.state.browse
    await queue.broker.remember_queues(["default"])  # what a worker on it records
    await browse.add_ended("default", [f"succeeded\nmath.add\n{i}" for i in ended], at, 100, 600)
    await browse.add_ended(
        "default", [f"failed\nmath.add\n{n:032x}" for n in (20, 21)], at - 5, 100, 600
    )
    async with client(create_app(queue)) as c:
        listed = await pages(c, "recent", limit)
        assert sorted(listed) == sorted([*ended, f"{20:032x}", f"{21:032x}"])
        assert len(listed) == 11
        add = queue.tasks["math.add"]
        later = await add.options(delay=3600).enqueue_many([((n, n), {}) for n in range(9)])
        scheduled = await pages(c, "scheduled", limit)
        assert sorted(scheduled) == sorted(h.id for h in later)
        assert len(scheduled) == 9


async def test_ended_tasks_are_listed_without_records(queue: Queue) -> None:
    adds = [await queue.tasks["math.add"].enqueue(i, i) for i in range(7)]
    bad = await queue.tasks["math.boom"].enqueue("needle-in-args")
    async with running(make_worker(queue, concurrency=4)), client(create_app(queue)) as c:
        doc = await eventually(
            lambda: listing(c), lambda d: len(d["items"]) == 8 and d["next"] is None
        )
        assert doc["index"] == 10_000
        states = {row["id"]: row["state"] for row in doc["items"]}
        assert states[bad.id] == "dead_lettered"
        args = {row["id"]: row["args"] for row in doc["items"]}
        assert args[bad.id] == ["needle-in-args"]  # its failure record keeps a preview
        assert args[adds[0].id] is None  # no record: store_results=False
        assert all(states[h.id] == "succeeded" for h in adds)
        assert await queue.inspect(adds[0].id) is None  # no record: store_results=False
        ats = [row["at"] for row in doc["items"]]
        assert ats == sorted(ats, reverse=True)  # newest first
        # The cursor pages through all of them, each once.
        seen: list[str] = []
        cursor = None
        while True:
            page = await listing(c, limit=3, cursor=cursor)
            seen += [row["id"] for row in page["items"]]
            cursor = page["next"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(states)
        assert len(seen) == 8
        # Filters: state, task name, queue, id prefix, text in the arguments, time.
        assert [r["id"] for r in (await listing(c, state="succeeded"))["items"]] != []
        only = await listing(c, state="dead_lettered")
        assert [r["id"] for r in only["items"]] == [bad.id]
        assert len((await listing(c, task="math.add"))["items"]) == 7
        assert (await listing(c, queue="other"))["items"] == []
        assert len((await listing(c, queue="default"))["items"]) == 8
        prefix = await listing(c, q=adds[3].id[:12])
        assert [r["id"] for r in prefix["items"]] == [adds[3].id]
        text = await listing(c, q="NEEDLE-in")  # the failed record keeps its arguments
        assert [r["id"] for r in text["items"]] == [bad.id]
        assert text["items"][0]["args"] == ["needle-in-args"]
        later = await listing(c, since=time.time() + 60)
        assert later["items"] == []
        bad_state = await c.get("/api/tasks", params={"state": "nope"})
        assert bad_state.status_code == 400
        bad_cursor = await c.get("/api/tasks", params={"cursor": "x"})
        assert bad_cursor.status_code == 400


async def test_fast_mode_runs_without_a_write_are_listed(
    make_queue: Callable[..., Queue],
) -> None:
    """A fast-mode success without a record has no completion to ride in: its note is
    written within a second by the worker, and the last ones at its shutdown."""
    q = make_queue(mode="fast", store_results=False)

    @q.task(name="quick")
    async def quick(n: int) -> int:
        return n

    try:
        handles = [await quick.enqueue(n) for n in range(5)]
        async with client(create_app(q)) as c:
            async with running(make_worker(q)):
                doc = await eventually(lambda: listing(c), lambda d: len(d["items"]) == 5)
            assert {r["id"] for r in doc["items"]} == {h.id for h in handles}
            assert {r["state"] for r in doc["items"]} == {"succeeded"}
            more = [await quick.enqueue(n) for n in range(3)]
            async with running(make_worker(q)):
                await eventually(
                    lambda: q.stats(), lambda s: s["queues"]["default"]["waiting"] == 0
                )
            # Stopped: what ended before the stop was written at its shutdown at the latest.
            doc = await eventually(lambda: listing(c), lambda d: len(d["items"]) == 8)
            assert {h.id for h in more} <= {r["id"] for r in doc["items"]}
    finally:
        await q.close()


async def test_no_index_lists_no_ended_tasks(make_queue: Callable[..., Queue]) -> None:
    q = make_queue(recent_index=0)

    @q.task(name="noop")
    async def noop() -> None:
        return None

    handle = await noop.enqueue()
    try:
        async with running(make_worker(q)):
            await handle.result(timeout=30)
        async with client(create_app(q)) as c:
            doc = await listing(c)
            assert doc["items"] == []
            assert doc["index"] == 0
    finally:
        await q.close()


async def test_queued_scheduled_and_running_lists(queue: Queue) -> None:
    add = queue.tasks["math.add"]
    waiting = [await add.options(queue="slow").enqueue(i, 0) for i in range(5)]
    later = await add.options(delay=3600).enqueue(9, 9)
    soon = await add.options(delay=1800).enqueue(8, 8)
    async with client(create_app(queue)) as c:
        queued = await listing(c, state="queued", queue="slow")
        assert [r["id"] for r in queued["items"]] == [h.id for h in waiting]  # order taken
        assert queued["items"][0]["args"] == [0, 0]
        first = await listing(c, state="queued", queue="slow", limit=2)
        second = await listing(c, state="queued", queue="slow", limit=2, cursor=first["next"])
        assert [r["id"] for r in first["items"] + second["items"]] == [h.id for h in waiting[:4]]
        scheduled = await listing(c, state="scheduled")
        assert [r["id"] for r in scheduled["items"]] == [soon.id, later.id]  # soonest first
        assert scheduled["items"][1]["args"] == [9, 9]
        found = await listing(c, state="scheduled", q="9, 9")
        assert [r["id"] for r in found["items"]] == [later.id]
        # Cancel one (confirmed), purge the queue (confirmed).
        refused = await post(c, f"/api/tasks/{later.id}/cancel", {})
        assert refused.status_code == 400
        done = await post(c, f"/api/tasks/{later.id}/cancel", {"confirm": later.id})
        assert done.json() == {"id": later.id, "cancelled": "scheduled"}
        assert [r["id"] for r in (await listing(c, state="scheduled"))["items"]] == [soon.id]
        assert (await post(c, "/api/queues/slow/purge", {"confirm": "default"})).status_code == 400
        purged = await post(c, "/api/queues/slow/purge", {"confirm": "slow"})
        assert purged.json() == {"queue": "slow", "purged": 5}
        assert (await listing(c, state="queued", queue="slow"))["items"] == []


async def test_running_list_from_the_workers(make_queue: Callable[..., Queue]) -> None:
    q = make_queue()
    gate = asyncio.Event()

    @q.task(name="held")
    async def held() -> None:
        await gate.wait()

    handle = await held.enqueue()
    try:
        async with running(make_worker(q)) as worker, client(create_app(q)) as c:
            doc = await eventually(
                lambda: listing(c, state="running"), lambda d: len(d["items"]) == 1
            )
            row = doc["items"][0]
            assert (row["id"], row["task"], row["worker"]) == (handle.id, "held", worker.id)
            gate.set()
            await handle.result(timeout=30)
    finally:
        await q.close()


async def test_pause_resume_a_queue(queue: Queue) -> None:
    async with client(create_app(queue)) as c:
        assert (await post(c, "/api/queues/default/pause", {})).status_code == 400
        paused = await post(c, "/api/queues/default/pause", {"confirm": "default"})
        assert paused.json() == {"queue": "default", "paused": True, "changed": True}
        assert "default" in await queue.broker.paused_queues()
        await queue.tasks["math.add"].enqueue(1, 1)
        rows = (await c.get("/api/queues")).json()["queues"]
        assert {r["name"]: r["paused"] for r in rows}["default"] is True
        resumed = await post(c, "/api/queues/default/resume", {"confirm": "default"})
        assert resumed.json()["changed"] is True
        assert "default" not in await queue.broker.paused_queues()


async def test_replay_all_matching_dead_letters(queue: Queue) -> None:
    boom = queue.tasks["math.boom"]
    ids = [(await boom.enqueue(f"p{i}")).id for i in range(3)]
    async with running(make_worker(queue, concurrency=3)):
        await eventually(queue.dead_letter_count, lambda n: n == 3)
    async with client(create_app(queue)) as c:
        refused = await post(c, "/api/dead-letters/replay", {"task": "math.boom"})
        assert refused.status_code == 400
        none = await post(
            c, "/api/dead-letters/replay", {"confirm": "all matching", "task": "other"}
        )
        assert none.json() == {"matched": 0, "outcomes": {}}
        done = await post(
            c, "/api/dead-letters/replay", {"confirm": "all matching", "task": "math.boom"}
        )
        assert done.json() == {"matched": 3, "outcomes": {"replayed": 3}}
        assert await queue.dead_letter_count() == 0
        queued = await listing(c, state="queued")
        assert sorted(r["id"] for r in queued["items"]) == sorted(ids)
        page = await c.get("/api/dead-letters", params={"limit": 2, "offset": 2})
        assert page.json()["items"] == []


async def test_periodic_run_now_pause_and_resume(queue: Queue) -> None:
    async with client(create_app(queue)) as c:
        assert (await post(c, "/api/periodic/hourly/run", {})).status_code == 400
        assert (await post(c, "/api/periodic/none/run", {"confirm": "none"})).status_code == 404
        sent = (await post(c, "/api/periodic/hourly/run", {"confirm": "hourly"})).json()
        assert sent["name"] == "hourly"
        queued = await listing(c, state="queued")
        assert [(r["id"], r["args"]) for r in queued["items"]] == [(sent["id"], [40, 2])]
        paused = await post(c, "/api/periodic/hourly/pause", {"confirm": "hourly"})
        assert paused.json() == {"name": "hourly", "paused": True, "changed": True}
        rows = (await c.get("/api/periodic")).json()["periodic"]
        assert rows[0]["paused"] is True
        # A paused entry's occurrence is claimed and skipped: nothing is published.
        broker = queue.broker
        now = await broker.server_time()
        claimed = await broker.claim_periodic("hourly", now - 1, b"x", "default")
        assert claimed is False
        assert await broker.periodic_last(["hourly"]) == {"hourly": pytest.approx(now - 1)}
        resumed = await post(c, "/api/periodic/hourly/resume", {"confirm": "hourly"})
        assert resumed.json()["changed"] is True
        assert (await c.get("/api/periodic")).json()["periodic"][0]["paused"] is False


async def test_resize_and_shut_down_a_worker(queue: Queue) -> None:
    worker = make_worker(queue, concurrency=4)
    async with running(worker), client(create_app(queue)) as c:
        await eventually(queue.broker.workers, lambda w: worker.id in w)
        path = f"/api/workers/{worker.id}"
        # An id no live worker has is refused, as `blitzq worker shutdown` refuses it.
        for action, payload in (("shutdown", {}), ("resize", {"concurrency": 2})):
            answer = await post(
                c, f"/api/workers/nosuch/{action}", {"confirm": "nosuch", **payload}
            )
            assert answer.status_code == 404, action
            assert answer.json() == {"error": "no live worker nosuch"}
        assert (await post(c, path + "/resize", {"concurrency": 2})).status_code == 400
        for bad in (0, 100_001, "3", True):
            answer = await post(c, path + "/resize", {"confirm": worker.id, "concurrency": bad})
            assert answer.status_code == 400, bad
        asked = await post(c, path + "/resize", {"confirm": worker.id, "concurrency": 7})
        assert asked.json() == {"worker": worker.id, "asked": "resize", "concurrency": 7}

        async def concurrency() -> Any:
            rows = (await c.get("/api/workers")).json()["workers"]
            return {r["id"]: r["concurrency"] for r in rows}.get(worker.id)

        await eventually(concurrency, lambda n: n == 7)
        assert (await post(c, path + "/shutdown", {})).status_code == 400
        stop = await post(c, path + "/shutdown", {"confirm": worker.id})
        assert stop.json() == {"worker": worker.id, "asked": "shutdown"}
        await eventually(queue.broker.workers, lambda w: worker.id not in w)


async def test_a_restarted_worker_starts_with_its_configured_concurrency(queue: Queue) -> None:
    """A resize asked of a worker is kept under its id until the worker takes it; a worker
    restarted under the same id (a supervisor's slot: resized, then shut down before its
    maintenance round took the size) starts with its configured concurrency all the same:
    it drops the size asked of the process that stopped before it registers."""
    registry: Any = queue.broker.state.registry
    await queue.broker.request_resize("slot:1", 7)  # left by the process that stopped
    again = make_worker(queue, concurrency=4, name="slot:1")
    async with running(again):
        await eventually(queue.broker.workers, lambda w: "slot:1" in w)
        assert not await registry.client.hexists(registry.keys.worker_sizes, "slot:1")
        assert again.concurrency == 4


async def test_series_of_the_workers(queue: Queue) -> None:
    add = queue.tasks["math.add"]
    handles = [await add.enqueue(i, 1) for i in range(5)]
    await queue.tasks["math.boom"].enqueue("x")
    worker = make_worker(queue, concurrency=2)
    async with running(worker):
        await eventually(queue.dead_letter_count, lambda n: n == 1)
        await eventually(lambda: listing_count(queue), lambda n: n == 6)
        series = worker.series
        assert series is not None
        await series.sample()  # the loop samples every 10 s; do it now
    async with client(create_app(queue)) as c:
        slot = int(time.time()) // 10
        fields: dict[str, int] = {}  # the worker's own loop may have sampled a slot before
        for part in await queue.broker.state.browse.samples([slot - 2, slot - 1, slot]):
            for k, v in part.items():
                fields[k] = v if k.startswith("q:") else fields.get(k, 0) + v
        assert fields["done"] == 6
        assert fields["failed"] == 1
        assert sum(v for k, v in fields.items() if k.startswith("w")) == 6
        assert fields["q:default"] == 0
        doc = (await c.get("/api/series", params={"minutes": 5})).json()
        assert doc["slot"] == 10
        assert len(doc["points"]) == 30
        assert (await c.get("/api/series", params={"minutes": 0})).status_code == 400
    assert len(handles) == 5


async def listing_count(queue: Queue) -> int:
    """How many ended tasks the dashboard lists."""
    async with client(create_app(queue)) as c:
        return len((await listing(c))["items"])


async def test_actions_are_behind_the_same_auth(queue: Queue) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    host = Starlette(routes=[Mount("/secure", app=create_app(queue, basic_auth=("ops", "pw")))])
    calls = [
        ("/secure/api/tasks", None),
        ("/secure/api/series", None),
        ("/secure/api/queues/default/pause", {"confirm": "default"}),
        ("/secure/api/queues/default/purge", {"confirm": "default"}),
        ("/secure/api/periodic/hourly/run", {"confirm": "hourly"}),
        ("/secure/api/workers/w1/shutdown", {"confirm": "w1"}),
        ("/secure/api/dead-letters/replay", {"confirm": "all matching"}),
    ]
    async with client(host) as c:
        for path, payload in calls:
            answer = await (c.get(path) if payload is None else post(c, path, payload))
            assert answer.status_code == 401, path
        assert await queue.broker.paused_queues() == set()
        c.auth = ("ops", "pw")
        paused = await post(c, "/secure/api/queues/default/pause", {"confirm": "default"})
        assert paused.json()["changed"] is True
        assert (await c.get("/secure/api/tasks")).status_code == 200
