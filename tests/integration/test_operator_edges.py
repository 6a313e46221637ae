"""Edges an operator met in user-style testing, each turned into the kind it belongs to:

- an action on a queue nothing has used (``blitzq queue pause|resume|purge``, the dashboard's
  buttons): refused with :class:`~blitzq.UnknownQueue` (exit 1), nothing written, unless
  ``--force`` (``"force": true``), instead of a silent ``changed: true`` on a typo;
- a task id that cannot be one (empty, blank, a space or a newline, absurdly long): refused
  where it enters (``inspect``, ``cancel``, ``get_result``, ... and the CLI's TASK_ID, exit 2;
  the dashboard's routes, 400) by the rule enqueue applies to ``task_id``, while every id
  enqueue takes keeps working;
- the commands that free a server at its ``maxmemory`` (``queue purge`` in both modes,
  ``queue resume``, ``dead-letter purge``, ``task cancel`` of a scheduled task) work there: no
  MULTI, which such a server refuses whole.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
import redis
from click.testing import CliRunner, Result

from blitzq import ConfigurationError, Queue, UnknownQueue
from blitzq.cli import cli
from blitzq.client.admin import check_known_queue
from blitzq.limits import MAX_TASK_ID
from blitzq.runtime_schedules import add_schedule
from tests.conftest import SessionRedis

pytestmark = pytest.mark.timeout(120)

#: Ids enqueue refuses, as a user types them (``blitzq task inspect ''``).
BAD_IDS = ["", " ", "a b", "two\nlines", "cr\r", "x{y}", "x" * (MAX_TASK_ID + 1)]
#: Ids a caller may choose at enqueue (``task.options(task_id=...)``).
GOOD_IDS = ["order:42/retry-1", "ünïcødé-😀", "y" * MAX_TASK_ID]


def _runner(url: str, namespace: str) -> Callable[..., Result]:
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(
            cli,
            ["--redis-url", url, "--namespace", namespace, *args],
            env={"BLITZQ_REDIS_URL": None, "BLITZQ_NAMESPACE": None, "COLUMNS": "200"},
            catch_exceptions=False,
        )

    return run


@pytest.fixture
def invoke(server_url: str, namespace: str) -> Callable[..., Result]:
    """``blitzq --redis-url <server> --namespace <ns> ARGS`` in-process (click's runner)."""
    return _runner(server_url, namespace)


@pytest.fixture
def client(server_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(server_url) as c:
        yield c


def _ns_keys(client: redis.Redis, namespace: str) -> set[bytes]:
    return set(client.scan_iter(match="{" + namespace + "}:*", count=1000))


# ------------------------------------------------------------------------- unknown queues
@pytest.mark.parametrize("action", ["pause", "resume", "purge"])
def test_an_action_on_a_queue_nothing_used_is_refused_and_writes_nothing(
    invoke: Callable[..., Result], client: redis.Redis, namespace: str, action: str
) -> None:
    extra = ["--yes"] if action == "purge" else []
    before = _ns_keys(client, namespace)
    result = invoke("queue", action, "emials", *extra)
    assert result.exit_code == 1, result.output
    assert f"unknown queue 'emials' in namespace '{namespace}'" in result.stderr
    assert "--force" in result.stderr
    assert "Traceback" not in result.stderr
    doc = json.loads(invoke("--json", "queue", action, "emials", *extra).stdout)
    assert doc["exit_code"] == 1
    assert doc["error"].startswith("unknown queue 'emials'")
    assert _ns_keys(client, namespace) == before  # no paused set, no registry entry
    # Without --yes the purge refuses before asking.
    if action == "purge":
        asked = invoke("queue", "purge", "emials")
        assert asked.exit_code == 1
        assert "Delete" not in asked.output


def test_force_pauses_a_queue_before_its_first_task_and_resume_then_knows_it(
    invoke: Callable[..., Result], client: redis.Redis, namespace: str
) -> None:
    paused = invoke("--json", "queue", "pause", "fresh", "--force")
    assert json.loads(paused.stdout) == {"queue": "fresh", "paused": True, "changed": True}
    assert client.smembers("{" + namespace + "}:paused") == {b"fresh"}
    resumed = invoke("--json", "queue", "resume", "fresh")  # known: it is paused
    assert json.loads(resumed.stdout) == {"queue": "fresh", "paused": False, "changed": True}
    assert invoke("queue", "resume", "fresh").exit_code == 1  # unknown again
    forced = invoke("--json", "queue", "resume", "fresh", "--force")
    assert json.loads(forced.stdout)["changed"] is False
    purged = invoke("--json", "queue", "purge", "fresh", "--yes", "--force")
    assert json.loads(purged.stdout) == {
        "queue": "fresh",
        "purged": 0,
        "delayed_purged": 0,
        "delayed_left": 0,
    }


async def test_a_queue_is_known_by_its_registry_its_levels_and_its_messages(
    make_queue: Callable[..., Queue], client: redis.Redis, namespace: str
) -> None:
    q = make_queue(name="emails")

    @q.task(name="send")
    async def send() -> None: ...

    broker = q.broker
    try:
        with pytest.raises(UnknownQueue) as caught:
            await check_known_queue(broker, namespace, "emails")
        assert (caught.value.queue, caught.value.namespace) == ("emails", namespace)
        assert isinstance(caught.value, LookupError)
        await send.options(priority="high").enqueue()  # registers emails:high only
        for name in ("emails", "emails:high", "emails:low"):
            await check_known_queue(broker, namespace, name)
        # The registry lost (FLUSH of that key): a waiting message still makes it known.
        client.delete("{" + namespace + "}:queues")
        await check_known_queue(broker, namespace, "emails")
        assert await q.purge_queue("emails:high") == 1
        with pytest.raises(UnknownQueue):
            await check_known_queue(broker, namespace, "emails")
        # The Python purge stays what it always was: idempotent, 0 for nothing there.
        assert await q.purge_queue("never-used") == 0
    finally:
        await q.close()


async def test_a_queue_a_worker_serves_is_known(make_queue: Callable[..., Queue]) -> None:
    q = make_queue(name="served")
    try:
        await q.broker.prepare_consumer(["served:high", "served", "served:low"], "w-1")
        await check_known_queue(q.broker, q.namespace, "served")
    finally:
        await q.close()


@pytest.fixture
async def dashboard(make_queue: Callable[..., Queue]) -> AsyncIterator[httpx.AsyncClient]:
    pytest.importorskip("starlette", reason="the dashboard needs the 'dashboard' extra")
    from blitzq.dashboard import create_app

    q = make_queue()  # named "default"

    @q.task(name="report", queue="reports")
    async def report() -> None: ...

    app = create_app(q)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as c:
        yield c
    await q.close()


async def test_the_dashboard_refuses_an_unknown_queue_unless_forced(
    dashboard: httpx.AsyncClient, client: redis.Redis, namespace: str
) -> None:
    for action in ("pause", "resume", "purge"):
        r = await dashboard.post(f"/api/queues/emials/{action}", json={"confirm": "emials"})
        assert r.status_code == 404, r.text
        assert r.json()["error"].startswith("unknown queue 'emials'")
    assert not client.exists("{" + namespace + "}:paused")
    forced = {"confirm": "emials", "force": True}
    r = await dashboard.post("/api/queues/emials/pause", json=forced)
    assert r.json() == {"queue": "emials", "paused": True, "changed": True}
    r = await dashboard.post("/api/queues/emials/resume", json={"confirm": "emials"})
    assert r.json() == {"queue": "emials", "paused": False, "changed": True}
    # The application's own queues (its name, its tasks') are known before their first task.
    for name in ("default", "reports"):
        r = await dashboard.post(f"/api/queues/{name}/pause", json={"confirm": name})
        assert r.json() == {"queue": name, "paused": True, "changed": True}


# ------------------------------------------------------------------------------ task ids
@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda b: repr(b)[:12])
async def test_every_lookup_refuses_an_id_enqueue_refuses(
    make_queue: Callable[..., Queue], bad: str
) -> None:
    q = make_queue()
    calls: dict[str, Callable[[], Any]] = {
        "inspect": lambda: q.inspect(bad),
        "cancel": lambda: q.cancel(bad),
        "get_result": lambda: q.get_result(bad, timeout=0.1),
        "get_results": lambda: q.get_results(["ok", bad], timeout=0.1),
        "get_progress": lambda: q.get_progress(bad),
        "retry": lambda: q.retry(bad),
        "watch_progress": lambda: anext(q.watch_progress(bad, timeout=1)),
    }
    try:
        for name, call in calls.items():
            with pytest.raises(ConfigurationError, match="task id must"):
                await call()
            assert name
    finally:
        await q.close()


@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda b: repr(b)[:12])
def test_the_sync_twins_refuse_it_too(make_queue: Callable[..., Queue], bad: str) -> None:
    q = make_queue()
    try:
        with pytest.raises(ConfigurationError, match="task id must"):
            q.inspect_sync(bad)
        with pytest.raises(ConfigurationError, match="task id must"):
            q.cancel_sync(bad)
        with pytest.raises(ConfigurationError, match="task id must"):
            q.get_result_sync(bad, timeout=0.1)
    finally:
        q.close_sync()


