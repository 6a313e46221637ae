"""A broker URL whose password, user or database number the Redis server refuses is a
configuration error (``BrokerRefusedSettings``, also a ``ConfigurationError``): enqueue
raises it, never a transient ``BrokerError``, and ``blitzq worker`` exits 78 at once, with
or without its supervisor, instead of waiting for a broker that will never accept it. A
broker that is not there (connection refused) stays transient: the supervised worker waits.

The same holds for RabbitMQ (``amqp_url``): a refused login (``403 ACCESS_REFUSED``) or an
unknown virtual host (``530 NOT_ALLOWED``). ``blitzq check`` reports a refusal as one (exit
78), not as a server that does not answer (exit 1).

The test starts its own ``redis-server`` with a password on a free port (stopped at the end);
the RabbitMQ cases use the shared RabbitMQ (skipped when it does not answer).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import redis

from blitzq import BrokerError, ConfigurationError, Queue
from blitzq.exceptions import BrokerRefusedSettings

from ..amqp_server import amqp_or_skip
from ..polling import wait_until
from ..ports import free_port
from .test_exit_codes import APP, blitzq

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]

PASSWORD = "e2-secret"


@pytest.fixture(scope="module")
def locked() -> Iterator[int]:
    """The port of a ``redis-server`` of this module that requires ``PASSWORD``."""
    port = free_port()
    data = tempfile.mkdtemp(prefix="blitzq-refused-")
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--dir", data, "--requirepass", PASSWORD]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port, password=PASSWORD, socket_timeout=5)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    try:
        wait_until(answers, 30, "the password-protected redis-server answering")
        yield port
    finally:
        client.close()
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def _urls(port: int, redis_url: str) -> dict[str, tuple[str, str]]:
    if redis_url.startswith("unix://"):  # the embedded server: its database in the query
        bad_db = redis_url.partition("?")[0] + "?db=99"
    else:
        bad_db = redis_url.rsplit("/", 1)[0] + "/99"
    return {
        "wrong password": (f"redis://:wrong@127.0.0.1:{port}/0", "credentials"),
        "wrong user": (f"redis://nobody:{PASSWORD}@127.0.0.1:{port}/0", "credentials"),
        "no password": (f"redis://127.0.0.1:{port}/0", "requires a password (NOAUTH)"),
        "bad DB number": (bad_db, "database number"),
    }


CASES = ["wrong password", "wrong user", "no password", "bad DB number"]


@pytest.mark.parametrize("case", CASES)
async def test_enqueue_raises_a_configuration_error(case: str, locked: int, redis_url: str) -> None:
    url, cause = _urls(locked, redis_url)[case]
    queue = Queue(redis_url=url, namespace="refused-settings")

    @queue.task
    async def noop() -> None:
        pass

    try:
        with pytest.raises(ConfigurationError) as info:
            await noop.enqueue()
    finally:
        await queue.close()
    assert isinstance(info.value, BrokerRefusedSettings)
    assert info.value.transient is False
    assert cause in str(info.value)
    assert PASSWORD not in str(info.value)
    if case == "no password":
        assert "HELLO" not in str(info.value)


async def test_a_broker_that_is_not_there_stays_transient() -> None:
    queue = Queue(redis_url=f"redis://127.0.0.1:{free_port()}/0", namespace="refused-settings")
    try:
        with pytest.raises(BrokerError) as info:
            await queue.broker.ping()
    finally:
        await queue.close()
    assert not isinstance(info.value, ConfigurationError)
    assert info.value.transient is True


@pytest.mark.parametrize("supervised", [True, False], ids=["supervised", "no-supervise"])
@pytest.mark.parametrize("case", CASES)
def test_the_worker_exits_78_at_once(
    case: str, supervised: bool, locked: int, redis_url: str
) -> None:
    url, cause = _urls(locked, redis_url)[case]
    extra = [] if supervised else ["--no-supervise"]
    code, out = blitzq("worker", APP, "--redis-url", url, *extra)
    assert code == 78, out
    assert cause in out
    assert "not reachable yet" not in out


def test_check_reports_a_refusal_as_one(locked: int, redis_url: str) -> None:
    url, cause = _urls(locked, redis_url)["wrong password"]
    code, out = blitzq("check", APP, "--redis-url", url)
    assert code == 78, out  # the server answered: a configuration problem, not unreachable
    assert "refuses" in out, out
    assert cause in out, out
    assert "does not answer" not in out, out


# RabbitMQ (the shared one, skipped when it does not answer): a refused login (403
# ACCESS_REFUSED) or an unknown virtual host (530 NOT_ALLOWED) is the same configuration
# error; the user name shows in the masked URL of both (one masking rule).


def _amqp_urls(redis_url: str) -> dict[str, tuple[str, str]]:
    parts = urlsplit(amqp_or_skip())
    where = f"{parts.hostname}:{parts.port or 5672}"
    return {
        "wrong password": (f"amqp://guest:wrong-{PASSWORD}@{where}/", "403 ACCESS_REFUSED"),
        "unknown vhost": (f"amqp://guest:guest@{where}/refused-{PASSWORD}", "530 NOT_ALLOWED"),
    }


AMQP_CASES = ["wrong password", "unknown vhost"]


@pytest.mark.parametrize("case", AMQP_CASES)
async def test_rabbitmq_refusing_the_url_is_a_configuration_error(
    case: str, redis_url: str
) -> None:
    url, cause = _amqp_urls(redis_url)[case]
    queue = Queue(redis_url=redis_url, namespace="refused-settings", amqp_url=url)

    @queue.task
    async def noop() -> None:
        pass

    try:
        with pytest.raises(BrokerRefusedSettings) as info:
            await noop.enqueue()
    finally:
        await queue.close()
    assert info.value.transient is False
    assert cause in str(info.value)
    assert "amqp://guest:***@" in str(info.value), str(info.value)


@pytest.mark.parametrize("supervised", [True, False], ids=["supervised", "no-supervise"])
@pytest.mark.parametrize("case", AMQP_CASES)
def test_the_worker_exits_78_at_once_on_a_rabbitmq_refusal(
    case: str, supervised: bool, redis_url: str
) -> None:
    url, cause = _amqp_urls(redis_url)[case]
    extra = [] if supervised else ["--no-supervise"]
    args = ["--redis-url", redis_url, "--namespace", "refused-settings", "--amqp-url", url]
    code, out = blitzq(*args, "worker", APP, *extra)
    assert code == 78, out
    assert cause in out
    assert "not reachable yet" not in out
    assert "amqp://guest:***@" in out, out
    assert "***:***" not in out, out


@pytest.mark.parametrize("case", AMQP_CASES)
def test_check_reports_a_rabbitmq_refusal_as_one(case: str, redis_url: str) -> None:
    url, cause = _amqp_urls(redis_url)[case]
    args = ["--redis-url", redis_url, "--namespace", "refused-settings", "--amqp-url", url]
    code, out = blitzq(*args, "check", APP)
    assert code == 78, out
    assert "RabbitMQ answers but refuses" in out, out
    assert cause in out, out
