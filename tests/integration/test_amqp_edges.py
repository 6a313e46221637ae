"""The RabbitMQ transport's edges as a user meets them: a malformed ``amqp_url`` refused where
it is given, RabbitMQ's own refusal (an unknown vhost, a wrong password) reported in its words
and under the AMQP URL, ``blitzq check`` testing RabbitMQ on its own line, and the reserved
queue name ``dead-letter`` refused.

The tests that connect use the shared RabbitMQ (skipped when it does not answer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from blitzq import ConfigurationError, Queue, TaskFailed
from blitzq.broker.amqp import AmqpBroker
from blitzq.broker.amqp.channels import DEAD_LETTER_SUFFIX, AmqpLink
from blitzq.broker.factory import amqp_hosts
from blitzq.cli import cli
from blitzq.exceptions import BrokerRefusedSettings
from tests.amqp_server import amqp_or_skip, close_connection_named, delete_amqp_queues
from tests.broker_kinds import is_amqp

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(60)

_CLEAN_ENV: dict[str, str | None] = {
    "BLITZQ_REDIS_URL": None,
    "BLITZQ_AMQP_URL": None,
    "BLITZQ_NAMESPACE": None,
    "BLITZQ_MODE": None,
}

BAD_URLS = [
    ("amqp://guest:s3cret@127.0.0.1:notaport/", "integer"),
    ("amqp://guest:s3cret@127.0.0.1:70000/", "range"),
    ("amqp://guest:s3cret@:5672/", "no host"),
    ("amqp://guest:s3cret@127.0.0.1:5672/a/b", "%2F"),
    ("http://guest:s3cret@127.0.0.1:5672/", "amqp://"),
    ("amqp://guest:s3cret@127.0.0.1:5672,127.0.0.2:notaport/", "integer"),
    ("amqp://guest:s3cret@127.0.0.1/;http://guest:s3cret@127.0.0.2/", "amqp://"),
]


@pytest.mark.parametrize(("url", "needle"), BAD_URLS)
def test_a_malformed_amqp_url_is_a_configuration_error_naming_it_masked(
    url: str, needle: str
) -> None:
    with pytest.raises(ConfigurationError, match=needle) as info:
        Queue(redis_url="redis://127.0.0.1:6379/0", amqp_url=url)
    assert "guest:***@" in str(info.value)
    assert "s3cret" not in str(info.value)


def test_good_amqp_urls_are_accepted() -> None:
    for url in (
        "amqp://127.0.0.1",
        "amqp://guest:guest@127.0.0.1:5672/",
        "amqp://guest:guest@127.0.0.1:5672/%2F",
        "amqp://guest:guest@127.0.0.1//",
        "amqps://u:p@[::1]:5671/vhost?heartbeat=5",
        "amqp://guest:guest@127.0.0.1:5672,127.0.0.2,[::1]:5673/%2F?heartbeat=5",
        "amqp://guest:guest@127.0.0.1/;amqps://u:p@127.0.0.2:5671/vhost",
    ):
        Queue(redis_url="redis://127.0.0.1:6379/0", amqp_url=url)


@pytest.mark.parametrize("typed", [True, False])
def test_the_cli_reports_a_malformed_amqp_url_as_json_with_exit_2_or_78(
    redis_url: str, typed: bool
) -> None:
    """Typed: a usage error (2); from the environment: a configuration error (78)."""
    url = "amqp://guest:s3cret@127.0.0.1:notaport/"
    args = ["--json", "--redis-url", redis_url, "queue", "stats"]
    env = dict(_CLEAN_ENV)
    if typed:
        args[1:1] = ["--amqp-url", url]
    else:
        env["BLITZQ_AMQP_URL"] = url
    result = CliRunner().invoke(cli, args, env=env)
    code = 2 if typed else 78
    assert result.exit_code == code, result.output
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == code
    assert "bad amqp_url 'amqp://guest:***@127.0.0.1:notaport/'" in doc["error"]
    assert "s3cret" not in result.output
    assert "Traceback" not in result.output


def test_several_amqp_hosts_are_read_in_either_form() -> None:
    assert amqp_hosts("amqp://u:p@h1:5672,h2:5673,h3/vh?heartbeat=5") == [
        "amqp://u:p@h1:5672/vh?heartbeat=5",
        "amqp://u:p@h2:5673/vh?heartbeat=5",
        "amqp://u:p@h3/vh?heartbeat=5",
    ]
    assert amqp_hosts("amqp://u:p@h1/vh; amqps://v:q@h2:5671/vh") == [
        "amqp://u:p@h1/vh",
        "amqps://v:q@h2:5671/vh",
    ]
    assert amqp_hosts("amqp://127.0.0.1") == ["amqp://127.0.0.1"]


def test_the_amqp_heartbeat_follows_the_visibility_timeout_unless_the_url_sets_it() -> None:

    def heartbeat(vt: float, url: str = "amqp://127.0.0.1/") -> int | None:
        q = Queue(redis_url="redis://127.0.0.1:6379/0", amqp_url=url, visibility_timeout=vt)
        broker = q._make_broker()  # nothing connects until used
        assert is_amqp(broker)
        return broker.transport.link.heartbeat

    assert heartbeat(1.0) == 2  # the least
    assert heartbeat(4.0) == 2
    assert heartbeat(30.0) == 10
    assert heartbeat(60.0) == 20  # the default visibility timeout
    assert heartbeat(3600.0) == 60  # the most (aio-pika's default)
    assert heartbeat(4.0, "amqp://127.0.0.1/?heartbeat=30") is None  # the URL's wins


@pytest.mark.parametrize(
    ("path", "userinfo", "code", "needle"),
    [
        ("ae-novhost-{}", "guest:guest", "530 NOT_ALLOWED", "vhost ae-novhost-{} not found"),
        ("", "guest:wrong-{}", "403 ACCESS_REFUSED", "Login was refused"),
    ],
)
async def test_rabbitmq_refusing_the_vhost_or_login_is_reported_in_its_words(
    server_url: str, namespace: str, path: str, userinfo: str, code: str, needle: str
) -> None:
    base = urlsplit(amqp_or_skip())
    tag = uuid.uuid4().hex[:8]
    url = f"amqp://{userinfo.format(tag)}@{base.hostname}:{base.port or 5672}/{path.format(tag)}"
    q = Queue(redis_url=server_url, namespace=namespace, amqp_url=url)
    try:
        with pytest.raises(BrokerRefusedSettings) as info:  # never retried
            await q.broker.ping()
    finally:
        await q.close()
    message = str(info.value)
    assert "amqp://guest:***@" in message, message  # one masking rule, 403 and 530 alike
    assert f"{code} - {needle.format(tag)}" in message, message
    assert "InvalidFrameError" not in message
    assert not info.value.transient  # a retry does not cure it
    assert f"wrong-{tag}" not in message


def _app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module defining ``queue = Queue()`` importable from the current directory."""
    name = f"amqp_edges_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("from blitzq import Queue\n\nqueue = Queue()\n")
    monkeypatch.chdir(tmp_path)
    return f"{name}:queue"


