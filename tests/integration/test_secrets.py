"""No password reaches text (issue 28, item 1): every input the issue names, as a user meets
it (the CLI as a real process, ``str(exc)`` of a Queue, RabbitMQ), then every place found
where a URL can reach a message, a log line, a repr, a page or the CLI's output.

Each test asserts the secret is absent and the masked form (``:***@`` or ``=***``) present.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from blitzq import ConfigurationError, Queue
from blitzq.broker.factory import check_amqp_url, resolve_url
from blitzq.broker.redis.connection import RedisConnection
from blitzq.broker.redis.reliable import reliable_broker
from blitzq.broker.redis.sentinel import parse_sentinel_url
from blitzq.cli import cli
from blitzq.cli._common import CliError, Settings
from blitzq.cli.process_control import autoscale_target
from blitzq.exceptions import BrokerError
from blitzq.logconfig import JsonFormatter, TextFormatter
from blitzq.routing import check_name, check_queue_name
from blitzq.worker.health import Readiness
from tests.amqp_server import amqp_or_skip
from tests.conftest import free_port

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2"

# The broker URLs of the issue, each refused before any connection (exit 2).
BAD_REDIS_URLS = [
    ("redis://:hunter2@127.0.0.1:6379/0?socket_timeout=abc", "socket_timeout"),
    ("redis://:hunter2@127.0.0.1:6379/0?bogus=1", "bogus"),  # an unknown URL option
    ("redis://:hunter2@127.0.0.1:99999/0", "Port"),  # a bad port
    ("redis://:hunter2@127.0.0.1:6379/0?layout=bogus", "layout"),
    ("redis+sentinel://:hunter2@127.0.0.1:1/m?socket_timeout=abc", "socket_timeout"),
    ("redis+cluster://:hunter2@127.0.0.1:6379/3", "database"),
    ("rediss://:hunter2@127.0.0.1:6379/0?max_connections=0", "max_connections"),
    ("unix://:hunter2@/tmp/no.sock?socket_keepalive=yes", "socket_keepalive"),
    ("http://:hunter2@127.0.0.1:6379/0", "unsupported broker URL"),  # a scheme
]


def assert_masked(text: str, masked: str = ":***@") -> None:
    """``text`` holds the masked form and not the secret."""
    assert SECRET not in text, text
    assert masked in text, text


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``python -m blitzq ARGS`` as a user runs it; (exit code, stdout + stderr)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    base["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    proc = subprocess.run(
        [sys.executable, "-m", "blitzq", *args],
        capture_output=True,
        text=True,
        timeout=45,
        cwd=cwd,
        env=base | (env or {}),
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


# ------------------------------------------------------------------ the CLI, as a process
@pytest.mark.parametrize(("url", "needle"), BAD_REDIS_URLS)
def test_cli_bad_broker_url_is_masked(url: str, needle: str, tmp_path: Path) -> None:
    code, out = run_cli("--redis-url", url, "queue", "stats", cwd=tmp_path)
    assert code == 2, out
    assert needle in out, out
    assert_masked(out)
    assert "Traceback" not in out


def test_cli_bad_broker_url_from_the_environment_is_masked(tmp_path: Path) -> None:
    url = BAD_REDIS_URLS[0][0]
    code, out = run_cli("queue", "stats", cwd=tmp_path, env={"BLITZQ_REDIS_URL": url})
    assert code == 2, out
    assert_masked(out)


def test_cli_json_twice_prints_a_masked_error_document(tmp_path: Path) -> None:
    url = BAD_REDIS_URLS[0][0]
    code, out = run_cli("--redis-url", url, "queue", "stats", "--json", "--json", cwd=tmp_path)
    assert code == 2, out
    doc = json.loads(out[: out.rindex("}") + 1])
    assert doc["exit_code"] == 2
    assert_masked(doc["error"])
    assert_masked(out)


def test_cli_bad_amqp_url_is_masked(tmp_path: Path) -> None:
    url = "amqp://guest:hunter2@127.0.0.1:notaport/"
    code, out = run_cli(
        "--redis-url",
        "redis://127.0.0.1:6379/0",
        "--amqp-url",
        url,
        "queue",
        "stats",
        cwd=tmp_path,
    )
    assert code == 2, out
    assert_masked(out)


def test_cli_unreachable_broker_with_a_password_is_masked(tmp_path: Path) -> None:
    url = f"redis://user:hunter2@127.0.0.1:{free_port()}/0?password=hunter2"
    code, out = run_cli("--redis-url", url, "queue", "stats", cwd=tmp_path)
    assert code == 1, out
    assert_masked(out)


# ------------------------------------------------------------------ a Queue in your code
@pytest.mark.parametrize(("url", "needle"), BAD_REDIS_URLS)
async def test_queue_str_exc_of_a_bad_broker_url_is_masked(url: str, needle: str) -> None:
    def build() -> None:  # an unknown scheme is refused at construction, the rest here
        queue = Queue(redis_url=url, namespace=f"secrets-{uuid.uuid4().hex[:8]}")
        _ = queue.broker

    with pytest.raises(ConfigurationError) as info:
        build()
    assert needle in str(info.value)
    assert_masked(str(info.value))
    assert_masked(repr(info.value))


def test_sync_api_str_exc_of_a_bad_broker_url_is_masked() -> None:
    queue = Queue(redis_url=BAD_REDIS_URLS[0][0], namespace=f"s-{uuid.uuid4().hex[:8]}")

    @queue.task()
    def noop() -> None:
        return None

    try:
        with pytest.raises(ConfigurationError) as info:
            noop.enqueue_sync()
        assert_masked(str(info.value))
    finally:
        queue.close_sync()


@pytest.mark.parametrize(
    "url",
    [
        "amqp://guest:hunter2@127.0.0.1:notaport/",
        "amqps://guest:hunter2@127.0.0.1:70000/",
        "amqp://guest:hunter2@127.0.0.1:5672/a/b",
        "ftp://guest:hunter2@127.0.0.1:5672/",
    ],
)
def test_queue_str_exc_of_a_bad_amqp_url_is_masked(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        Queue(redis_url="redis://127.0.0.1:6379/0", amqp_url=url)
    assert_masked(str(info.value))


def test_a_slash_in_an_amqp_password_leaves_no_piece_in_the_vhost_message() -> None:
    with pytest.raises(ConfigurationError) as info:
        check_amqp_url("amqp://guest:first/secondpart@rabbit:5672/vh")
    assert "first" not in str(info.value)
    assert "secondpart" not in str(info.value)


async def test_rabbitmq_refusing_a_wrong_password_is_masked(redis_url: str) -> None:
    good = amqp_or_skip()
    user_host = good.split("://", 1)[1]
    user = user_host.partition("@")[0].partition(":")[0]
    host = user_host.rpartition("@")[2].split("/", 1)[0]
    url = f"amqp://{user}:{SECRET}@{host}/"
    queue = Queue(redis_url=redis_url, amqp_url=url, namespace=f"s-{uuid.uuid4().hex[:8]}")

    @queue.task()
    async def noop() -> None:
        return None

    try:
        with pytest.raises(BrokerError) as info:
            await noop.enqueue()
        assert_masked(str(info.value))
    finally:
        await queue.close()


# ------------------------------------------------------------------ every site found
def test_site_a_url_given_as_the_queue_name_or_namespace() -> None:
    url = "redis://:hunter2@host:6379/0"
    with pytest.raises(ConfigurationError) as info:
        Queue(url)
    assert_masked(str(info.value))
    with pytest.raises(ConfigurationError) as info:
        check_queue_name("queue", url)
    assert_masked(str(info.value))
    with pytest.raises(ConfigurationError) as info:
        check_name("namespace", url + " x")
    assert_masked(str(info.value))


def test_site_a_url_of_the_wrong_type() -> None:
    for name in ("redis_url", "amqp_url"):
        with pytest.raises(ConfigurationError) as info:
            Queue(**{name: b"redis://:hunter2@host/0"})  # type: ignore[arg-type]
        assert SECRET not in str(info.value)
        assert "bytes" in str(info.value)


def test_site_resolve_url_and_the_broker_constructors() -> None:
    with pytest.raises(ConfigurationError) as info:
        resolve_url("http://:hunter2@host/0")
    assert_masked(str(info.value))
    for make in (
        lambda url: RedisConnection(url, "ns"),
        lambda url: reliable_broker(url, "ns"),
    ):
        with pytest.raises(ConfigurationError) as info:
            make("redis://:hunter2@127.0.0.1:6379/0?socket_timeout=abc")
        assert_masked(str(info.value))


def test_site_reprs_leave_the_urls_out() -> None:
    parsed = parse_sentinel_url("redis+sentinel://:hunter2@s1:26379/m?sentinel_password=x9y8z7")
    assert SECRET not in repr(parsed)
    assert "x9y8z7" not in repr(parsed)
    settings = Settings(redis_url="redis://:hunter2@h/0", amqp_url="amqp://u:hunter2@h/")
    assert SECRET not in repr(settings)


def test_site_cli_errors_and_the_memory_url_refusal() -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["--redis-url", "memory://:hunter2@x", "queue", "stats"])
    assert result.exit_code == 2
    assert_masked(result.output)
    error = CliError("broker said: redis://u:hunter2@h/0 is down")
    assert_masked(error.format_message())


def test_site_autoscale_target() -> None:
    with pytest.raises(CliError) as info:
        autoscale_target(Queue(redis_url="memory://:hunter2@x"))
    assert_masked(info.value.format_message())


def test_site_config_show_masks_every_url_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("BLITZQ_REDIS_URL", "BLITZQ_AMQP_URL", "BLITZQ_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text(
        textwrap.dedent(
            """
            [tool.blitzq]
            redis_url = "redis://:hunter2@127.0.0.1:6379/0"
            amqp_url = "amqp://guest:hunter2@127.0.0.1:5672/"
            [tool.blitzq.worker]
            redis-url = "redis://user:hunter2@127.0.0.1:6379/1?password=hunter2"
            """
        )
    )
    runner = CliRunner()
    text = runner.invoke(cli, ["config", "show"], env={"COLUMNS": "200"})
    assert text.exit_code == 0, text.output
    assert_masked(text.output)
    doc = runner.invoke(cli, ["config", "show", "--json"])
    assert doc.exit_code == 0, doc.output
    assert_masked(doc.output)
    assert json.loads(doc.stdout)["commands"]["worker"]["redis-url"] == (
        "redis://user:***@127.0.0.1:6379/1?password=***"
    )


async def test_site_dashboard_errors() -> None:
    from blitzq.dashboard import create_app

    queue = Queue(redis_url=BAD_REDIS_URLS[0][0], namespace="secrets")
    app = create_app(queue)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dash"
    ) as client:
        response = await client.get("/api/queues")
    assert response.status_code == 400
    assert_masked(response.text)


async def test_site_health_endpoint_errors() -> None:
    async def ping() -> None:
        raise BrokerError("lost redis://:hunter2@10.0.0.1:6379/0")

    check = await Readiness._ping(ping, "redis")
    assert check["ok"] is False
    assert_masked(check["error"])


def test_site_log_lines() -> None:
    try:
        raise RuntimeError("cannot reach amqp://guest:hunter2@rabbit:5672/")
    except RuntimeError:
        record = logging.LogRecord(
            "blitzq.worker",
            logging.ERROR,
            __file__,
            1,
            "broker %s",
            ("redis://:hunter2@h/0",),
            sys.exc_info(),
        )
    for formatter in (TextFormatter(), JsonFormatter()):
        line = formatter.format(record)
        assert_masked(line)
        assert "guest:***@rabbit" in line