async def test_ids_a_caller_chose_at_enqueue_keep_working(
    make_queue: Callable[..., Queue],
) -> None:
    q = make_queue(track_state=True)

    @q.task(name="t")
    async def t() -> None: ...

    try:
        with pytest.raises(ConfigurationError, match=f"at most {MAX_TASK_ID} characters"):
            await t.options(task_id="z" * (MAX_TASK_ID + 1)).enqueue()
        for ident in GOOD_IDS:
            handle = await t.options(task_id=ident, delay=3600).enqueue()
            assert handle.id == ident
            record = await q.inspect(ident)
            assert record is not None
            assert record.state.value == "scheduled"
            assert await q.cancel(ident) == "scheduled"
            assert await q.get_progress(ident) is None
    finally:
        await q.close()


@pytest.mark.parametrize(
    "args",
    [
        ["task", "inspect"],
        ["task", "cancel"],
        ["dead-letter", "show"],
        ["dead-letter", "replay"],
    ],
    ids=" ".join,
)
@pytest.mark.parametrize("bad", BAD_IDS, ids=lambda b: repr(b)[:12])
def test_the_cli_refuses_a_bad_task_id_with_exit_2(
    invoke: Callable[..., Result], args: list[str], bad: str
) -> None:
    result = invoke(*args, bad)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: TASK_ID must"), result.stderr
    assert "Traceback" not in result.stderr
    doc = json.loads(invoke("--json", *args, bad).stdout)
    assert doc["exit_code"] == 2
    assert doc["error"].startswith("TASK_ID must")


