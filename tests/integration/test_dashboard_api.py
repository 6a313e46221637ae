"""The dashboard's JSON API and pages through httpx's ASGI transport, against a real Redis
and a real Worker; basic auth, mounting under a prefix, escaping; and ``blitzq dashboard``
(its refusal to listen unguarded beyond loopback, and a real served instance)."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

pytest.importorskip("starlette", reason="the dashboard needs the 'dashboard' extra")

from starlette.applications import Starlette
from starlette.routing import Mount

from blitzq import Queue, current_task
from blitzq.cli import cli
from blitzq.dashboard import create_app
from blitzq.records import TaskState
from blitzq.schedules import Cron
from tests.conftest import free_port
from tests.integration.proc_tasks import eventually, make_worker, running
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(60)

XSS = '<script>alert("x")</script><img src=x onerror=alert(1)>'
ROOT = Path(__file__).resolve().parents[2]


def client(app: Any, auth: tuple[str, str] | None = None) -> httpx.AsyncClient:
    """An httpx client calling ``app`` in-process."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dash", auth=auth
    )


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    """A Queue with ``add``, an always failing ``boom`` (no retries) and a periodic entry."""
    q = make_queue()

    @q.task(name="add")
    async def add(a: int, b: int) -> int:
        return a + b

    @q.task(name="steps")
    async def steps(n: int) -> int:
        current_task().update_progress(n, 2 * n, "half <b>way</b>")
        return n

    @q.task(name="boom", retries=0)
    async def boom(payload: str) -> None:
        raise ValueError(f"bad payload {payload}")

    q.add_periodic(add, Cron("0 9 * * 1", tz="America/New_York"), name="weekly", args=(1, 2))
    yield q
    await q.close()


async def dead_letter(queue: Queue, payload: str) -> str:
    """Enqueue ``boom(payload)``, run it with a Worker until it is dead-lettered; its id."""
    handle = await queue.tasks["boom"].enqueue(payload)
    async with running(make_worker(queue, concurrency=2)):
        await eventually(
            lambda: queue.inspect(handle.id),
            lambda r: r is not None and r.state is TaskState.DEAD_LETTERED,
        )
    return handle.id


async def test_queues_overview_counts_waiting_tasks(queue: Queue) -> None:
    for i in range(3):
        await queue.tasks["add"].options(queue="reports").enqueue(i, i)
    async with client(create_app(queue)) as c:
        r = await c.get("/api/queues")
    assert r.status_code == 200
    doc = r.json()
    rows = {row["name"]: row for row in doc["queues"]}
    assert rows["reports"]["waiting"] == 3
    assert rows["reports"]["in_flight"] == 0
    assert doc["namespace"] == queue.namespace
    assert doc["dead_letters"] == 0
    assert set(doc["rates"]) == {"window", "completed", "failed", "completed_per_s", "failed_per_s"}


async def test_task_record_and_unknown_and_bad_ids(queue: Queue) -> None:
    handle = await queue.tasks["add"].enqueue(2, 3)
    stepped = await queue.tasks["steps"].enqueue(3)
    async with running(make_worker(queue)):
        assert await handle.result(timeout=20) == 5
        assert await stepped.result(timeout=20) == 3
        async with client(create_app(queue)) as c:
            doc = (await c.get(f"/api/tasks/{handle.id}")).json()
            progress = (await c.get(f"/api/tasks/{stepped.id}")).json()["progress"]
            missing = await c.get("/api/tasks/no-such-task")
            too_long = await c.get("/api/tasks/" + "x" * 600)
            workers = (await c.get("/api/workers")).json()["workers"]
    assert doc["state"] == "succeeded"
    assert doc["result"] == 5
    assert doc["attempts"] == 1
    assert doc["duration"] is not None
    assert doc["wait"] is not None
    assert doc["progress"] is None
    assert doc["args"] is None  # a default success record keeps no arguments
    assert doc["args_from"] is None
    assert "track_state" in doc["args_note"]
    assert progress["current"] == 3
    assert progress["total"] == 6
    assert progress["fraction"] == 0.5
    assert progress["message"] == "half <b>way</b>"
    assert missing.status_code == 404
    assert "no record" in missing.json()["error"]
    assert too_long.status_code == 400
    assert len(workers) == 1
    w = workers[0]
    assert w["pid"] == os.getpid()
    assert w["concurrency"] >= 1
    assert w["heartbeat_at"] is not None
    assert w["host"]


