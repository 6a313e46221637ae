"""The dashboard driven in headless Chromium (playwright with Debian's ``chromium``), served by
a real uvicorn for ``create_app(queue)`` with a real Worker on the test Redis.

One browser for the module. The server hosts the dashboard twice, as a host app would mount
it: open at ``/`` and behind basic auth at ``/secure``. With
``BLITZQ_DASHBOARD_SCREENSHOTS=1`` the tests also write the pages' screenshots to
``docs/images/`` (what docs/dashboard.md shows).

Needs ``/usr/bin/chromium`` (``apt-get install chromium``; ``.ci/run`` installs it) or
``BLITZQ_CHROMIUM`` naming another Chromium; skips with the reason otherwise. Playwright's
own browser downloads are not used.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from blitzq import Queue, RetryPolicy, TaskState
from blitzq.schedules import Cron, Every
from tests.conftest import free_port
from tests.integration.proc_tasks import worker_thread
from tests.polling import wait_until

CHROMIUM = os.environ.get("BLITZQ_CHROMIUM", "/usr/bin/chromium")
if not os.path.exists(CHROMIUM):
    pytest.skip(
        f"no Chromium at {CHROMIUM}: apt-get install chromium (or set BLITZQ_CHROMIUM)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev extra)")
pytest.importorskip("uvicorn", reason="the dashboard needs the 'dashboard' extra")

import uvicorn  # noqa: E402
from starlette.applications import Starlette  # noqa: E402
from starlette.routing import Mount  # noqa: E402

from blitzq.dashboard import create_app  # noqa: E402
from blitzq.integrations.asgi import lifespan  # noqa: E402

pytestmark = pytest.mark.timeout(90)

T = TypeVar("T")
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
SCREENSHOTS = os.environ.get("BLITZQ_DASHBOARD_SCREENSHOTS") == "1"
XSS = "<img src=x onerror=window.__xss=1>"
USER, PASSWORD = "admin", "s3cret"

sync_api.expect.set_options(timeout=20_000)
expect = sync_api.expect


def shot(page: Any, name: str) -> None:
    """Save ``page`` as ``docs/images/dashboard-<name>.png`` when screenshots are asked for."""
    if SCREENSHOTS:
        page.screenshot(path=str(IMAGES / f"dashboard-{name}.png"), full_page=True)


class App:
    """The server under test: its URL, Queue, a raw Redis client and the tasks' ids."""

    def __init__(self, url: str, queue: Queue, raw: redis.Redis, flag: str) -> None:
        self.url = url
        self.queue = queue
        self.raw = raw
        self.flag = flag
        self.ids: dict[str, str] = {}


def off_loop(fn: Callable[[], T]) -> T:
    """Call ``fn`` in another thread: playwright's sync API keeps an event loop running on
    this one, where blitzq's ``*_sync`` methods refuse to run."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result(timeout=30)


def state(app: App, task_id: str) -> TaskState | None:
    """The state of ``task_id``'s record, or ``None`` while it has none."""
    record = off_loop(lambda: app.queue.inspect_sync(task_id))
    return None if record is None else record.state


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """Run ``app`` on uvicorn in a thread on a free port; yield its base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 30, "uvicorn to start")
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


@pytest.fixture(scope="module")
def app(redis_url: str) -> Iterator[App]:
    """A Queue with a task that fails until a Redis flag is set, a Worker, and the server."""
    namespace = "test-dash-" + uuid.uuid4().hex[:10]
    queue = Queue(redis_url=redis_url, namespace=namespace)
    raw = redis.Redis.from_url(redis_url)
    flag = f"{{{namespace}}}:test:second-life"

    @queue.task(name="billing.charge", retries=1, retry_policy=RetryPolicy(base=0.05))
    async def charge(customer: str, cents: int) -> str:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(redis_url)
        try:
            second_life = await client.exists(flag)
        finally:
            await client.aclose()
        if not second_life:
            raise RuntimeError(f"card declined for {customer}")
        return f"charged {cents} cents"

    @queue.task(name="reports.build")
    async def build(name: str) -> str:
        return f"report {name}"

    queue.add_periodic(build, Cron("30 6 * * *", tz="America/New_York"), name="morning-report",
                       args=("daily",))  # fmt: skip
    queue.add_periodic(build, Every(300), name="refresh", args=("5min",))
    host = Starlette(
        routes=[
            Mount("/secure", app=create_app(queue, basic_auth=(USER, PASSWORD))),
            Mount("/", app=create_app(queue, refresh=0.5)),
        ],
        lifespan=lifespan(queue),
    )
    try:
        with worker_thread(queue, queues=["default"], concurrency=4), serving(host) as url:
            state = App(url, queue, raw, flag)
            for customer in ("ada", XSS):
                handle = charge.enqueue_sync(customer, 1250)
                state.ids[customer] = handle.id
            for name in ("q1", "q2", "q3"):
                build.options(queue="reports").enqueue_sync(name)
            state.ids["built"] = build.enqueue_sync("weekly").id
            wait_until(lambda: queue.dead_letter_count_sync() == 2, 30, "two dead letters")
            yield state
    finally:
        keys = list(raw.scan_iter(match="{" + namespace + "}:*", count=1000))
        if keys:
            raw.delete(*keys)
        raw.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module."""
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (its own context) that fails the test on any script error."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, errors


