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
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from blitzq import Queue, RetryPolicy, TaskState, Worker, current_task
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
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
NO_VALUE = "\u2013"  # what the pages show for a value they do not have (an en dash)

sync_api.expect.set_options(timeout=20_000)
expect = sync_api.expect


def shot(page: Any, name: str) -> None:
    """Save ``page`` as ``docs/images/dashboard-<name>.png`` when screenshots are asked for."""
    if SCREENSHOTS:
        page.screenshot(path=str(IMAGES / f"dashboard-{name}.png"), full_page=True)


class App:
    """The server under test: its URL, Queue, a raw Redis client, the Worker and the tasks'
    ids."""

    def __init__(self, url: str, queue: Queue, raw: redis.Redis, flag: str, worker: Worker) -> None:
        self.url = url
        self.queue = queue
        self.raw = raw
        self.flag = flag
        self.worker = worker
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


def paused(app: App) -> set[str]:
    """The paused queues, read from Redis."""
    key = "{" + app.queue.namespace + "}:paused"
    return {m.decode() for m in app.raw.smembers(key)}


def field(page: Any, name: str) -> Any:
    """The value shown on the task page for the API's field ``name`` (its ``dd``)."""
    return page.locator(f'#task dd[data-field="{name}"]')


def when(ts: float) -> str:
    """A Unix time as the pages show it (``time()`` in app.js: whole milliseconds, in the
    browser's zone with its name, UTC in these tests)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(ts * 1000) // 1000))


def span(s: float) -> str:
    """A number of seconds as the pages show it (``seconds()`` in app.js)."""
    return f"{s * 1000:.1f} ms" if s < 1 else f"{s:.3f} s"


class Gate:
    """A ``reports.stepped`` task in the ``gated`` queue that reports progress step by step,
    each step waiting (BLPOP) on a Redis list until the test opens it."""

    def __init__(self, app: App, steps: int) -> None:
        self.app = app
        self.steps = steps
        self.key = f"{{{app.queue.namespace}}}:test:gate:{uuid.uuid4().hex[:8]}"
        stepped = app.queue.tasks["reports.stepped"]
        self.id = off_loop(lambda: stepped.enqueue_sync(self.key, steps)).id

    def open(self, times: int = 1) -> None:
        """Let the task past ``times`` more steps."""
        self.app.raw.rpush(self.key, *([1] * times))


@contextlib.contextmanager
def gated(app: App, steps: int = 1) -> Iterator[Gate]:
    """Enqueue a gated task; on exit open its every step, so that it ends whatever the test
    did (the tests wait for its end themselves)."""
    gate = Gate(app, steps)
    try:
        yield gate
    finally:
        gate.open(steps)


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
    """A Queue with a task that fails until a Redis flag is set, one that fails for good, a
    gated one reporting progress, a Worker, and the server."""
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

    @queue.task(name="billing.refund", retries=1, retry_policy=RetryPolicy(base=0.05),
                dead_letter=False)  # fmt: skip
    async def refund(customer: str, cents: int) -> None:
        raise ValueError(f"refund of {cents} cents over the limit for {customer}")

    @queue.task(name="reports.broken", retries=0)
    async def broken(n: int) -> None:
        raise LookupError(f"no report {n}")

    @queue.task(name="reports.stepped", queue="gated")
    async def stepped(gate: str, steps: int) -> str:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(redis_url)
        try:
            for n in range(1, steps + 1):
                current_task().update_progress(n, steps, f"step {n} of {steps}")
                if await client.blpop([gate], timeout=60) is None:
                    raise TimeoutError(f"gate {gate} never opened")
        finally:
            await client.aclose()
        return f"{steps} steps"

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
        with (
            worker_thread(queue, queues=["default", "gated"], concurrency=4) as worker,
            serving(host) as url,
        ):
            state = App(url, queue, raw, flag, worker)
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
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (its own context, in UTC) that fails the test on any script error."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, timezone_id="UTC")
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


def test_start_page_shows_scheduled_and_running_counts_live(app: App, page: Any) -> None:
    scheduled_before = off_loop(app.queue.stats_sync)["scheduled"]
    page.goto(app.url + "/")
    page.evaluate("window.__same_page = 1")  # gone if the page reloads
    scheduled, running = page.locator("#s-scheduled"), page.locator("#s-running")
    expect(scheduled).to_have_text(str(scheduled_before))
    expect(running).to_have_text("0")
    build = app.queue.tasks["reports.build"]
    later = off_loop(lambda: build.options(delay=3600).enqueue_sync("next-year"))
    expect(scheduled).to_have_text(str(scheduled_before + 1))
    with gated(app) as gate:
        row = page.locator('#queues tr[data-queue="gated"]')
        expect(row.locator("td.running")).to_have_text("1")  # taken, not yet acknowledged
        expect(row.locator("td.waiting")).to_have_text("0")
        expect(running).to_have_text("1")  # the workers' count
        gate.open()
        expect(row.locator("td.running")).to_have_text("0")
        expect(running).to_have_text("0")
    assert off_loop(lambda: app.queue.cancel_sync(later.id)) == "scheduled"
    expect(scheduled).to_have_text(str(scheduled_before))
    assert page.evaluate("window.__same_page") == 1
    wait_until(lambda: state(app, gate.id) is TaskState.SUCCEEDED, 30, "the gated task to end")


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


def test_a_failed_task_shows_its_error_traceback_attempts_and_timings(app: App, page: Any) -> None:
    refund = app.queue.tasks["billing.refund"]
    task_id = off_loop(lambda: refund.enqueue_sync("grace", 990)).id
    wait_until(lambda: state(app, task_id) is TaskState.FAILED, 30, "the refund to fail")
    record = off_loop(lambda: app.queue.inspect_sync(task_id))
    assert record is not None
    started, enqueued, finished = record.started_at, record.enqueued_at, record.finished_at
    assert started is not None
    assert enqueued is not None
    assert finished is not None
    page.goto(app.url + "/tasks")
    page.locator("#task-id").fill(task_id)
    page.locator("#search button").click()
    expect(page.locator("#task-state")).to_have_text("failed")
    message = "refund of 990 cents over the limit for grace"
    expect(field(page, "error")).to_have_text(f"ValueError: {message}")
    traceback = page.locator("#task-traceback")
    expect(traceback).to_contain_text("Traceback (most recent call last)")
    expect(traceback).to_contain_text(", in refund")  # the task's own frame
    expect(traceback).to_contain_text(f"ValueError: {message}")
    expect(field(page, "attempts")).to_have_text("2")  # the first run and its one retry
    expect(field(page, "enqueued_at")).to_have_text(when(enqueued))
    expect(field(page, "started_at")).to_have_text(when(started))  # the last attempt's
    expect(field(page, "finished_at")).to_have_text(when(finished))
    expect(field(page, "wait")).to_have_text(span(started - enqueued))
    expect(field(page, "duration")).to_have_text(span(finished - started))
    expect(field(page, "worker")).to_have_text(app.worker.id)
    expect(page.locator("#task-args")).to_have_text('["grace",990]')  # a failed record keeps them
    expect(field(page, "result")).to_have_count(0)
    expect(field(page, "dead_letter")).to_have_count(0)  # dead_letter=False


def test_a_running_task_shows_its_progress_live(app: App, page: Any) -> None:
    with gated(app, steps=3) as gate:
        page.goto(f"{app.url}/tasks/{gate.id}")
        page.evaluate("window.__same_page = 1")  # gone if the page reloads
        progress = field(page, "progress")
        expect(page.locator("#task-state")).to_have_text("running")
        expect(progress.locator(".done")).to_have_text("1 / 3")
        expect(progress.locator(".message")).to_have_text("step 1 of 3")
        expect(progress.locator("progress")).to_have_js_property("value", 1 / 3)
        # Without track_state a running task has no record: known by its progress only.
        expect(field(page, "attempts")).to_have_text(NO_VALUE)
        # The time since the report keeps counting while the task waits at its gate.
        since = progress.locator(".ago").inner_text()
        expect(progress.locator(".ago")).not_to_have_text(since)
        expect(progress.locator(".done")).to_have_text("1 / 3")
        gate.open()
        expect(progress.locator(".done")).to_have_text("2 / 3")
        expect(progress.locator(".message")).to_have_text("step 2 of 3")
        expect(progress.locator("progress")).to_have_js_property("value", 2 / 3)
        gate.open(2)
        expect(page.locator("#task-state")).to_have_text("succeeded")
        expect(progress.locator(".done")).to_have_text("3 / 3")
        expect(field(page, "result")).to_have_text('"3 steps"')
        expect(field(page, "attempts")).to_have_text("1")
    assert page.evaluate("window.__same_page") == 1


def test_workers_page_shows_each_live_worker(app: App, page: Any) -> None:
    worker = app.worker
    page.goto(app.url + "/workers")
    page.evaluate("window.__same_page = 1")  # gone if the page reloads
    row = page.locator(f'#workers tr[data-id="{worker.id}"]')
    expect(row.locator("td.id")).to_have_text(worker.id)
    expect(row.locator("td.host")).to_have_text(socket.gethostname())
    expect(row.locator("td.pid")).to_have_text(str(os.getpid()))
    expect(row.locator("td.queues")).to_have_text("default, gated")
    expect(row.locator("td.concurrency")).to_have_text("4")
    expect(row.locator("td.running")).to_have_text("0")
    heartbeat = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+ s ago\)$")
    expect(row.locator("td.heartbeat")).to_have_text(heartbeat)
    with gated(app) as gate:
        expect(row.locator("td.running")).to_have_text("1")  # reported within a second
        shot(page, "workers")
        gate.open()
        expect(row.locator("td.running")).to_have_text("0")
    assert page.evaluate("window.__same_page") == 1


def test_periodic_page(app: App, page: Any) -> None:
    page.goto(app.url + "/periodic")
    morning = page.locator('#periodic tr[data-name="morning-report"]')
    expect(morning).to_contain_text("America/New_York")
    expect(morning).to_contain_text("06:30:00")
    expect(morning.locator("td").nth(8)).to_have_text("code")  # the source column
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


def test_task_list_filters_pages_and_cancels_with_a_confirmation(app: App, page: Any) -> None:
    build = app.queue.tasks["reports.build"]
    handles = off_loop(lambda: [build.enqueue_sync(f"list-{n}") for n in range(30)])
    wait_until(
        lambda: all(state(app, h.id) is TaskState.SUCCEEDED for h in handles[-1:]),
        30,
        "the listed tasks to end",
    )
    page.goto(app.url + "/tasks")
    rows = page.locator("#task-list tbody tr[data-id]")
    expect(rows).to_have_count(25)  # a page
    expect(page.locator("#list-note")).to_contain_text("index of its newest 10000")
    page.locator('#list-filters select[name="state"]').select_option("succeeded")
    page.locator('#list-filters input[name="task"]').fill("reports.build")
    page.locator("#list-filters button").click()
    expect(rows).to_have_count(25)
    first_page = rows.first.get_attribute("data-id")
    page.locator("#list-next").click()
    expect(page.locator("#list-page")).to_contain_text("page 2")
    expect(rows.first).not_to_have_attribute("data-id", first_page or "")
    expect(page.locator("#list-first")).to_be_enabled()
    page.locator("#list-first").click()
    expect(page.locator("#list-page")).to_contain_text("page 1")
    # The id search finds one task; the row links to its queue's page.
    page.locator('#list-filters input[name="q"]').fill(handles[7].id[:14])
    page.locator("#list-filters button").click()
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td.id")).to_have_text(handles[7].id)
    # A scheduled task is cancelled after its confirmation.
    later = off_loop(lambda: build.options(delay=3600).enqueue_sync("cancel-me"))
    page.locator('#list-filters input[name="q"]').fill("cancel-me")
    page.locator('#list-filters input[name="task"]').fill("")
    page.locator('#list-filters select[name="state"]').select_option("scheduled")
    row = page.locator(f'#task-list tr[data-id="{later.id}"]')
    expect(row).to_be_visible()
    row.locator("button.act").click()
    expect(row.locator("button.confirm")).to_have_text("Confirm cancel")
    row.locator("button.confirm").click()
    expect(page.locator("#list-message")).to_contain_text(f"task {later.id}: scheduled")
    expect(row).to_have_count(0)
    assert state(app, later.id) is TaskState.CANCELLED


def test_a_queue_page_pauses_and_resumes_with_a_confirmation(app: App, page: Any) -> None:
    page.goto(app.url + "/")
    page.locator('#queues tr[data-queue="reports"] td a').click()
    expect(page).to_have_url(app.url + "/queues/reports")
    expect(page.locator("#q-waiting")).to_have_text(re.compile(r"^\d+$"))
    expect(page.locator("#q-state")).to_have_text("active")
    page.locator('[data-action="pause:reports"] button.act').click()
    page.locator('[data-action="pause:reports"] button.confirm').click()
    expect(page.locator("#q-state")).to_have_text("paused")
    assert "reports" in paused(app)
    page.locator('[data-action="resume:reports"] button.act').click()
    page.locator('[data-action="resume:reports"] button.confirm').click()
    expect(page.locator("#list-message")).to_have_text("queue reports resumed")
    expect(page.locator("#q-state")).to_have_text("active")


def test_a_poll_between_press_and_release_does_not_eat_the_click(app: App, page: Any) -> None:
    """The page re-renders when a poll brings new figures; a render while a button is held
    down used to replace the button, so the release clicked nothing (a CI failure)."""
    build = app.queue.tasks["reports.build"]
    page.goto(app.url + "/queues/reports")
    expect(page.locator("#q-state")).to_have_text("active")
    page.locator('[data-action="pause:reports"] button.act').click()
    confirm = page.locator('[data-action="pause:reports"] button.confirm')
    box = confirm.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    # New figures arrive while the button is held: two polls answer after the enqueue.
    polls = int(page.locator("body").get_attribute("data-polls") or 0)
    off_loop(lambda: build.options(queue="reports").enqueue_sync("held"))
    wait_until(
        lambda: int(page.locator("body").get_attribute("data-polls") or 0) >= polls + 3,
        30,
        "polls after the enqueue",
    )
    page.mouse.up()
    expect(page.locator("#list-message")).to_have_text("queue reports paused")
    expect(page.locator("#q-state")).to_have_text("paused")
    page.locator('[data-action="resume:reports"] button.act').click()
    page.locator('[data-action="resume:reports"] button.confirm').click()
    expect(page.locator("#q-state")).to_have_text("active")


def test_dead_letter_pager_and_replay_all_matching(app: App, page: Any) -> None:
    broken = app.queue.tasks["reports.broken"]
    before = off_loop(app.queue.dead_letter_count_sync)
    off_loop(lambda: [broken.enqueue_sync(n) for n in range(55)])
    wait_until(
        lambda: off_loop(app.queue.dead_letter_count_sync) == before + 55, 30, "55 dead letters"
    )
    page.goto(app.url + "/dead-letters")
    expect(page.locator("#letters tbody tr[data-id]")).to_have_count(50)
    expect(page.locator("#dl-page")).to_have_text(f"1{NO_VALUE}50 of {before + 55}")
    page.locator("#dl-next").click()
    expect(page.locator("#dl-page")).to_have_text(f"51{NO_VALUE}{before + 55} of {before + 55}")
    expect(page.locator("#dl-next")).to_be_disabled()
    page.locator("#dl-prev").click()
    expect(page.locator("#dl-page")).to_have_text(f"1{NO_VALUE}50 of {before + 55}")
    # Replay all the matching ones (they fail again: dead letters again, with new times).
    page.locator('#filters input[name="task"]').fill("reports.broken")
    page.locator("#filters button").click()
    expect(page.locator("#dl-summary")).to_contain_text(f"55 of {before + 55}")
    page.locator("#replay-all-start").click()
    expect(page.locator("#replay-all-do")).to_contain_text("replay all 55 matching")
    page.locator("#replay-all-do").click()
    # Those a worker dead-lettered again before the batch ended are counted apart (F7).
    done = (
        r"replayed 55 of 55 matching dead letter\(s\)"
        r"( \(\d+ of them dead-lettered again already\))?"
    )
    expect(page.locator("#dl-message")).to_have_text(re.compile(done))
    wait_until(
        lambda: off_loop(app.queue.dead_letter_count_sync) == before + 55, 30, "failed again"
    )
    after = off_loop(lambda: app.queue.tasks["reports.build"].enqueue_sync("after"))
    page.goto(app.url + "/tasks")  # the recent list: dead letters and successes together
    expect(page.locator(f'#task-list tr[data-id="{after.id}"]')).to_be_visible()
    dead = page.locator('#task-list tr[data-state="dead_lettered"]').first
    expect(dead.locator("td.args")).to_have_text(re.compile(r"^\[\d+\]$"))  # its record's
    shot(page, "task-list")
    off_loop(lambda: app.queue.purge_dead_letters_sync(task="reports.broken"))


def test_worker_resize_and_periodic_run_now_with_confirmations(app: App, page: Any) -> None:
    worker = app.worker
    page.goto(app.url + "/workers")
    row = page.locator(f'#workers tr[data-id="{worker.id}"]')
    row.locator("input.size").fill("6")
    row.locator(f'[data-action="resize:{worker.id}"] button.act').click()
    row.locator(f'[data-action="resize:{worker.id}"] button.confirm').click()
    expect(page.locator("#workers-message")).to_contain_text("to run 6 at once")
    expect(row.locator("td.concurrency")).to_have_text("6")
    row.locator("input.size").fill("4")
    row.locator(f'[data-action="resize:{worker.id}"] button.act').click()
    row.locator(f'[data-action="resize:{worker.id}"] button.confirm').click()
    expect(row.locator("td.concurrency")).to_have_text("4")
    page.goto(app.url + "/periodic")
    entry = page.locator('#periodic tr[data-name="refresh"]')
    entry.locator('[data-action="run:refresh"] button.act').click()
    entry.locator('[data-action="run:refresh"] button.confirm').click()
    expect(page.locator("#periodic-message")).to_contain_text("sent refresh as task ")
    entry.locator('[data-action="ppause:refresh"] button.act').click()
    entry.locator('[data-action="ppause:refresh"] button.confirm').click()
    expect(entry).to_contain_text("paused")
    shot(page, "periodic")
    entry.locator('[data-action="presume:refresh"] button.act').click()
    entry.locator('[data-action="presume:refresh"] button.confirm').click()
    expect(entry.locator(".state")).to_have_count(0)


def test_charts_page(app: App, page: Any) -> None:
    page.goto(app.url + "/charts")
    expect(page.locator("figure.chart-box")).to_have_count(5)
    expect(page.locator('figure[data-chart="Throughput (tasks / s)"] svg')).to_be_visible()
    shot(page, "charts")


@pytest.mark.parametrize(
    "path", ["/", "/tasks", "/queues/reports", "/charts", "/dead-letters", "/workers", "/periodic"]
)
def test_pages_hold_on_a_390px_phone(app: App, browser: Any, path: str) -> None:
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, timezone_id="UTC", is_mobile=True
    )
    try:
        page = context.new_page()
        page.goto(app.url + path)
        expect(page.locator("#status")).to_have_class("ok")  # the first poll answered
        if path == "/tasks":
            expect(page.locator("#task-list tbody tr[data-id]").first).to_be_visible()
            shot(page, "phone-tasks")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{path}: the page is {width} px wide"
        # An id cell is one line, not a column of single characters.
        # (Measured in one go: the live list may re-render between two calls.)
        high = page.evaluate(
            "Math.max(0, ...[...document.querySelectorAll('td.id a')].map("
            "(a) => a.getBoundingClientRect().height))"
        )
        assert high < 30, f"{path}: an id {high} px high"
    finally:
        context.close()


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
    expect(page.locator("#dl-message")).to_contain_text("purged ")
    expect(page.locator("#letters tbody")).to_have_text("no dead letters")
    assert off_loop(app.queue.dead_letter_count_sync) == 0
