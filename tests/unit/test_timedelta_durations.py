"""A duration given as a ``timedelta`` is read as its seconds wherever a number of seconds
is taken: a positive one works as the number does, a negative one gets the same
``ConfigurationError`` a negative number gets (not a type error), and ``eta`` (a point in
time) refuses one, naming ``delay=``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import ConfigurationError, Queue, RateLimit, Retry, RetryPolicy, Worker
from blitzq._checks import wait
from blitzq.options import CallOptions, positive_seconds
from blitzq.schedules import Every

pytestmark = pytest.mark.timeout(30)

URL = "redis://127.0.0.1:6379/0"


def _queue() -> Queue:
    return Queue("td", redis_url=URL, namespace="edges-td")


def _bound(**options: Any) -> CallOptions:
    queue = _queue()

    @queue.task(name="td.noop")
    async def noop() -> None:
        return None

    return noop.options(**options).call_options


#: label -> (build from a duration, read back the seconds it kept)
PLACES: dict[str, tuple[Callable[[Any], Any], Callable[[Any], float]]] = {
    "delay": (lambda v: _bound(delay=v), lambda o: o.delay),
    "timeout": (lambda v: _bound(timeout=v), lambda o: o.timeout),
    "max_age": (lambda v: _bound(max_age=v), lambda o: o.extensions["max_age"]),
    "bound delay": (lambda v: CallOptions().__class__(delay=v), lambda o: o.delay),
    "Retry": (lambda v: Retry(v), lambda r: r.delay),
    "RetryPolicy.base": (lambda v: RetryPolicy(base=v), lambda p: p.base),
    "RetryPolicy.max_delay": (lambda v: RetryPolicy(max_delay=v), lambda p: p.max_delay),
    "RetryPolicy.increment": (
        lambda v: RetryPolicy(backoff="linear", increment=v),
        lambda p: p.increment,
    ),
    "result timeout": (lambda v: wait(v), lambda s: s),
    "visibility_timeout": (
        lambda v: Queue("td", redis_url=URL, visibility_timeout=v),
        lambda q: q.visibility_timeout,
    ),
    "result_ttl": (lambda v: Queue("td", redis_url=URL, result_ttl=v), lambda q: q.result_ttl),
    "shutdown_timeout": (
        lambda v: Worker(_queue(), shutdown_timeout=v),
        lambda w: w.shutdown_timeout,
    ),
    "max_age check": (lambda v: positive_seconds("max_age", v), lambda s: s),
    "RateLimit.period": (lambda v: RateLimit(10, v), lambda r: r.period),
    "Every": (lambda v: Every(v), lambda e: e.seconds),
}


@pytest.mark.parametrize("place", sorted(PLACES))
def test_a_timedelta_is_its_seconds(place: str) -> None:
    build, read = PLACES[place]
    assert read(build(dt.timedelta(minutes=2))) == 120.0
    assert read(build(120)) == 120.0


@pytest.mark.parametrize("place", sorted(PLACES))
def test_a_negative_timedelta_is_refused_as_a_negative_number(place: str) -> None:
    build, _ = PLACES[place]
    with pytest.raises(ConfigurationError) as number:
        build(-5)
    with pytest.raises(ConfigurationError) as delta:
        build(dt.timedelta(seconds=-5))
    assert str(delta.value).split(" got ")[0] == str(number.value).split(" got ")[0]
    assert "-5" in str(delta.value)
    assert "days=-1" not in str(delta.value)  # the timedelta's repr is not shown


def test_the_messages_name_the_value() -> None:
    with pytest.raises(ConfigurationError) as caught:
        _bound(delay=dt.timedelta(seconds=-5))
    assert str(caught.value) == (
        "delay must be a finite number of seconds >= 0 and at most 10 years (315360000 s), got -5.0"
    )
    with pytest.raises(ConfigurationError) as caught:
        Retry(dt.timedelta(seconds=-3))
    assert (
        str(caught.value)
        == "Retry delay must be a finite number >= 0 seconds, got a timedelta of -3 s"
    )
    with pytest.raises(ConfigurationError) as caught:
        RetryPolicy(base=dt.timedelta(seconds=-1))
    assert str(caught.value).endswith("got a timedelta of -1 s")


def test_an_eta_is_no_timedelta() -> None:
    with pytest.raises(ConfigurationError, match=r"a timedelta of 5 s: a time from now is delay="):
        _bound(eta=dt.timedelta(seconds=5))


def test_a_timedelta_retry_pickles_as_its_seconds() -> None:
    import pickle

    again = pickle.loads(pickle.dumps(Retry(dt.timedelta(seconds=3), "later")))
    assert (again.delay, again.reason) == (3.0, "later")
