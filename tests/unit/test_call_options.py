"""Per-call options a middleware declares (``Middleware.call_options``): checked where the call
is made, carried in the message's generic ``options`` field, read back by the middleware; the
built-in ``max_age`` goes the same way (and a message from before the field still expires)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

import msgspec
import pytest

from blitzq import ConfigurationError, Middleware, Queue
from blitzq.extensions.expiry import call_max_age, check_expiry, start_checks
from blitzq.options import Option
from blitzq.serialization import Envelope, decode_envelope, encode_envelope

URL = "redis://127.0.0.1:6379/0"  # never connected to: nothing here touches a server


def check_region(label: str, value: Any) -> Any:
    if value is not None and value not in ("eu", "us"):
        raise ConfigurationError(f"{label} must be 'eu' or 'us', got {value!r}")
    return value


class Region(Middleware):
    """A middleware declaring one per-call option, as docs/architecture.md's example does."""

    call_options: ClassVar[Mapping[str, Option]] = {"region": Option(None, check_region)}


def make_queue() -> Queue:
    return Queue(name="co", redis_url=URL, namespace="unused")


def test_a_declared_call_option_is_checked_bound_and_dropped_by_none() -> None:
    queue = make_queue()
    queue.add_middleware(Region())

    @queue.task(name="co.t")
    async def t() -> None:
        return None

    bound = t.options(region="eu", delay=1)
    assert bound.call_options.extensions == {"region": "eu"}
    assert bound.call_options.delay == 1
    assert bound.options(region=None).call_options.extensions is None
    with pytest.raises(ConfigurationError, match="region must be 'eu' or 'us'"):
        t.options(region="mars")
    with pytest.raises(ConfigurationError, match=r"unknown call option 'zone'"):
        t.options(zone="eu")


def test_a_middleware_added_later_gives_its_call_options_to_earlier_tasks() -> None:
    queue = make_queue()

    @queue.task(name="co.early")
    async def early() -> None:
        return None

    with pytest.raises(ConfigurationError, match="unknown call option 'region'"):
        early.options(region="us")
    queue.add_middleware(Region())
    assert early.options(region="us").call_options.extensions == {"region": "us"}


def test_the_call_options_travel_in_the_envelope_options_field() -> None:
    queue = make_queue()
    queue.add_middleware(Region())

    @queue.task(name="co.env")
    async def env_task() -> None:
        return None

    opts = env_task.options(region="eu", max_age=5).call_options
    env = queue._producer.envelope("co.env", "co", (), {}, opts, 100.0)
    assert env.options == {"region": "eu", "max_age": 5.0}
    assert env.max_age is None  # the old field is left to messages from before
    assert decode_envelope(encode_envelope(env, 10_000)).options == env.options
    assert call_max_age(env) == 5.0
    assert check_expiry in start_checks(env_task, env)


def test_send_by_name_accepts_the_call_options_of_the_queues_middleware() -> None:
    from blitzq.client.named import named_options

    queue = make_queue()
    queue.add_middleware(Region())
    opts = named_options(queue._producer, "send", "elsewhere.t", (), {}, {"region": "us"})
    assert opts.extensions == {"region": "us"}
    with pytest.raises(ConfigurationError, match="unknown call option"):
        named_options(queue._producer, "send", "elsewhere.t", (), {}, {"zone": "us"})


def test_a_message_from_before_the_options_field_decodes_and_keeps_its_max_age() -> None:
    old = Envelope("id1", "co.t", "co", [], {}, 1, 100.0, 100.0, max_age=3.0)
    # The layout of a message enqueued before the options field: its first 16 fields.
    data = msgspec.msgpack.encode(list(msgspec.structs.astuple(old))[:16])
    env = decode_envelope(data)
    assert env.options is None
    assert env.max_age == 3.0
    assert call_max_age(env) == 3.0


def test_a_call_without_per_call_options_has_no_options_field() -> None:
    queue = make_queue()

    @queue.task(name="co.plain")
    async def plain() -> None:
        return None

    env = queue._producer.envelope("co.plain", "co", (), {}, plain.options().call_options, 1.0)
    assert env.options is None
    assert len(msgspec.msgpack.decode(encode_envelope(env, 10_000))) == 7  # small


@pytest.mark.parametrize(
    "eta",
    [
        -100.0,
        -1,
        float("nan"),
        float("inf"),
        float("-inf"),
        True,
        "1700000000",
        datetime(1969, 12, 31, 23, 59, tzinfo=UTC),
        datetime(2030, 1, 1, 12, 0),  # naive: refused by options() as by the enqueue
    ],
)
def test_an_eta_that_is_not_a_unix_time_from_0_is_refused_at_enqueue(eta: Any) -> None:
    """As a negative ``delay`` is: a ConfigurationError where the options are given."""
    task = make_queue().task(name="co.eta")(lambda: None)
    with pytest.raises(ConfigurationError, match="eta must"):
        task.options(eta=eta)


@pytest.mark.parametrize("eta", [0, 0.0, 1.5, datetime(1970, 1, 1, tzinfo=UTC)])
def test_an_eta_from_unix_time_0_is_taken_and_runs_at_once_when_past(eta: Any) -> None:
    options = make_queue().task(name="co.eta_ok")(lambda: None).options(eta=eta)
    assert options.call_options.eta == eta
    assert options.call_options.due_time(1e9) == (
        eta.timestamp() if isinstance(eta, datetime) else eta
    )


def test_delay_and_eta_together_are_refused_where_the_options_are_given() -> None:
    task = make_queue().task(name="co.both")(lambda: None)
    with pytest.raises(ConfigurationError, match="not both"):
        task.options(delay=5, eta=datetime(2030, 1, 1, tzinfo=UTC))
