"""A query option given twice in a broker or state URL is refused at the edge, naming it."""

from __future__ import annotations

import pytest

from blitzq import ConfigurationError, Queue
from blitzq._checks import repeated_option
from blitzq.broker.factory import amqp_pack, check_amqp_url, check_url
from blitzq.broker.redis.client import make_client

pytestmark = pytest.mark.timeout(30)

REDIS_URLS = [
    ("redis://127.0.0.1:6379/0?layout=slot&layout=spread", "layout"),
    ("redis://127.0.0.1:6379/0?wait_replicas=1&wait_replicas=0", "wait_replicas"),
    ("redis://127.0.0.1:6379/0?socket_timeout=1&socket_timeout=5", "socket_timeout"),
    ("rediss://h:6380/0?max_connections=5&timeout=2&max_connections=9", "max_connections"),
    (
        "valkey://127.0.0.1:6379/0?health_check_interval=1&health_check_interval=2",
        "health_check_interval",
    ),
    ("unix:///tmp/blitzq-none.sock?db=1&db=2", "db"),
    ("redis+cluster://h:7000/?wait_replicas=1&wait_replicas=0", "wait_replicas"),
    ("redis+sentinel://s1,s2/main?wait_timeout=1&wait_timeout=2", "wait_timeout"),
    ("redis+sentinel://s1/main?sentinel_password=a&sentinel_password=b", "sentinel_password"),
    ("redis://h/0?socket_timeout=1&socket_%74imeout=1", "socket_timeout"),  # same value, encoded
]

AMQP_URLS = [
    ("amqp://guest:guest@127.0.0.1:5672/%2F?pack=5&pack=7", "pack"),
    ("amqp://guest:guest@127.0.0.1:5672/%2F?heartbeat=10&heartbeat=30", "heartbeat"),
    ("amqps://u:p@h1,h2/vh?pack=8&pack=8", "pack"),
    ("amqp://u:p@h1/vh?pack=4;amqp://u:p@h2/vh?heartbeat=5&heartbeat=5", "heartbeat"),
]


@pytest.mark.parametrize(("url", "name"), REDIS_URLS)
def test_a_repeated_redis_url_option_is_refused_by_the_queue(url: str, name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"the option '{name}' is given 2 times"):
        Queue("q", redis_url=url)
    with pytest.raises(ConfigurationError, match=f"'{name}' is given 2 times"):
        check_url(url, memory=False)  # the CLI's check of --redis-url / BLITZQ_REDIS_URL
    with pytest.raises(ValueError, match=f"'{name}' is given 2 times"):
        make_client(url)  # a broker made directly from the URL: before any connection


@pytest.mark.parametrize(("url", "name"), AMQP_URLS)
def test_a_repeated_amqp_url_option_is_refused_by_the_queue(url: str, name: str) -> None:
    with pytest.raises(ConfigurationError, match=f"bad amqp_url .*'{name}' is given 2 times"):
        Queue("q", redis_url="redis://127.0.0.1:6379/0", amqp_url=url)
    with pytest.raises(ConfigurationError, match=f"'{name}' is given 2 times"):
        check_amqp_url(url)


def test_the_message_masks_passwords() -> None:
    url = "redis://:hunter2@h/0?password=hunter3&password=hunter3"
    with pytest.raises(ConfigurationError) as caught:
        Queue("q", redis_url=url)
    assert "hunter" not in str(caught.value)
    assert "'password' is given 2 times" in str(caught.value)


def test_hosts_of_an_amqp_url_agree_on_pack() -> None:
    assert amqp_pack("amqp://u:p@h1/vh?pack=8;amqp://u:p@h2/vh?pack=8") == 8
    assert amqp_pack("amqp://u:p@h1,h2/vh?pack=8") == 8
    assert amqp_pack("amqp://u:p@h1/vh;amqp://u:p@h2/vh?pack=8") == 8
    with pytest.raises(ConfigurationError, match=r"different pack= values \(5 and 7\)"):
        amqp_pack("amqp://u:p@h1/vh?pack=5;amqp://u:p@h2/vh?pack=7")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://h/0", None),
        ("redis://h/0?", None),
        ("redis://h/0?a=1&b=1&c", None),
        ("redis://h/0?a=1&a", ("a", 2)),
        ("redis://h/0?a=1&a=2&a=3", ("a", 3)),
        ("redis://h/0?a=1#a=2", None),  # a fragment is no option
        ("amqp://h/vh?pa%63k=1&pack=1", ("pack", 2)),
    ],
)
def test_repeated_option(url: str, expected: tuple[str, int] | None) -> None:
    assert repeated_option(url) == expected


def test_one_of_each_option_still_passes() -> None:
    Queue("q", redis_url="redis://127.0.0.1:6379/0?socket_timeout=5&layout=slot&timeout=2")
    Queue("q", redis_url="redis://127.0.0.1:6379/0", amqp_url="amqp://g:g@h/%2F?pack=5&heartbeat=7")