async def test_a_running_task_known_by_its_progress_has_no_attempts(queue: Queue) -> None:
    release = asyncio.Event()

    @queue.task(name="held")
    async def held() -> str:
        current_task().update_progress(1, 2, "waiting")
        await release.wait()
        return "released"

    handle = await held.enqueue()
    async with running(make_worker(queue)), client(create_app(queue)) as c:

        async def doc() -> Any:
            r = await c.get(f"/api/tasks/{handle.id}")
            return r.json() if r.status_code == 200 else None

        during = await eventually(doc, lambda d: d is not None, timeout=20)
        release.set()
        assert await handle.result(timeout=20) == "released"
        after = await doc()
    # Without track_state there is no record while it runs: its progress is all there is.
    assert during["state"] == "running"
    assert during["progress"]["message"] == "waiting"
    assert during["attempts"] is None  # unknown, not 0
    assert during["started_at"] is None
    assert after["state"] == "succeeded"
    assert after["attempts"] == 1


async def test_a_task_waiting_on_the_schedule_shows_its_arguments(queue: Queue) -> None:
    later = await queue.tasks["add"].options(delay=3600).enqueue(20, b=22)
    async with client(create_app(queue)) as c:
        doc = (await c.get(f"/api/tasks/{later.id}")).json()
    assert doc["state"] == "scheduled"
    assert doc["args"] == [20]
    assert doc["kwargs"] == {"b": 22}
    assert doc["args_from"] == "schedule"
    assert doc["due_at"] is not None


async def test_dead_letters_filter_replay_purge_and_escaping(queue: Queue) -> None:
    first = await dead_letter(queue, XSS)
    second = await dead_letter(queue, "plain")
    async with client(create_app(queue)) as c:
        everything = (await c.get("/api/dead-letters")).json()
        by_text = (await c.get("/api/dead-letters", params={"q": "plain"})).json()
        by_reason = (await c.get("/api/dead-letters", params={"reason": "unknown task"})).json()
        by_task = (await c.get("/api/dead-letters", params={"task": "boom", "limit": 1})).json()
        by_kind = [
            (await c.get("/api/dead-letters", params=params)).json()["matched"]
            for params in (
                {"error_type": "ValueError"},
                {"error_type": "KeyError"},
                {"newer_than": "3600", "queue": "default"},
                {"older_than": "3600"},
            )
        ]
        bad_age = await c.get("/api/dead-letters", params={"older_than": "-1"})
        task = await c.get(f"/api/tasks/{first}")
        bad_limit = await c.get("/api/dead-letters", params={"limit": "0"})
        no_json = await c.post(f"/api/dead-letters/{second}/replay", content=b"{}")
        replayed = await c.post(f"/api/dead-letters/{second}/replay", json={})
        again = await c.post(f"/api/dead-letters/{second}/replay", json={})
        refused = await c.post("/api/dead-letters/purge", json={"confirm": "wrong"})
        purged = await c.post("/api/dead-letters/purge", json={"confirm": queue.namespace})
        page = await c.get("/tasks", params={"id": XSS})
    assert everything["total"] == 2
    assert [d["id"] for d in everything["items"]] == [second, first]  # newest first
    assert [d["id"] for d in by_text["items"]] == [second]
    assert by_reason["matched"] == 0
    assert by_task["matched"] == 2
    assert by_kind == [2, 0, 2, 0]  # the criteria of `blitzq dead-letter list`
    assert bad_age.status_code == 400
    assert len(by_task["items"]) == 1
    # User data comes back verbatim, as JSON that a browser will not sniff as HTML.
    assert task.headers["content-type"].startswith("application/json")
    assert task.headers["x-content-type-options"] == "nosniff"
    doc = task.json()
    assert doc["state"] == "dead_lettered"
    assert doc["args"] == [XSS]
    assert doc["args_from"] == "record"  # a failed record keeps them
    assert XSS in doc["error"]
    assert doc["dead_letter"]["reason"] == "failed"
    assert "ValueError" in (doc["traceback"] or "")
    assert bad_limit.status_code == 400
    assert no_json.status_code == 415
    assert replayed.status_code == 200
    assert replayed.json() == {"replayed": True, "id": second, "queue": "default"}
    assert again.status_code == 404
    assert refused.status_code == 400
    assert purged.json() == {"purged": 1}
    assert await queue.dead_letter_count() == 0
    # A page echoing a searched id escapes it; scripts come from the app only.
    assert page.status_code == 200
    assert "<script>alert" not in page.text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]


async def test_periodic_entries_in_their_time_zone(queue: Queue) -> None:
    async with client(create_app(queue)) as c:
        rows = (await c.get("/api/periodic")).json()["periodic"]
    assert [r["name"] for r in rows] == ["weekly"]
    row = rows[0]
    assert row["tz"] == "America/New_York"
    assert row["next_run_local"].endswith(("-05:00", "-04:00"))
    assert row["next_run_local"][11:19] == "09:00:00"
    assert row["last_run"] is None