def test_start_page_shows_queue_counts_live(app: App, page: Any) -> None:
    page.goto(app.url + "/")
    waiting = page.locator('#queues tr[data-queue="reports"] td.waiting')
    expect(waiting).to_have_text("3")
    expect(page.locator("#s-dead")).to_have_text("2")
    expect(page.locator("#s-workers")).to_have_text("1")
    shot(page, "queues")
    off_loop(lambda: app.queue.tasks["reports.build"].options(queue="reports").enqueue_sync("q4"))
    expect(waiting).to_have_text("4")  # no reload: the page polls the API
    page.locator("#dead-link").click()
    expect(page).to_have_url(app.url + "/dead-letters")


def test_replay_a_dead_letter_and_see_the_task_run(app: App, page: Any) -> None:
    task_id = app.ids["ada"]
    assert state(app, task_id) is TaskState.DEAD_LETTERED
    app.raw.set(app.flag, 1)  # the task succeeds on its second life
    page.goto(app.url + "/dead-letters")
    row = page.locator(f'#letters tr[data-id="{task_id}"]')
    expect(row).to_contain_text("card declined for ada")
    expect(row).to_contain_text("billing.charge")
    row.locator("button.replay").click()
    expect(row.locator("button.confirm")).to_be_visible()
    shot(page, "dead-letters")
    row.locator("button.confirm").click()
    expect(page.locator("#dl-message")).to_contain_text(f"replayed {task_id}")
    expect(row).to_have_count(0)
    wait_until(
        lambda: state(app, task_id) is TaskState.SUCCEEDED, 30, "the replayed task to succeed"
    )
    page.locator("#dl-message a").click()  # the replayed task's page
    expect(page.locator("#task-state")).to_have_text("succeeded")
    expect(page.locator("#task")).to_contain_text("charged 1250 cents")


def test_user_data_is_shown_as_text(app: App, page: Any) -> None:
    task_id = app.ids[XSS]
    page.goto(app.url + "/dead-letters")
    row = page.locator(f'#letters tr[data-id="{task_id}"]')
    expect(row).to_contain_text(f"card declined for {XSS}")
    expect(row.locator("img")).to_have_count(0)
    page.goto(app.url + "/tasks/" + task_id)
    expect(page.locator("#task")).to_contain_text(XSS)
    # The dead-lettered task's record keeps its arguments: shown as text, with their source.
    expect(page.locator("#task-args")).to_have_text(f'["{XSS}",1250]')
    expect(page.locator("#task")).to_contain_text("(from the record)")
    expect(page.locator("#task-kwargs")).to_have_text("{}")
    expect(page.locator("#task img")).to_have_count(0)
    assert page.evaluate("window.__xss") is None


def test_look_up_a_task_by_id(app: App, page: Any) -> None:
    task_id = app.ids["built"]
    wait_until(lambda: state(app, task_id) is TaskState.SUCCEEDED, 30, "the task to succeed")
    page.goto(app.url + "/tasks")
    page.locator("#task-id").fill(task_id)
    page.locator("#search button").click()
    expect(page.locator("#task-state")).to_have_text("succeeded")
    expect(page.locator("#task")).to_contain_text('"report weekly"')
    expect(page).to_have_url(f"{app.url}/tasks/{task_id}")
    # A default success record keeps no arguments: the page says why.
    expect(page.locator("#task-args-note")).to_contain_text(
        "a succeeded task keeps no arguments unless track_state is on"
    )
    page.locator("#task-id").fill("no-such-task")
    page.locator("#search button").click()
    expect(page.locator("#task-missing")).to_contain_text("no record of task no-such-task")
    build = app.queue.tasks["reports.build"]
    later = off_loop(lambda: build.options(delay=3600).enqueue_sync("next-quarter"))
    page.locator("#task-id").fill(later.id)
    page.locator("#search button").click()
    expect(page.locator("#task-state")).to_have_text("scheduled")
    expect(page.locator("#task-args")).to_have_text('["next-quarter"]')  # from the message
    expect(page.locator("#task")).to_contain_text("(from the schedule)")
    shot(page, "task")


