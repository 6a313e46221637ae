"""Logical queue names: a URL or a priority-lane suffix is refused wherever a queue is named
(Queue, task decorator, call options, routes, queue rate limits, periodic entries, workflow
signatures); a physical lane name stays usable where one is meant (the CLI's ``-Q``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from blitzq import ConfigurationError, Every, Queue, Signature
from blitzq.cli._common import CliUsageError
from blitzq.cli.worker import _split_queues
from blitzq.routing import check_queue_name

BAD = ["memory://x", "redis://localhost:6379/0", "a:high", "emails:low"]


@pytest.mark.parametrize("name", BAD)
def test_check_queue_name_refuses_urls_and_lane_suffixes(name: str) -> None:
    with pytest.raises(ConfigurationError, match=r"URL|lane"):
        check_queue_name("queue name", name)


def test_url_as_queue_name_points_to_redis_url() -> None:
    with pytest.raises(ConfigurationError, match=r"Queue\(redis_url='memory://x'\)"):
        Queue("memory://x")


def test_lane_suffix_message_names_the_queue_and_the_priority() -> None:
    with pytest.raises(
        ConfigurationError, match=r"high-priority lane of queue 'a'.*priority='high'"
    ):
        Queue("a:high")


@pytest.mark.parametrize("name", ["a", "a:b", "emails:highway", "high", "low:x", "default"])
def test_ordinary_names_are_accepted(name: str) -> None:
    assert check_queue_name("queue name", name) == name
    assert Queue(name).name == name


def _enter(where: str, name: str) -> Any:
    queue = Queue("q")
    if where == "decorator":
        return queue.task(queue=name)(lambda: None)
    if where == "options":
        return queue.task(name="t")(lambda: None).options(queue=name)
    if where == "routes":
        return Queue("q", routes={"t*": name})
    if where == "routes_callable":
        return Queue("q", routes=lambda task: name).task(name="t")(lambda: None)
    if where == "queue_rate_limits":
        return Queue("q", queue_rate_limits={name: "10/s"})
    if where == "periodic":
        return queue.periodic(Every(1), queue=name)(lambda: None)
    assert where == "signature"
    return Signature("t", queue=name)


WHERE = [
    "decorator",
    "options",
    "routes",
    "routes_callable",
    "queue_rate_limits",
    "periodic",
    "signature",
]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("name", ["memory://x", "a:high", "a:low"])
def test_every_logical_entry_refuses_bad_names(where: str, name: str) -> None:
    with pytest.raises(ConfigurationError, match=r"URL|lane"):
        _enter(where, name)


@pytest.mark.parametrize("where", WHERE)
def test_every_logical_entry_accepts_a_plain_name(where: str) -> None:
    _enter(where, "emails")


def test_cli_queues_option_refuses_a_priority_level() -> None:
    # -Q a:high used to pass here and make a worker of all of "a" (Worker maps a level to
    # its queue): a level is refused like options(queue="a:high"), naming the base queue.
    split: Callable[[str | None], list[str] | None] = _split_queues
    assert split("a,b") == ["a", "b"]
    with pytest.raises(CliUsageError, match="use the base queue name 'a'"):
        split("a,a:high")