def _wrong_password(url: str) -> str:
    base = urlsplit(url)
    return f"amqp://{base.username or 'guest'}:wrong-pw@{base.hostname}:{base.port or 5672}/"


def test_check_tests_rabbitmq_on_its_own_line(
    server_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = amqp_or_skip()
    app = _app(tmp_path, monkeypatch)
    common = ["--json", "--redis-url", server_url, "--namespace", namespace]
    wrong = CliRunner().invoke(cli, [*common, "--amqp-url", _wrong_password(url), "check", app])
    assert wrong.exit_code == 78, wrong.output  # RabbitMQ answered: a refusal, not unreachable
    doc = json.loads(wrong.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["connectivity"]["status"] == "ok"  # Redis answers
    assert checks["rabbitmq"]["status"] == "fail"
    assert "refuses" in checks["rabbitmq"]["detail"]
    assert "403 ACCESS_REFUSED" in checks["rabbitmq"]["detail"]
    assert "wrong-pw" not in wrong.output
    assert doc["amqp"].endswith(":***@" + _wrong_password(url).rpartition("@")[2])
    good = CliRunner().invoke(cli, [*common, "--amqp-url", url, "check", app])
    assert good.exit_code == 0, good.output
    checks = {c["name"]: c for c in json.loads(good.stdout)["checks"]}
    assert checks["rabbitmq"]["status"] == "ok"


async def test_a_rabbitmq_error_is_labelled_with_the_amqp_url(
    server_url: str, namespace: str
) -> None:
    url = amqp_or_skip()
    q = Queue(redis_url=server_url, namespace=namespace, amqp_url=url)

    @q.task(name="edges.noop")
    async def noop() -> None:
        return None

    try:
        await noop.enqueue()  # the namespace now uses queue "default" (on RabbitMQ)
        args = ["--redis-url", server_url, "--namespace", namespace]
        args += ["--amqp-url", _wrong_password(url), "queue", "stats"]
        result = await asyncio.to_thread(CliRunner().invoke, cli, args, env=_CLEAN_ENV)
    finally:
        await delete_amqp_queues(url, [q.broker])
        await q.close()
    assert result.exit_code == 78, result.output  # a refused login: a configuration error
    first = result.stderr.strip().splitlines()[0]
    assert first.startswith("Error: RabbitMQ refused the AMQP URL's credentials"), first
    assert "amqp://" in first, first
    assert "redis://" not in first
    assert "403 ACCESS_REFUSED" in first
    assert "wrong-pw" not in result.output


def test_the_worker_start_line_names_rabbitmq(
    server_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = amqp_or_skip()
    app = _app(tmp_path, monkeypatch)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONPATH"] = os.pathsep.join([*sys.path])
    cmd = [sys.executable, "-m", "blitzq", "--redis-url", server_url, "--namespace", namespace]
    cmd += ["--amqp-url", url, "worker", app, "--burst"]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=45, env=env, cwd=tmp_path)
    finally:
        names = [f"{namespace}.{q}" for q in ("default", "default:high", "default:low")]
        asyncio.run(_delete(url, [*names, f"{namespace}.{DEAD_LETTER_SUFFIX}"]))
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    first = done.stdout.decode().splitlines()[0]
    assert f"broker={server_url}" in first or "broker=redis" in first
    assert "amqp=amqp://" in first, first


async def _delete(url: str, names: list[str]) -> None:
    link = AmqpLink(url, "cleanup", 1)
    try:
        await link.delete(names)
    finally:
        await link.close()


async def test_a_dead_letter_of_the_rabbitmq_transport_records_mode_reliable(
    server_url: str, namespace: str
) -> None:
    url = amqp_or_skip()
    q = Queue(redis_url=server_url, namespace=namespace, amqp_url=url, visibility_timeout=5)

    @q.task(name="edges.fails", retries=0)
    async def fails() -> None:
        raise ValueError("no")

    try:
        handle = await fails.enqueue()
        async with running(make_worker(q, concurrency=1)):
            with pytest.raises(TaskFailed):
                await handle.result(timeout=30)
        (letter,) = await q.dead_letters()
        assert (letter.id, letter.reason, letter.mode) == (handle.id, "failed", "reliable")
    finally:
        await delete_amqp_queues(url, [q.broker])
        await q.close()


async def test_the_queue_name_dead_letter_is_refused_on_rabbitmq(
    server_url: str, namespace: str
) -> None:
    url = amqp_or_skip()
    with pytest.raises(ConfigurationError, match="reserved on RabbitMQ"):
        Queue("dead-letter", redis_url=server_url, namespace=namespace, amqp_url=url)
    Queue("dead-letter", redis_url=server_url, namespace=namespace)  # fine on Redis
    q = Queue(redis_url=server_url, namespace=namespace, amqp_url=url)

    @q.task(name="edges.clash", queue="dead-letter")
    async def clash() -> None:
        return None

    try:
        with pytest.raises(ConfigurationError, match="dead-letter queue"):
            await clash.enqueue()
        assert await q.dead_letter_count() == 0  # nothing reached the namespace's DLQ
    finally:
        await delete_amqp_queues(url, [q.broker])
        await q.close()


async def test_a_name_clash_with_another_namespaces_queue_is_explained(
    server_url: str, namespace: str
) -> None:
    """Namespace ``a`` with queue ``x.q`` and namespace ``a.x`` with queue ``q`` share the
    RabbitMQ queue ``a.x.q`` (documented); declared with other arguments, the refusal says
    that this may be the cause."""
    url = amqp_or_skip()
    first = AmqpBroker(url, server_url, namespace, max_deliveries=5)
    second = AmqpBroker(url, server_url, namespace + ".x", max_deliveries=3)
    try:
        await first.publish("x.q", [b"m"])
        with pytest.raises(ConfigurationError, match="another namespace's queue") as info:
            await second.publish("q", [b"m"])
        assert "PRECONDITION_FAILED" in str(info.value)
    finally:
        await delete_amqp_queues(url, [first, second])
        await _delete(url, [f"{namespace}.x.{DEAD_LETTER_SUFFIX}"])  # declared before the refusal
        await first.close()
        await second.close()


async def test_a_server_closed_connection_is_one_warning_and_noticed_at_once(
    server_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``rabbitmqctl close_connection`` under an idle worker whose fetch waits 10 s: one
    WARNING line with RabbitMQ's reply (no aiormq traceback), and the worker connects again
    well before its fetch would have timed out."""
    url = amqp_or_skip()
    if shutil.which("rabbitmqctl") is None:
        pytest.skip("rabbitmqctl is not installed")
    q = Queue(redis_url=server_url, namespace=namespace, amqp_url=url, visibility_timeout=60)

    @q.task(name="edges.echo")
    async def echo(x: int) -> int:
        return x

    caplog.set_level(logging.INFO)
    try:
        async with running(make_worker(q, concurrency=1, block_timeout=10.0)):
            assert await (await echo.enqueue(1)).result(timeout=30) == 1
            link = q.broker.transport.link  # type: ignore[attr-defined]
            epoch = link.epoch
            await asyncio.sleep(0.5)  # the fetch is waiting now
            caplog.clear()
            assert await asyncio.to_thread(close_connection_named, link.connection_name) >= 1
            await eventually(lambda: asyncio.sleep(0, link.epoch), lambda e: e > epoch, 4.0)
            closing = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert await (await echo.enqueue(2)).result(timeout=30) == 2
    finally:
        await delete_amqp_queues(url, [q.broker])
        await q.close()
    assert [(r.name, r.exc_info) for r in closing] == [("blitzq.broker.amqp", None)], [
        r.getMessage() for r in closing
    ]
    assert "320 CONNECTION_FORCED" in closing[0].getMessage()
