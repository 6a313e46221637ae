"""Edges of the command line a user meets first: a bad option value is one clean line with the
documented exit code (never a traceback), the messages name what to do, and the read-only
commands (and the dashboard's reads) work on a server at its ``maxmemory``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from blitzq import ConfigurationError, Queue
from blitzq.cli import cli
from tests.conftest import SessionRedis

from .test_cli_ops import _CLEAN_ENV, subprocess_env

pytestmark = pytest.mark.timeout(120)

APP = "tests.integration.ops_app:queue"
TASK = "tests.integration.ops_app:add"


@pytest.fixture
def invoke(redis_url: str, namespace: str) -> Callable[..., Result]:
    """Run ``blitzq --redis-url URL --namespace NS ARGS`` in-process; an exception that
    escapes the command (a traceback for the user) fails the test."""
    runner = CliRunner()

    def run(*args: str, url: str | None = None) -> Result:
        return runner.invoke(
            cli,
            ["--redis-url", url or redis_url, "--namespace", namespace, *args],
            env=_CLEAN_ENV,
            catch_exceptions=False,
        )

    return run


# (command line, exit code, words the message must hold). Each value here is checked after
# parsing (a ConfigurationError at the edge): it must come out as one clean line.
BAD_VALUES: list[tuple[list[str], int, str]] = [
    (["worker", APP, "-Q", "a b"], 2, "--queues"),
    (["worker", APP, "-Q", "a{b}"], 2, "--queues"),
    (["worker", APP, "-Q", "ok,a b"], 2, "--queues"),
    (["worker", APP, "-Q", "a b", "--no-supervise"], 2, "--queues"),
    (["worker", APP, "-Q", "a\nb", "--workers", "2"], 2, "--queues"),
    (["worker", APP, "-Q", ""], 2, "--queues"),
    (["worker", TASK], 78, "is a Task, not a blitzq.Queue"),
    (["worker", TASK, "--no-supervise"], 78, "not a blitzq.Queue"),
    (["queue", "pause", "a{b}"], 2, "queue name"),
    (["queue", "resume", "a b"], 2, "queue name"),
    (["queue", "purge", "a b", "--yes"], 2, "queue name"),
    (["schedule", "add", "a b", "--task", "t", "--every", "5"], 2, "schedule name"),
    (["schedule", "add", "x", "--task", "t", "--every", "5", "--queue", "a b"], 2, "queue"),
    (["schedule", "add", "x", "--task", "t", "--cron", "61 * * * *"], 2, "minute field '61'"),
    (["schedule", "add", "x", "--task", "t", "--cron", "* 24 * * *"], 2, "hour field '24'"),
    (["schedule", "add", "x", "--task", "t", "--cron", "* * * * * *"], 2, "exactly 5"),
    (["schedule", "add", "x", "--task", "t", "--cron", "* * * * *", "--tz", "No/Zone"], 2, "--tz"),
    (["schedule", "add", "x", "--task", "t", "--every", "5", "--args", "{}"], 2, "--args"),
    (["check", APP, "--namespace", "a{b}"], 2, "namespace"),
]


@pytest.mark.parametrize(
    ("args", "code", "words"), BAD_VALUES, ids=[" ".join(a[:4]) for a, _, _ in BAD_VALUES]
)
def test_a_bad_value_is_one_clean_line_with_its_exit_code(
    invoke: Callable[..., Result], args: list[str], code: int, words: str
) -> None:
    result = invoke(*args)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    assert words in result.output
    assert "slot 0 started" not in result.output


def test_an_unsupported_url_lists_the_schemes_the_command_takes(
    invoke: Callable[..., Result],
) -> None:
    result = invoke("queue", "stats", url="ftp://x")
    assert result.exit_code == 2, result.output
    assert "valkey://" in result.output
    assert "memory://" not in result.output


def test_a_queue_refuses_an_unsupported_url_where_it_is_given() -> None:
    with pytest.raises(ConfigurationError, match=r"unsupported broker URL 'http://x'.*valkey://"):
        Queue("x", redis_url="http://x")
    Queue("x", redis_url="valkey://127.0.0.1:1/0")  # accepted (nothing is connected)


def test_the_dashboard_without_its_extra_exits_78_with_the_install_command(
    tmp_path: Path, redis_url: str
) -> None:
    (tmp_path / "uvicorn.py").write_text("raise ImportError('No module named uvicorn')\n")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    proc = subprocess.run(
        [sys.executable, "-m", "blitzq", "--redis-url", redis_url, "dashboard", APP],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 78, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "[dashboard]" in proc.stderr


@pytest.fixture
def full_server(namespace: str) -> Iterator[str]:
    """A private ``redis-server`` holding some of ``namespace``'s state (a queued message, a
    dead letter, a lapsed worker and supervisor), then set to ``maxmemory`` 1 byte under
    ``noeviction``: every write is refused with ``OOM``."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary")
    server = SessionRedis(binary)
    try:
        assert server.wait_ready()
        producer = Queue(redis_url=server.url, namespace=namespace, name="ops")
        try:
            producer.send_sync("ops.add", (1, 2))
        finally:
            producer.close_sync()
        with redis.Redis.from_url(server.url) as client:
            ns = "{" + namespace + "}"
            client.hset(f"{ns}:workers", "w-lapsed", b"")
            client.zadd(f"{ns}:workers:exp", {"w-lapsed": 1})
            client.hset(f"{ns}:supervisors", "s-lapsed", b"{}")
            client.zadd(f"{ns}:supervisors:exp", {"s-lapsed": 1})
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", 1)
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                client.set(f"{ns}:probe", 1)
        yield server.url
    finally:
        server.stop()


@pytest.mark.parametrize(
    "args",
    [
        ["queue", "stats"],
        ["queue", "stats", "--json"],
        ["control", "status"],
        ["dead-letter", "list"],
        ["dead-letter", "summary"],
        ["schedule", "list"],
    ],
    ids=" ".join,
)
def test_read_only_commands_work_on_a_full_server(
    invoke: Callable[..., Result], full_server: str, args: list[str]
) -> None:
    result = invoke(*args, url=full_server)
    assert result.exit_code == 0, result.output
    assert "OutOfMemory" not in result.output


def test_check_on_a_full_server_says_memory_full_not_unreachable(
    invoke: Callable[..., Result], full_server: str
) -> None:
    result = invoke("check", APP, "--json", url=full_server)
    assert result.exit_code == 78, result.output
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["connectivity"]["status"] == "ok"
    assert checks["memory"]["status"] == "fail"
    assert "memory full" in checks["memory"]["detail"]
    human = invoke("check", APP, url=full_server)
    assert human.exit_code == 78
    assert "FAIL  memory" in human.output
    assert "unreachable" not in human.output


def test_the_dashboard_reads_on_a_full_server(full_server: str, namespace: str) -> None:
    pytest.importorskip("starlette", reason="the dashboard needs the 'dashboard' extra")
    from starlette.testclient import TestClient

    from blitzq.dashboard import create_app

    queue = Queue(redis_url=full_server, namespace=namespace, name="ops")
    with TestClient(create_app(queue)) as client:
        for path in ("/api/queues", "/api/workers", "/api/dead-letters", "/api/periodic"):
            response = client.get(path)
            assert response.status_code == 200, (path, response.text)
        for path in ("/api/tasks", "/api/series", "/", "/workers"):
            assert client.get(path).status_code == 200, path
