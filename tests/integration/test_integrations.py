"""Web-framework integrations against a real Redis: ASGI lifespan, FastAPI, Django, Flask.

Each framework test skips when its framework is not installed (``pip install -e .[dev]``
installs them all). The FastAPI and Flask tests drive the examples in ``examples/``, loaded
fresh with ``BLITZQ_REDIS_URL`` / ``BLITZQ_NAMESPACE`` pointing at the test server, and a real
Worker runs the tasks they enqueue.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from blitzq import BrokerError, Queue, SerializationError, Worker
from blitzq.integrations.asgi import BlitzQLifespan, lifespan
from tests.integration.proc_tasks import running, worker_thread

#: The Worker of the sync-API tests.
WORKER: dict[str, Any] = {"concurrency": 4, "block_timeout": 0.1, "shutdown_timeout": 2.0}

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(
    name: str, monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str
) -> ModuleType:
    """Import ``examples/<name>.py`` afresh, its Queue on the test server and namespace."""
    monkeypatch.setenv("BLITZQ_REDIS_URL", redis_url)
    monkeypatch.setenv("BLITZQ_NAMESPACE", namespace)
    spec = importlib.util.spec_from_file_location(
        f"example_{name}_{namespace}", EXAMPLES / f"{name}.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def has_broker(queue: Queue) -> bool:
    """Whether ``queue`` holds a broker (open connections) for the running loop."""
    return asyncio.get_running_loop() in queue._brokers


# ------------------------------------------------------------------ ASGI
async def test_lifespan_connects_at_start_and_closes_at_stop(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue()
    async with lifespan(queue):
        assert has_broker(queue)
    assert not has_broker(queue)


async def test_lifespan_fails_start_when_the_broker_is_unreachable(
    make_queue: Callable[..., Queue],
) -> None:
    from tests.conftest import free_port

    queue = make_queue(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(BrokerError):
        async with lifespan(queue):
            pass


async def _drive_lifespan(app: Any) -> list[str]:
    """Run the ASGI lifespan protocol against ``app``; return the message types it sent."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: list[str] = []

    async def receive() -> dict[str, Any]:
        return await inbox.get()

    async def send(message: Any) -> None:
        sent.append(message["type"])

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    call = asyncio.create_task(app(scope, receive, send))
    await inbox.put({"type": "lifespan.startup"})
    deadline = time.monotonic() + 5
    while "lifespan.startup.complete" not in sent and "lifespan.startup.failed" not in sent:
        assert time.monotonic() < deadline, sent
        await asyncio.sleep(0.01)
    await inbox.put({"type": "lifespan.shutdown"})
    await asyncio.wait_for(call, 5)
    return sent


async def test_middleware_runs_the_lifespan_for_an_app_without_one(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue()
    requests: list[bool] = []

    async def plain_app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError("only http")  # typical of apps that ignore lifespan
        requests.append(has_broker(queue))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = BlitzQLifespan(plain_app, queue)
    sent = await _drive_lifespan(app)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert not has_broker(queue)


async def test_middleware_wraps_the_apps_own_lifespan(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()
    events: list[str] = []

    async def app_with_lifespan(scope: Any, receive: Any, send: Any) -> None:
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                events.append(f"app startup, connected={has_broker(queue)}")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                events.append(f"app shutdown, connected={has_broker(queue)}")
                await send({"type": "lifespan.shutdown.complete"})
                return

    sent = await _drive_lifespan(BlitzQLifespan(app_with_lifespan, queue))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert events == ["app startup, connected=True", "app shutdown, connected=True"]
    assert not has_broker(queue)


# ---------------------------------------------------------------- FastAPI
async def test_fastapi_example_enqueues_and_a_worker_runs_it(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str
) -> None:
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    example = load_example("fastapi_app", monkeypatch, redis_url, namespace)
    app, queue = example.app, example.queue
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),  # what the server runs at start and stop
        httpx.AsyncClient(transport=transport, base_url="http://test") as client,
    ):
        assert has_broker(queue)
        response = await client.post("/reports", json={"month": "2024-02"})
        assert response.status_code == 202
        task_id = response.json()["task_id"]
        pending = await client.get(f"/reports/{task_id}")
        assert pending.json()["state"] == "queued"  # track_state: recorded at enqueue
        for month in ("2024-13", "abc", "0000-01"):  # refused at the edge, never enqueued
            bad = await client.post("/reports", json={"month": month})
            assert bad.status_code == 422, (month, bad.text)
        unknown = await client.get("/reports/no-such-task")
        assert unknown.status_code == 404
        stats = await queue.stats(["reports"])
        assert stats["queues"]["reports"]["waiting"] == 1  # only the good one was enqueued
        async with running(Worker(queue, block_timeout=0.1, shutdown_timeout=2.0)):
            done = await client.get(f"/reports/{task_id}", params={"wait": 10})
        assert done.status_code == 200
        assert done.json() == {
            "task_id": task_id,
            "state": "succeeded",
            "result": {"month": "2024-02", "rows": 29},
            "error": None,
        }
    assert not has_broker(queue)


