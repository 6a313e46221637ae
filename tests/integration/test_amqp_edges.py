"""The RabbitMQ transport's edges as a user meets them: a malformed ``amqp_url`` refused where
it is given, RabbitMQ's own refusal (an unknown vhost, a wrong password) reported in its words
and under the AMQP URL, ``blitzq check`` testing RabbitMQ on its own line, and the reserved
queue name ``dead-letter`` refused.

The tests that connect use the shared RabbitMQ (skipped when it does not answer).
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from blitzq import ConfigurationError, Queue
from blitzq.cli import cli
from blitzq.exceptions import BrokerError
from tests.amqp_server import amqp_or_skip

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
    ):
        Queue(redis_url="redis://127.0.0.1:6379/0", amqp_url=url)


@pytest.mark.parametrize("typed", [True, False])
def test_the_cli_reports_a_malformed_amqp_url_as_json_with_exit_2(
    redis_url: str, typed: bool
) -> None:
    url = "amqp://guest:s3cret@127.0.0.1:notaport/"
    args = ["--json", "--redis-url", redis_url, "queue", "stats"]
    env = dict(_CLEAN_ENV)
    if typed:
        args[1:1] = ["--amqp-url", url]
    else:
        env["BLITZQ_AMQP_URL"] = url
    result = CliRunner().invoke(cli, args, env=env)
    assert result.exit_code == 2, result.output
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == 2
    assert "bad amqp_url 'amqp://guest:***@127.0.0.1:notaport/'" in doc["error"]
    assert "s3cret" not in result.output
    assert "Traceback" not in result.output


def test_the_amqp_heartbeat_follows_the_visibility_timeout_unless_the_url_sets_it() -> None:
    from blitzq.broker.amqp import AmqpBroker

    def heartbeat(vt: float, url: str = "amqp://127.0.0.1/") -> int | None:
        q = Queue(redis_url="redis://127.0.0.1:6379/0", amqp_url=url, visibility_timeout=vt)
        broker = q._make_broker()  # nothing connects until used
        assert isinstance(broker, AmqpBroker)
        return broker.amqp.link.heartbeat

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
        with pytest.raises(BrokerError) as info:
            await q.broker.ping()
    finally:
        await q.close()
    message = str(info.value)
    assert f"{code} - {needle.format(tag)}" in message, message
    assert "InvalidFrameError" not in message
    assert not info.value.transient  # a retry does not cure it
    assert f"wrong-{tag}" not in message