def test_the_cli_takes_a_caller_chosen_id(
    invoke: Callable[..., Result], make_queue: Callable[..., Queue]
) -> None:
    q = make_queue()

    @q.task(name="t")
    async def t() -> None: ...

    try:
        for ident in GOOD_IDS:
            t.options(task_id=ident, delay=3600).enqueue_sync()
            shown = invoke("--json", "task", "inspect", ident)
            assert shown.exit_code == 0, shown.output
            assert json.loads(shown.stdout)["id"] == ident
            cancelled = invoke("--json", "task", "cancel", ident)
            assert json.loads(cancelled.stdout) == {
                "id": ident, "was": "scheduled", "cancelled": True
            }  # fmt: skip
        missing = invoke("dead-letter", "show", GOOD_IDS[0])
        assert missing.exit_code == 1  # a valid id with no dead letter: not a usage error
    finally:
        q.close_sync()


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["schedule", "remove", ""], "schedule name must be a non-empty string"),
        (["schedule", "remove", "a b"], "schedule name must be a non-empty string"),
        (["worker", "shutdown", ""], "ID must be a worker id"),
        (["worker", "shutdown", " "], "ID must be a worker id"),
    ],
    ids=repr,
)
def test_other_names_an_operator_types_are_checked_the_same_way(
    invoke: Callable[..., Result], args: list[str], start: str
) -> None:
    result = invoke("--json", *args)
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout)["error"].startswith(start)
    # A name that passes, of nothing there: a failed operation (1), not a usage error.
    valid = [*args[:2], "nosuch"]
    assert invoke(*valid).exit_code == 1