# ----------------------------------------------------------------- Django
@pytest.fixture(scope="module")
def django_db() -> Any:
    """Django configured with an in-memory SQLite database (once per process)."""
    pytest.importorskip("django")
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
        django.setup()
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS item (id INTEGER PRIMARY KEY, name TEXT)")
    return connection


def test_django_enqueues_only_after_commit(
    django_db: Any, make_queue: Callable[..., Queue]
) -> None:
    from django.db import transaction

    from blitzq.integrations.django import enqueue_on_commit

    queue = make_queue(name="django")

    @queue.task
    def index_item(item_id: int) -> int:
        return item_id

    def waiting() -> int:
        stats = queue.stats_sync(["django"])
        return int(stats["queues"]["django"]["waiting"])

    try:
        with transaction.atomic():
            with django_db.cursor() as cursor:
                cursor.execute("INSERT INTO item (id, name) VALUES (1, 'kept')")
            task_id = enqueue_on_commit(index_item, 1)
            assert waiting() == 0  # not before the commit
        assert waiting() == 1

        with worker_thread(queue, **WORKER):
            assert queue.get_result_sync(task_id, timeout=10) == 1

        # Outside a transaction (autocommit) the task goes at once; bound options are kept.
        bound_id = enqueue_on_commit(index_item.options(task_id="chosen-id"), 2)
        assert bound_id == "chosen-id"
        assert waiting() == 1
    finally:
        queue.purge_queue_sync("django")
        queue.close_sync()


def test_django_a_unique_duplicate_at_the_commit_is_logged(
    django_db: Any, make_queue: Callable[..., Queue], caplog: pytest.LogCaptureFixture
) -> None:
    """enqueue_on_commit of a unique task whose equal call is still pending at the commit:
    nothing is enqueued and the id it handed out names no task, which a WARNING says with
    the pending task's id (tester finding: the id was silently dangling)."""
    from django.db import transaction

    from blitzq.integrations.django import enqueue_on_commit

    queue = make_queue(name="django")

    @queue.task(unique=True)
    def report(user_id: int) -> int:
        return user_id

    try:
        with caplog.at_level("WARNING", logger="blitzq.integrations.django"):
            ids = []
            for _ in range(2):
                with transaction.atomic():
                    ids.append(enqueue_on_commit(report, 7))
        assert queue.inspect_sync(ids[1]) is None
        warned = [r.getMessage() for r in caplog.records]
        assert len(warned) == 1
        assert f"duplicates the pending task {ids[0]}" in warned[0]
        assert ids[1] in warned[0]
    finally:
        queue.purge_queue_sync("django")
        queue.close_sync()


def test_django_rollback_enqueues_nothing(django_db: Any, make_queue: Callable[..., Queue]) -> None:
    from django.db import transaction

    from blitzq.integrations.django import enqueue_on_commit

    queue = make_queue(name="django")

    @queue.task
    def index_item(item_id: int) -> int:
        return item_id

    class Boom(Exception):
        pass

    def rolled_back() -> None:
        with transaction.atomic():
            with django_db.cursor() as cursor:
                cursor.execute("INSERT INTO item (id, name) VALUES (10, 'dropped')")
            enqueue_on_commit(index_item, 10)
            raise Boom

    def not_plain_data() -> None:
        with transaction.atomic():
            with django_db.cursor() as cursor:
                cursor.execute("INSERT INTO item (id, name) VALUES (11, 'dropped')")
            enqueue_on_commit(index_item, object())  # type: ignore[arg-type]

    try:
        with pytest.raises(Boom):
            rolled_back()
        # A value that is not plain data fails inside the transaction, which rolls back.
        with pytest.raises(SerializationError):
            not_plain_data()
        with django_db.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM item WHERE id IN (10, 11)")
            assert cursor.fetchone()[0] == 0
        assert queue.stats_sync(["django"])["queues"]["django"]["waiting"] == 0
    finally:
        queue.close_sync()


# ------------------------------------------------------------------ Flask
def test_flask_example_enqueues_with_the_sync_api(
    monkeypatch: pytest.MonkeyPatch, redis_url: str, namespace: str
) -> None:
    pytest.importorskip("flask")
    from blitzq.integrations.flask import close, get_queue, init_app

    example = load_example("flask_app", monkeypatch, redis_url, namespace)
    app, queue = example.app, example.queue
    assert get_queue(app) is queue
    init_app(app, queue)  # idempotent for the same queue
    with pytest.raises(RuntimeError):
        init_app(app, Queue("other", redis_url=redis_url, namespace=namespace))

    client = app.test_client()
    response = client.post("/thumbnails", json={"width": 640, "height": 480})
    assert response.status_code == 202
    task_id = response.get_json()["task_id"]
    # The sync API's loop outlives the request: it is closed with the app, not per request.
    portal = queue._portal
    assert portal._thread is not None
    assert portal._thread.is_alive()

    with worker_thread(queue, **WORKER):
        done = client.get(f"/thumbnails/{task_id}?wait=10").get_json()
    assert done == {"task_id": task_id, "state": "succeeded", "result": [160, 120], "error": None}

    thread = portal._thread
    close(app)
    assert portal._thread is None
    assert not thread.is_alive()
