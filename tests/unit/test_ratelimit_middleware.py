"""The rate-limit middleware without a server: which tasks get its start check, in which
place, and which token buckets a start draws on."""

from __future__ import annotations

import pytest

from blitzq import ConfigurationError, Queue, RateLimit
from blitzq.extensions.expiry import check_expiry, checks_with_expiry
from blitzq.extensions.ratelimit import RateCheck

URL = "redis://127.0.0.1:1/0"


def test_no_limit_anywhere_means_no_check() -> None:
    queue = Queue(name="rq", redis_url=URL, namespace="unused")

    @queue.task(name="r.free")
    def free() -> None:
        return None

    # The fast path: nothing to await before a start, so admission runs the task at once.
    assert free.checks == []
    assert free.rate_limit is None


def test_task_limit_is_keyed_and_its_check_runs_first() -> None:
    queue = Queue(name="rq", redis_url=URL, namespace="unused")

    @queue.task(name="r.limited", rate_limit="10/s", lock="k", max_age=5)
    def limited() -> None:
        return None

    @queue.task(name="r.shared", rate_limit=RateLimit(2, 1.0, burst=1), rate_key="api")
    def shared() -> None:
        return None

    assert limited.rate_limit == RateLimit(10.0, 1.0, None, "r.limited")
    assert shared.rate_limit == RateLimit(2, 1.0, 1, "api")
    assert isinstance(limited.checks[0], RateCheck)
    assert limited.checks[1] is check_expiry
    assert len(limited.checks) == 3  # rate limit, expiry, lock
    # A per-call max_age adds expiry after the rate limit, as the built-in order does.
    assert checks_with_expiry(shared)[1:] == [check_expiry]
    check = shared.checks[0]
    assert isinstance(check, RateCheck)
    assert check.buckets("rq") == [("api", 2.0, 1)]


def test_queue_limits_give_every_task_a_check_with_the_queue_bucket() -> None:
    queue = Queue(name="rq", redis_url=URL, namespace="unused", queue_rate_limits={"slowq": "5/s"})

    @queue.task(name="r.own", rate_limit="10/s")
    def own() -> None:
        return None

    @queue.task(name="r.plain")
    def plain() -> None:
        return None

    assert queue.queue_rate_limits == {"slowq": RateLimit(5.0, 1.0, None, "queue:slowq")}
    own_check, plain_check = own.checks[0], plain.checks[0]
    assert isinstance(own_check, RateCheck)
    assert isinstance(plain_check, RateCheck)
    assert plain_check.buckets("rq") == []
    assert plain_check.buckets("slowq:high") == [("queue:slowq", 5.0, 5.0)]
    assert own_check.buckets("slowq") == [("r.own", 10.0, 10.0), ("queue:slowq", 5.0, 5.0)]
    assert own_check.buckets("slowq") is own_check.buckets("slowq")  # worked out once


def test_rate_options_are_checked_when_the_task_is_registered() -> None:
    queue = Queue(name="rq", redis_url=URL, namespace="unused")
    with pytest.raises(ConfigurationError, match="rate_key= needs a rate_limit="):
        queue.task(name="r.key", rate_key="k")(lambda: None)
    with pytest.raises(ConfigurationError, match=r"task r\.badkey: rate_key must be"):
        queue.task(name="r.badkey", rate_limit="1/s", rate_key="")(lambda: None)
    with pytest.raises(ConfigurationError, match="is not like"):
        queue.task(name="r.bad", rate_limit="fast")(lambda: None)
    with pytest.raises(ConfigurationError, match="queue_rate_limits must be a dict"):
        Queue(redis_url=URL, queue_rate_limits=["10/s"])  # type: ignore[arg-type]