async def test_the_dashboard_refuses_a_bad_task_id_with_400(
    dashboard: httpx.AsyncClient,
) -> None:
    # (A newline, %0A, never matches the route: 404 before the check.)
    for bad in ["%20", "a%20b", "cr%0D", "x%7By%7D", "x" * (MAX_TASK_ID + 1)]:
        r = await dashboard.get(f"/api/tasks/{bad}")
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"].startswith("not a task id: task id must"), r.text
        r = await dashboard.post(f"/api/tasks/{bad}/cancel", json={"confirm": bad})
        assert r.status_code == 400, (bad, r.text)
    assert (await dashboard.get("/api/tasks/order:42")).status_code == 404  # valid, unknown


# ---------------------------------------------------------------------- a full server
@pytest.fixture
def full_server(namespace: str) -> Iterator[tuple[str, dict[str, str]]]:
    """A private ``redis-server`` holding ``namespace``'s waiting messages in both modes (a
    reliable queue ``rq``, a fast queue ``fq``), three dead letters and a scheduled task,
    then set to ``maxmemory`` 1 byte under ``noeviction``: every write is refused with OOM.
    Yields its URL and the ids: ``{"scheduled": <id>}``."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary")
    server = SessionRedis(binary)
    try:
        assert server.wait_ready()
        ids: dict[str, str] = {}
        for mode, name in (("reliable", "rq"), ("fast", "fq")):
            q = Queue(redis_url=server.url, namespace=namespace, name=name, mode=mode)  # type: ignore[arg-type]
            try:
                for i in range(4):
                    q.send_sync("t", (i,), {}, priority="high" if i == 0 else "normal")
                if mode == "reliable":
                    ids["scheduled"] = q.send_sync("t", (), {}, delay=3600).id
                    q._portal.call(add_schedule(q, "nightly", "t", every=86400))
            finally:
                q.close_sync()
        with redis.Redis.from_url(server.url) as c:
            ns = "{" + namespace + "}"
            for i in range(3):  # dead letters as the worker stores them (dead_letters.lua)
                c.zadd(f"{ns}:dlq", {f"dead-{i}": 1.0 + i})
                c.hset(f"{ns}:d:dead-{i}", mapping={"r": "malformed message", "e": "x"})
            c.sadd(f"{ns}:paused", "rq")
            c.config_set("maxmemory-policy", "noeviction")
            c.config_set("maxmemory", 1)
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                c.set(f"{ns}:probe", 1)
        yield server.url, ids
    finally:
        server.stop()


def test_what_frees_a_full_server_works_on_it(
    full_server: tuple[str, dict[str, str]], namespace: str
) -> None:
    url, ids = full_server
    ns = "{" + namespace + "}"
    invoke = _runner(url, namespace)
    with redis.Redis.from_url(url) as c:
        for name, mode in (("rq", "reliable"), ("fq", "fast")):
            done = invoke("--mode", mode, "--json", "queue", "purge", name, "--yes")
            assert done.exit_code == 0, done.output
            left = 1 if name == "rq" else 0  # rq's delayed task stays, and is counted
            assert json.loads(done.stdout) == {
                "queue": name,
                "purged": 4,
                "delayed_purged": 0,
                "delayed_left": left,
            }
        assert not c.exists(f"{ns}:l:fq", f"{ns}:l:fq:high", f"{ns}:l:rq:high")
        assert c.xlen(f"{ns}:s:rq") == 0
        resumed = invoke("--json", "queue", "resume", "rq")
        assert resumed.exit_code == 0, resumed.output
        assert json.loads(resumed.stdout)["changed"] is True
        assert not c.sismember(f"{ns}:paused", "rq")
        cancelled = invoke("--json", "task", "cancel", ids["scheduled"])
        assert json.loads(cancelled.stdout)["was"] == "scheduled", cancelled.output
        assert c.zcard(f"{ns}:sched") == 0
        purged = invoke("--json", "dead-letter", "purge", "--yes")
        assert purged.exit_code == 0, purged.output
        assert not c.exists(f"{ns}:dlq")
        removed = invoke("--json", "schedule", "remove", "nightly")
        assert json.loads(removed.stdout) == {"removed": True, "name": "nightly"}, removed.output
        assert not c.exists(f"{ns}:periodic:rt")
        # A pause is a write: the full server refuses it, one line, and nothing changes.
        paused = invoke("queue", "pause", "rq")
        assert paused.exit_code == 1
        assert "OutOfMemoryError" in paused.stderr
        assert not c.exists(f"{ns}:paused")