def test_workers_and_periodic_pages(app: App, page: Any) -> None:
    page.goto(app.url + "/workers")
    row = page.locator("#workers tbody tr").first
    expect(row).to_contain_text(str(os.getpid()))
    expect(row).to_contain_text("s ago")
    shot(page, "workers")
    page.goto(app.url + "/periodic")
    morning = page.locator('#periodic tr[data-name="morning-report"]')
    expect(morning).to_contain_text("America/New_York")
    expect(morning).to_contain_text("06:30:00")
    expect(morning.locator("td").last).to_have_text("code")  # the source column
    expect(page.locator('#periodic tr[data-name="refresh"]')).to_contain_text("UTC")
    shot(page, "periodic")


def test_basic_auth_refused_without_credentials(app: App, browser: Any) -> None:
    anonymous = browser.new_context()
    try:
        answer = anonymous.request.get(app.url + "/secure/api/queues")
        assert answer.status == 401
        assert answer.headers["www-authenticate"].startswith("Basic ")
        # A browser with no credentials to answer the challenge gives up on the page.
        with pytest.raises(sync_api.Error, match="ERR_INVALID_AUTH_CREDENTIALS"):
            anonymous.new_page().goto(app.url + "/secure/")
    finally:
        anonymous.close()
    wrong = browser.new_context(http_credentials={"username": USER, "password": "guess"})
    try:
        assert wrong.new_page().goto(app.url + "/secure/").status == 401
    finally:
        wrong.close()
    allowed = browser.new_context(http_credentials={"username": USER, "password": PASSWORD})
    try:
        page = allowed.new_page()
        assert page.goto(app.url + "/secure/").status == 200
        expect(page.locator('#queues tr[data-queue="reports"]')).to_be_visible()
    finally:
        allowed.close()


def test_filter_the_dead_letters(app: App, page: Any) -> None:
    page.goto(app.url + "/dead-letters")
    row = page.locator(f'#letters tr[data-id="{app.ids[XSS]}"]')
    expect(row).to_be_visible()
    page.locator('#filters select[name="reason"]').select_option("expired")  # filters at once
    expect(row).to_have_count(0)
    expect(page.locator("#letters tbody")).to_have_text("no dead letters")
    expect(page.locator("#dl-summary")).to_contain_text("0 of ")
    page.locator('#filters select[name="reason"]').select_option("")
    page.locator('#filters input[name="task"]').fill("billing.charge")
    page.locator('#filters input[name="q"]').fill("declined for <img")  # the text filter
    page.locator("#filters button").click()
    expect(row).to_be_visible()
    expect(page.locator("#letters tbody tr")).to_have_count(1)  # not ada's, if still there
    page.locator('#filters select[name="older_than"]').select_option("86400")
    expect(row).to_have_count(0)  # it failed seconds ago
    page.locator('#filters select[name="older_than"]').select_option("")
    page.locator('#filters select[name="newer_than"]').select_option("3600")
    page.locator('#filters input[name="error_type"]').fill("RuntimeError")
    page.locator("#filters button").click()
    expect(row).to_be_visible()


def test_purge_asks_for_the_namespace(app: App, page: Any) -> None:
    """Last in the module: it deletes the dead letters the tests above look at."""
    page.goto(app.url + "/dead-letters")
    expect(page.locator(f'#letters tr[data-id="{app.ids[XSS]}"]')).to_be_visible()
    page.locator("#purge-start").click()
    delete = page.locator("#purge-do")
    expect(delete).to_be_disabled()
    page.locator("#purge-input").fill("not-the-namespace")
    expect(delete).to_be_disabled()
    page.locator("#purge-input").fill(app.queue.namespace)
    expect(delete).to_be_enabled()
    delete.click()
    expect(page.locator("#dl-message")).to_have_text("purged 1 dead letter(s)")
    expect(page.locator("#letters tbody")).to_have_text("no dead letters")
    assert off_loop(app.queue.dead_letter_count_sync) == 0