async def test_basic_auth_loopback_names_and_mounting_under_a_prefix(queue: Queue) -> None:
    guarded = create_app(queue, basic_auth=("admin", "s3cret"))
    async with client(guarded) as c:
        none = await c.get("/api/queues")
        wrong = await c.get("/api/queues", auth=("admin", "nope"))
        garbage = await c.get("/", headers={"Authorization": "Basic !!!"})
        right = await c.get("/api/queues", auth=("admin", "s3cret"))
    assert none.status_code == 401
    assert none.headers["www-authenticate"].startswith("Basic ")
    assert wrong.status_code == 401
    assert garbage.status_code == 401
    assert right.status_code == 200
    local = create_app(queue, loopback_only=True)
    async with client(local) as c:
        rebound = await c.get("/api/queues", headers={"Host": "evil.example:8080"})
        by_ip = await c.get("/api/queues", headers={"Host": "127.0.0.1:8080"})
        by_v6 = await c.get("/api/queues", headers={"Host": "[::1]:8080"})
        by_name = await c.get("/api/queues", headers={"Host": "localhost"})
    assert rebound.status_code == 421
    assert [r.status_code for r in (by_ip, by_v6, by_name)] == [200, 200, 200]
    host = Starlette(routes=[Mount("/ops/blitzq", app=create_app(queue))])
    async with client(host) as c:
        page = await c.get("/ops/blitzq/dead-letters")
        api = await c.get("/ops/blitzq/api/queues")
    assert page.status_code == 200
    assert 'src="/ops/blitzq/static/app.js"' in page.text
    assert 'data-root="/ops/blitzq"' in page.text
    assert api.status_code == 200


def test_command_refuses_a_public_address_without_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("BLITZQ_DASHBOARD_USER", raising=False)
    monkeypatch.delenv("BLITZQ_DASHBOARD_PASSWORD", raising=False)
    runner = CliRunner()
    result = runner.invoke(cli, ["dashboard", "nowhere:queue", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "BLITZQ_DASHBOARD_USER" in result.output
    monkeypatch.setenv("BLITZQ_DASHBOARD_USER", "admin")
    result = runner.invoke(cli, ["dashboard", "nowhere:queue"])
    assert result.exit_code == 78  # the environment's: a configuration error
    assert "set both" in result.output


def listening_addresses(port: int) -> set[str]:
    """The local addresses a TCP socket listens on at ``port``, from ``/proc/net/tcp{,6}``
    (``127.0.0.1``, ``0.0.0.0``, or an IPv6 address in the kernel's hex)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, _, hex_port = local.partition(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    if len(address) == 8:
                        address = ".".join(str(b) for b in reversed(bytes.fromhex(address)))
                    found.add(address)
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's /proc/net/tcp")
@pytest.mark.parametrize("guarded", [False, True], ids=["no-credentials", "basic-auth"])
def test_command_serves_loopback_only_or_with_basic_auth_anywhere(
    guarded: bool, server_url: str, namespace: str
) -> None:
    """Without credentials ``blitzq dashboard`` listens on 127.0.0.1 only and asks for none
    (and answers loopback names only); with them it asks for basic auth and may listen on
    every address (``--host 0.0.0.0``)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_DASHBOARD_")} | {
        "BLITZQ_REDIS_URL": server_url,
        "BLITZQ_NAMESPACE": namespace,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    args = ["--port", str(port), "--log-level", "warning"]
    if guarded:
        env |= {"BLITZQ_DASHBOARD_USER": "ops", "BLITZQ_DASHBOARD_PASSWORD": "pa:ss word"}
        args += ["--host", "0.0.0.0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "blitzq", "dashboard", "tests.integration.dashboard_app:queue",
         *args],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/api/periodic"

    def answer() -> httpx.Response | None:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        try:
            return httpx.get(url, timeout=2)
        except httpx.TransportError:
            return None

    token = base64.b64encode(b"ops:pa:ss word").decode()
    credentials = {"Authorization": f"Basic {token}"}
    try:
        anonymous = wait_until(answer, 30, "the dashboard to listen")
        bound = listening_addresses(port)
        authorized = httpx.get(url, headers=credentials, timeout=5)
        start = httpx.get(f"http://127.0.0.1:{port}/", headers=credentials, timeout=5)
        by_other_name = httpx.get(url, headers=credentials | {"Host": "dash.example:80"})
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert authorized.status_code == 200
    assert authorized.json()["periodic"][0]["tz"] == "Asia/Tokyo"
    assert start.status_code == 200
    assert 'href="/dead-letters"' in start.text  # the start page links to the dead letters
    if guarded:
        assert anonymous.status_code == 401
        assert anonymous.headers["www-authenticate"].startswith("Basic ")
        assert bound == {"0.0.0.0"}
        assert by_other_name.status_code == 200
        assert "(basic auth)" in err
    else:
        assert anonymous.status_code == 200  # asks for nothing
        assert bound == {"127.0.0.1"}
        assert by_other_name.status_code == 421  # a rebound DNS name is refused
        assert "(no auth: loopback only)" in err
