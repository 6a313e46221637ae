"""What a new user met at the dashboard's edges: ``blitzq dashboard`` against a broker that is
down or refuses the password (one line, exit 1), the API's dead-letter reason filter (400 for
an unknown reason), and run-time schedules on the periodic page (with their source)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette", reason="the dashboard needs the 'dashboard' extra")

from blitzq import ConfigurationError, Queue
from blitzq.dashboard import create_app
from blitzq.dead_letters import DEAD_LETTER_REASONS
from blitzq.runtime_schedules import add_schedule
from tests.conftest import free_port
from tests.integration.test_cli_ops import ROOT, subprocess_env

pytestmark = pytest.mark.timeout(60)

APP = "tests.integration.dashboard_app:queue"


def _dashboard(url: str) -> subprocess.CompletedProcess[str]:
    """``blitzq --redis-url URL dashboard APP --port <free>``, run to its end."""
    port = str(free_port())
    return subprocess.run(
        [sys.executable, "-m", "blitzq", "--redis-url", url, "dashboard", APP, "--port", port],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=45,
    )


@pytest.mark.parametrize(
    ("url", "shown", "error"),
    [
        ("redis://127.0.0.1:{port}", "redis://127.0.0.1:{port}", "ConnectionError"),
        (
            "redis://nobody:wrong@127.0.0.1:6379/0",
            "redis://nobody:***@127.0.0.1:6379/0",
            "AuthenticationError",
        ),
    ],
    ids=["unreachable", "wrong-password"],
)
def test_dashboard_command_checks_the_broker_before_serving(
    url: str, shown: str, error: str, redis_url: str
) -> None:
    if "6379" in url and not redis_url.startswith("redis://127.0.0.1:6379"):
        pytest.skip("the wrong-password case needs the shared server at 127.0.0.1:6379")
    port = free_port()
    done = _dashboard(url.format(port=port))
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert lines[0].startswith(f"Error: broker error ({shown.format(port=port)}): {error}")
    assert "wrong" not in done.stderr  # the password is masked


async def _serve(app: Any) -> tuple[asyncio.Task[None], asyncio.Queue[dict[str, str]]]:
    """Run ``app``'s lifespan startup; return its task and its inbox (for the shutdown)."""
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    started = asyncio.get_running_loop().create_future()

    async def send(message: dict[str, Any]) -> None:
        if not started.done() and message["type"].startswith("lifespan.startup"):
            started.set_result(message["type"])

    await inbox.put({"type": "lifespan.startup"})
    task = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, send)
    )
    assert await asyncio.wait_for(started, 20) == "lifespan.startup.complete"
    return task, inbox


async def test_a_dashboard_whose_broker_is_down_still_starts_and_answers_503() -> None:
    queue = Queue(redis_url=f"redis://127.0.0.1:{free_port()}/0", namespace="edges")
    app = create_app(queue)
    task, inbox = await _serve(app)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dash") as c:
            r = await c.get("/api/queues")
            page = await c.get("/")
        assert r.status_code == 503
        assert r.json()["error"].startswith("BrokerError: ConnectionError")
        assert page.status_code == 200
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(task, 20)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    q = make_queue()

    @q.task(name="add")
    async def add(a: int, b: int) -> int:
        return a + b

    q.add_periodic(add, 3600.0, name="hourly", args=(1, 2))
    yield q
    await q.close()


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")


async def test_dead_letter_api_refuses_an_unknown_reason(queue: Queue) -> None:
    async with _client(create_app(queue)) as c:
        bogus = await c.get("/api/dead-letters", params={"reason": "bogus"})
        typo = await c.get("/api/dead-letters", params={"reason": "unknown-task"})
        expired = await c.get("/api/dead-letters", params={"reason": "expired"})
        page = await c.get("/dead-letters")
    for refused in (bogus, typo):
        assert refused.status_code == 400
        assert all(r in refused.json()["error"] for r in DEAD_LETTER_REASONS)
    assert expired.status_code == 200
    assert expired.json()["items"] == []
    for reason in DEAD_LETTER_REASONS:  # the page's reason filter offers every reason
        assert f'<option value="{reason}">' in page.text
    with pytest.raises(ConfigurationError, match="not a dead-letter reason"):
        await queue.dead_letters(reason="bogus")


async def test_periodic_api_includes_run_time_schedules(queue: Queue) -> None:
    await add_schedule(queue, "rt.nightly", "add", cron="0 3 * * *", tz="Europe/Paris")
    await add_schedule(queue, "rt.alien", "not.registered", every=60)  # no scheduler runs it
    async with _client(create_app(queue)) as c:
        rows = (await c.get("/api/periodic")).json()["periodic"]
        page = await c.get("/periodic")
    by_name = {r["name"]: r for r in rows}
    assert sorted(by_name) == ["hourly", "rt.nightly"]
    assert by_name["hourly"]["source"] == "code"
    nightly = by_name["rt.nightly"]
    assert nightly["source"] == "runtime"
    assert nightly["task"] == "add"
    assert nightly["tz"] == "Europe/Paris"
    assert nightly["next_run_local"].endswith(("+01:00", "+02:00"))
    assert "T03:00:00" in nightly["next_run_local"]
    assert "<th>source</th>" in page.text
