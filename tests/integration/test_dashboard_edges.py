"""What a new user met at the dashboard's edges: ``blitzq dashboard`` against a broker that is
down or refuses the password (one line, exit 1), the API's dead-letter reason filter (400 for
an unknown reason), and run-time schedules on the periodic page (with their source)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

pytest.importorskip("starlette", reason="the dashboard needs the 'dashboard' extra")

from blitzq import ConfigurationError, Queue
from blitzq.dashboard import create_app
from blitzq.dead_letters import DEAD_LETTER_REASONS
from blitzq.limits import MAX_REQUEST_BODY
from blitzq.runtime_schedules import add_schedule
from tests.conftest import free_port
from tests.integration.test_cli_ops import ROOT, subprocess_env
from tests.polling import wait_until

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
    ("url", "code", "start"),
    [
        (
            "redis://127.0.0.1:{port}",
            1,
            "Error: broker error (redis://127.0.0.1:{port}): ConnectionError",
        ),
        (  # refused credentials are a configuration error (exit 78), not an outage
            "redis://nobody:wrong@127.0.0.1:6379/0",
            78,
            "Error: the Redis server refused the broker URL's credentials (AuthenticationError",
        ),
    ],
    ids=["unreachable", "wrong-password"],
)
def test_dashboard_command_checks_the_broker_before_serving(
    url: str, code: int, start: str, redis_url: str
) -> None:
    if "6379" in url and not redis_url.startswith("redis://127.0.0.1:6379"):
        pytest.skip("the wrong-password case needs the shared server at 127.0.0.1:6379")
    port = free_port()
    done = _dashboard(url.format(port=port))
    assert done.returncode == code, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr  # one line, no traceback
    assert lines[0].startswith(start.format(port=port)), lines[0]
    assert "wrong" not in done.stderr  # the password is not shown


def test_a_port_in_use_is_one_line_and_exit_78_with_no_banner(
    server_url: str, namespace: str
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "blitzq", "--redis-url", server_url, "--namespace",
             namespace, "dashboard", APP, "--port", str(port)],
            cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=45,
        )  # fmt: skip
    assert done.returncode == 78, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr  # no banner before it, no traceback
    assert lines[0].startswith(f"Error: cannot serve the dashboard on 127.0.0.1:{port}: ")
    assert "in use" in lines[0]


def test_the_banner_names_the_bound_port_which_then_answers(
    server_url: str, namespace: str
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "blitzq", "--redis-url", server_url, "--namespace", namespace,
         "dashboard", APP, "--port", "0"],
        cwd=ROOT, env=subprocess_env(), stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()  # the first line: printed once the port is bound
        found = re.match(r"blitzq dashboard http://127\.0\.0\.1:(\d+)/ ", banner)
        assert found, banner
        port = int(found.group(1))
        assert port != 0
        # Bound before the banner: a connection is accepted (queued) even before uvicorn
        # serves, and answered once it does.
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/queues", timeout=5) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(answers, 30, "the dashboard to answer on the port its banner names")
    finally:
        proc.terminate()
        proc.wait(20)
        if proc.stderr is not None:
            proc.stderr.close()


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


# ------------------------------------------------------------- request bodies
_PURGE = "/api/dead-letters/purge"
_JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", "the body: nested deeper than 32 levels"),
        (b"[" * 30_000 + b"]" * 30_000, "the body: nested deeper than 32 levels"),
        (b'{"confirm": 1e999}', "the body: 1e999 is not a finite number"),
        (b'{"confirm": -1e999}', "the body: -1e999 is not a finite number"),
        (b'{"confirm": NaN}', "the body: NaN is not a JSON number"),
        (b'{"confirm": Infinity}', "the body: Infinity is not a JSON number"),
        (b'{"confirm": 18446744073709551616}', "the body: 18446744073709551616 is outside"),
        (b'{"confirm": "\\ud800"}', "the body: the string '\\ud800' is not valid Unicode"),
        (b"[1]", "the body: expected a JSON object, got a list"),
        (b'"x"', "the body: expected a JSON object, got a string"),
        (b"{", "the body: not JSON: "),
        (b'{"confirm": "\xff"}', "the body: not JSON: "),
    ],
    ids=lambda v: repr(v)[:32] if isinstance(v, bytes) else None,
)
async def test_a_bad_json_body_is_a_400_with_a_json_error(
    queue: Queue, body: bytes, error: str
) -> None:
    replay = "/api/dead-letters/some-id/replay"
    async with _client(create_app(queue)) as c:
        for path in (_PURGE, replay):
            r = await c.post(path, content=body, headers=_JSON)
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"].startswith(error), r.json()
            assert r.headers["content-type"].startswith("application/json")


async def test_a_body_over_the_limit_is_a_413_and_one_at_the_limit_is_read(
    queue: Queue,
) -> None:
    over = b'{"pad": "' + b"x" * MAX_REQUEST_BODY + b'"}'
    confirm = b'{"confirm": "' + queue.namespace.encode() + b'", "pad": "'
    at_limit = confirm + b"x" * (MAX_REQUEST_BODY - len(confirm) - 2) + b'"}'
    assert len(at_limit) == MAX_REQUEST_BODY
    async with _client(create_app(queue)) as c:
        refused = await c.post(_PURGE, content=over, headers=_JSON)
        read = await c.post(_PURGE, content=at_limit, headers=_JSON)
    assert refused.status_code == 413
    assert refused.json() == {"error": f"the body is larger than {MAX_REQUEST_BODY} bytes"}
    assert read.status_code == 200, read.text
    assert read.json() == {"purged": 0}


async def _post_raw(
    app: Any, headers: list[tuple[bytes, bytes]], chunks: int, chunk: bytes
) -> tuple[int, dict[str, Any], int]:
    """POST to the purge route through the ASGI interface, the body coming as ``chunks``
    pieces of ``chunk`` (``more_body`` until the last); return the status, the JSON answer
    and how many pieces the app took."""
    taken = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal taken
        if taken >= chunks:
            return {"type": "http.disconnect"}
        taken += 1
        return {"type": "http.request", "body": chunk, "more_body": taken < chunks}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": _PURGE,
        "raw_path": _PURGE.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"dash"), (b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("dash", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), 30)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(body), taken


async def test_a_50_mb_body_is_refused_without_being_read_whole(queue: Queue) -> None:
    app = create_app(queue)
    piece = b" " * 65536
    pieces = 50 * 1024 * 1024 // len(piece)  # 50 MiB, streamed without a Content-Length
    status, doc, taken = await _post_raw(app, [], pieces, piece)
    assert (status, doc) == (413, {"error": f"the body is larger than {MAX_REQUEST_BODY} bytes"})
    assert taken <= MAX_REQUEST_BODY // len(piece) + 1  # stopped at the first piece too many
    # Announced by its Content-Length: refused before a byte of it is read.
    declared = [(b"content-length", str(pieces * len(piece)).encode())]
    status, doc, taken = await _post_raw(app, declared, pieces, piece)
    assert (status, taken) == (413, 0)
    # A Content-Length that is no number of bytes is a 400, also before reading.
    for bad in (b"lots", b"-1", "\N{SUPERSCRIPT TWO}".encode("latin-1")):
        status, doc, taken = await _post_raw(app, [(b"content-length", bad)], 1, b"{}")
        assert (status, taken) == (400, 0), bad
        assert doc["error"].startswith("Content-Length is not a number of bytes")


async def test_ids_that_are_not_utf8_in_a_url_are_answered_not_500(queue: Queue) -> None:
    """Percent-escapes that decode to no UTF-8 text (``%FF``, an encoded surrogate) in a task
    id or a filter: a JSON answer, never a 500."""
    async with _client(create_app(queue)) as c:
        task = await c.get("/api/tasks/a%FFb")
        surrogate = await c.get("/api/tasks/a%ED%A0%80b")
        listed_raw = await c.get("/api/dead-letters?task=a%ED%A0%80&queue=%FF")
        replay = await c.post("/api/dead-letters/a%FF/replay", json={})
    assert (task.status_code, surrogate.status_code) == (404, 404)
    assert task.json()["error"].startswith("no record of task a\ufffdb")
    assert listed_raw.status_code == 200
    assert listed_raw.json()["items"] == []
    assert replay.status_code == 404
    assert replay.json() == {"error": "no dead letter with id a\ufffd"}
