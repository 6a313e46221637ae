"""Bad input at both ends, against a real Redis in both modes.

At enqueue, anything that is not plain data (or too large) is refused with an error and nothing
is published. At the worker, messages planted by hand in the queue's stream or list (garbage,
wrong shapes, foreign fields, unknown tasks, oversized) are dead-lettered with a reason while the
worker keeps going (invariant 8).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from blitzq import (
    ConfigurationError,
    Every,
    MessageTooLarge,
    Queue,
    RateLimit,
    RetryPolicy,
    Scheduler,
    SerializationError,
    Signature,
    TaskFailed,
    TaskState,
    Worker,
)
from blitzq.broker.redis.keys import MESSAGE_FIELD, Keys
from blitzq.cli import cli
from blitzq.limits import MAX_SECONDS
from blitzq.serialization import EXT_DECIMAL, Envelope, encode_envelope

from .proc_tasks import eventually, make_worker, running


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@dataclasses.dataclass
class Point:
    """A dataclass: not plain data."""

    x: int
    y: int


class Custom:
    """An arbitrary object: not plain data."""


NOT_PLAIN: list[Any] = [
    object(),
    Custom(),
    {1, 2},
    frozenset({1}),
    Point(1, 2),
    {1: "int key"},
    {("a",): "tuple key"},
    {"nested": {"deeper": [1, {2, 3}]}},
    [1, object()],
    2**64,
    -(2**63) - 1,
    [2**70],
    dt.timedelta(seconds=1),
    complex(1, 2),
    bytearray(b"x"),
]


async def published_nothing(queue: Queue, raw_redis: Any, namespace: str) -> None:
    """Assert that no message reached the queue's stream/list or the schedule."""
    keys = Keys(namespace)
    key = keys.stream(queue.name) if queue.mode == "reliable" else keys.list(queue.name)
    assert await raw_redis.exists(key) == 0
    stats = await queue.stats([queue.name])
    assert stats["queues"][queue.name]["waiting"] == 0
    assert stats["scheduled"] == 0


# ------------------------------------------------------------------------------- enqueue
@pytest.mark.parametrize("value", NOT_PLAIN, ids=lambda v: type(v).__name__)
async def test_non_plain_argument_is_refused_at_enqueue(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str, value: Any
) -> None:
    queue = make_queue(mode=mode)

    @queue.task(name="bad.take")
    async def take(x: Any = None) -> None:
        return None

    try:
        with pytest.raises(SerializationError):
            await take.enqueue(value)
        with pytest.raises(SerializationError):
            await take.enqueue(x=value)
        with pytest.raises(SerializationError):
            await take.options(delay=30).enqueue(value)
        with pytest.raises(SerializationError):
            await take.enqueue_many([(1,), (value,), (2,)])
        with pytest.raises(SerializationError):
            await queue.send("bad.take", args=(value,))
        with pytest.raises(SerializationError):
            await take.options(headers={"h": value}).enqueue(1)
        await published_nothing(queue, raw_redis, namespace)
    finally:
        await queue.close()


async def test_message_over_max_size_is_refused_at_enqueue(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(mode=mode, max_message_size=1024)

    @queue.task(name="bad.big")
    async def big(data: str) -> None:
        return None

    try:
        with pytest.raises(MessageTooLarge) as info:
            await big.enqueue("x" * 2000)
        assert info.value.limit == 1024
        assert info.value.size > 2000
        with pytest.raises(MessageTooLarge):
            await big.enqueue_many([("small",), ("y" * 5000,)])
        with pytest.raises(MessageTooLarge):
            await big.options(delay=10).enqueue("z" * 3000)
        await published_nothing(queue, raw_redis, namespace)
        # Just under the limit is fine.
        handle = await big.enqueue("x" * 900)
        stats = await queue.stats([queue.name])
        assert stats["queues"][queue.name]["waiting"] == 1
        assert handle.id
    finally:
        await queue.close()


# -------------------------------------------------------------------------------- worker
def malformed_payloads(queue_name: str) -> list[bytes]:
    """Messages that are not well-formed envelopes."""
    bad_decimal = msgspec.msgpack.encode(
        ["bad-dec", "bad.ok", queue_name, [msgspec.msgpack.Ext(EXT_DECIMAL, b"not a number")]]
    )
    bad_datetime = msgspec.msgpack.encode(
        ["bad-dt", "bad.ok", queue_name, [msgspec.msgpack.Ext(1, b"yesterday-ish")]]
    )
    return [
        b"\xc1\x00 this is not msgpack",
        b"",
        msgspec.msgpack.encode({"id": "map-1", "task": "bad.ok", "queue": queue_name}),
        msgspec.msgpack.encode([1, 2, 3]),
        msgspec.msgpack.encode(["wrong-args", "bad.ok", queue_name, "not a list"]),
        msgspec.msgpack.encode(["wrong-kwargs", "bad.ok", queue_name, [], {1: 2}]),
        msgspec.msgpack.encode("just a string"),
        bad_decimal,
        bad_datetime,
        msgspec.msgpack.encode(
            ["unknown-ext", "bad.ok", queue_name, [msgspec.msgpack.Ext(99, b"?")]]
        ),
    ]


async def test_worker_dead_letters_bad_messages_and_goes_on(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(mode=mode, max_message_size=2048)
    runs: list[Any] = []

    @queue.task(name="bad.ok")
    async def ok(x: Any) -> Any:
        runs.append(x)
        return x

    keys = Keys(namespace)
    expected: Counter[str] = Counter()

    async def plant(payload: bytes, field: bytes = MESSAGE_FIELD) -> None:
        if mode == "reliable":
            await raw_redis.xadd(keys.stream(queue.name), {field: payload})
        else:
            await raw_redis.rpush(keys.list(queue.name), payload)

    for payload in malformed_payloads(queue.name):
        await plant(payload)
        expected["malformed message"] += 1
    unknown = Envelope("unknown-1", "no.such.task", queue.name, [1])
    await plant(encode_envelope(unknown, 1 << 20))
    expected["unknown task"] += 1
    oversized = Envelope("oversized-1", "bad.ok", queue.name, ["x" * 5000])
    await plant(encode_envelope(oversized, 1 << 20))
    expected["message too large"] += 1
    if mode == "reliable":
        # A stream entry without the "m" field is not a blitzq message, whatever it holds.
        foreign = Envelope("foreign-1", "bad.ok", queue.name, ["foreign"])
        await plant(encode_envelope(foreign, 1 << 20), field=b"data")
        expected["malformed message"] += 1

    try:
        worker = make_worker(queue, concurrency=4)
        async with running(worker):
            handle = await ok.enqueue("valid")
            assert await handle.result(timeout=15) == "valid"
            dead = await eventually(
                lambda: queue.dead_letters(limit=100),
                lambda rows: len(rows) >= sum(expected.values()),
            )
            # The worker is still consuming after all of that.
            again = await ok.enqueue("still alive")
            assert await again.result(timeout=15) == "still alive"
        assert runs == ["valid", "still alive"]
        assert Counter(d.reason for d in dead) == expected
        by_id = {d.id: d for d in dead}
        assert by_id["unknown-1"].task == "no.such.task"
        assert "no.such.task" in by_id["unknown-1"].error
        assert by_id["unknown-1"].args == [1]
        assert all(d.queue == queue.name for d in dead)
        planted = {bytes(p) for p in malformed_payloads(queue.name)}
        assert planted <= {d.message for d in dead}
        # An unknown task has a final record, so a waiter learns its fate.
        with pytest.raises(TaskFailed) as info:
            await queue.get_result("unknown-1", timeout=5)
        assert info.value.state == TaskState.DEAD_LETTERED.value
        # Nothing is left waiting or in flight.
        stats = await queue.stats([queue.name])
        assert stats["queues"][queue.name] == {"waiting": 0, "in_flight": 0}
    finally:
        await queue.close()


# ------------------------------------------------- call options, checked at the edge
def _deep(levels: int) -> Any:
    """A list nested ``levels`` deep."""
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


BAD_CALL_OPTIONS: list[dict[str, Any]] = [
    {"correlation_id": 5},  # the fresh-user repro: dead-lettered as malformed before
    {"correlation_id": b"abc"},
    {"correlation_id": ""},
    {"delay": True},
    {"delay": 1e300},
    {"delay": float("nan")},
    {"delay": float("inf")},
    {"delay": -5},
    {"delay": "5"},
    {"eta": True},
    {"eta": float("nan")},
    {"eta": 1e20},  # far beyond the 10-year maximum
    {"eta": dt.datetime(9999, 1, 1, tzinfo=dt.UTC)},
    {"timeout": True},
    {"timeout": float("nan")},
    {"timeout": 1e300},
    {"max_age": True},
    {"max_age": float("inf")},
    {"headers": ["x"]},
    {"headers": "x=1"},
    {"unique_key": 5},
    {"task_id": 123},
    {"queue": 5},
]


@pytest.mark.parametrize("options", BAD_CALL_OPTIONS, ids=lambda o: repr(o)[:40])
async def test_bad_call_option_is_a_configuration_error_at_enqueue(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str, options: Any
) -> None:
    queue = make_queue(mode=mode)

    @queue.task(name="bad.opt")
    async def opt(x: Any = None) -> None:
        return None

    try:
        with pytest.raises(ConfigurationError):
            await opt.options(**options).enqueue(1)
        with pytest.raises(ConfigurationError):
            await opt.options(priority="high").options(**options).enqueue(1)
        with pytest.raises(ConfigurationError):
            await queue.send("bad.opt", args=(1,), **options)
        with pytest.raises(ConfigurationError):
            await opt.enqueue_many([((1,), {}), ((2,), {}, options)])
        await published_nothing(queue, raw_redis, namespace)
    finally:
        await queue.close()


async def test_good_edge_values_of_call_options_are_accepted(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(mode=mode)

    @queue.task(name="bad.edge")
    async def edge(x: Any = None) -> str | None:
        from blitzq import current_task

        task = current_task()
        return task.correlation_id if task else None

    try:
        later = await edge.options(delay=MAX_SECONDS).enqueue(1)  # exactly the maximum
        past = await edge.options(eta=time.time() - 3600).enqueue(2)  # a past eta: at once
        corr = await edge.options(correlation_id="order-7", timeout=1.5).enqueue(3)
        async with running(make_worker(queue, concurrency=2)):
            assert await past.result(timeout=15) is None
            assert await corr.result(timeout=15) == "order-7"
        stats = await queue.stats([queue.name])
        assert stats["scheduled"] == 1
        assert later.id
    finally:
        await queue.close()


def test_unknown_bound_option_is_a_configuration_error(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()

    @queue.task(name="bad.bound")
    async def bound() -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"unknown call option 'nope'.*options: .*delay"):
        bound.options(delay=1).options(nope=2)


async def test_an_unknown_option_is_named_on_every_path(make_queue: Callable[..., Queue]) -> None:
    """``send(**options)`` and ``enqueue_many``'s per-item dict refuse an unknown option with
    one message naming it and listing the options (never a dataclass's ``__init__`` text);
    ``Task.options`` has typed keywords, so a type checker (and Python) refuses it there."""
    queue = make_queue()

    @queue.task(name="bad.named")
    async def named(x: int) -> int:
        return x

    try:
        refusals = []
        with pytest.raises(ConfigurationError) as sent:
            await queue.send("bad.named", args=(1,), countdown=3)
        refusals.append(str(sent.value))
        with pytest.raises(ConfigurationError) as many:
            await named.enqueue_many([((1,), {}), ((2,), {}, {"countdown": 3})])  # type: ignore[list-item]
        refusals.append(str(many.value))
        for text in refusals:
            assert "unknown call option 'countdown'" in text
            assert "delay" in text
            assert "__init__" not in text
        # Task.options takes the options middleware declare too: an unknown one is named.
        with pytest.raises(ConfigurationError, match="unknown call option 'countdown'"):
            named.options(countdown=3)
        assert (await queue.stats())["queues"].get("bad.named") is None  # nothing published
    finally:
        await queue.close()


UNENCODABLE: list[Any] = ["\ud800", ["ok", "a\udcffb"], {"k": "\ud800"}, _deep(5000)]


@pytest.mark.parametrize("value", UNENCODABLE, ids=["surrogate", "in-list", "in-dict", "deep"])
async def test_unencodable_argument_is_a_serialization_error(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str, value: Any
) -> None:
    queue = make_queue(mode=mode)

    @queue.task(name="bad.enc")
    async def enc(x: Any = None) -> None:
        return None

    try:
        with pytest.raises(SerializationError):
            await enc.enqueue(value)
        with pytest.raises(SerializationError):
            await enc.enqueue(x=value)
        with pytest.raises(SerializationError):
            await enc.options(delay=30).enqueue(value)
        with pytest.raises(SerializationError):
            await enc.enqueue_many([(1,), (value,)])
        with pytest.raises(SerializationError):
            await queue.send("bad.enc", args=(value,))
        with pytest.raises(SerializationError):
            await enc.options(headers={"h": value}).enqueue(1)
        with pytest.raises(SerializationError):
            await enc.options(correlation_id="\ud800").enqueue(1)
        await published_nothing(queue, raw_redis, namespace)
    finally:
        await queue.close()


@pytest.mark.parametrize(
    ("args", "kwargs"), [(5, None), ("abc", None), ((), [1]), ((), "k=v")], ids=str
)
async def test_send_with_args_or_kwargs_of_the_wrong_type(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str, args: Any, kwargs: Any
) -> None:
    queue = make_queue()
    try:
        with pytest.raises(ConfigurationError):
            await queue.send("bad.any", args=args, kwargs=kwargs)
        await published_nothing(queue, raw_redis, namespace)
    finally:
        await queue.close()


def test_duplicate_periodic_name_is_refused(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()

    @queue.task(name="bad.tick")
    async def tick(n: int = 0) -> None:
        return None

    first = queue.add_periodic(tick, Every(60), name="p5")
    with pytest.raises(ConfigurationError, match="p5"):
        queue.add_periodic(tick, Every(30), name="p5")  # silently replaced the first before
    with pytest.raises(ConfigurationError, match="p5"):
        queue.add_periodic(tick, Every(60), name="p5", args=(1,))
    assert queue.periodic_tasks["p5"] is first
    queue.add_periodic(tick, Every(60), name="p5")  # the very same entry again: a no-op
    assert queue.periodic_tasks["p5"].schedule == Every(60)


# ------------------------------------------------------ Queue / Worker / task options
_NON_NUMBERS = [float("nan"), float("inf"), float("-inf"), True, False, "5", None]


@pytest.mark.parametrize(
    "option",
    [
        "visibility_timeout",
        "result_ttl",
        "max_deliveries",
        "max_message_size",
        "max_result_size",
        "dead_letter_cap",
        "dead_letter_ttl",
        "dead_letter_max_bytes",
    ],
)
@pytest.mark.parametrize("value", _NON_NUMBERS, ids=repr)
def test_numeric_queue_option_refuses_nan_inf_bool(option: str, value: Any) -> None:
    with pytest.raises(ConfigurationError, match=option):
        Queue("q", redis_url="redis://127.0.0.1:1/0", **{option: value})


@pytest.mark.parametrize(
    "options",
    [
        {"visibility_timeout": float("nan")},  # the repro: the maintenance loop died on it
        {"visibility_timeout": 1e300},
        {"max_deliveries": 2.5},
        {"result_ttl": 0},
        {"dead_letter_ttl": 1e300},
        {"store_results": "no"},
        {"track_state": 1},
        {"redis_url": 6379},
        {"routes": ["emails"]},
        {"queue_rate_limits": ["10/s"]},
    ],
    ids=repr,
)
def test_bad_queue_option_is_a_configuration_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        Queue("q", **{"redis_url": "redis://127.0.0.1:1/0", **options})


@pytest.mark.parametrize(
    "options",
    [
        {"shutdown_timeout": float("nan")},  # the repro: a stop that acted as 0
        {"shutdown_timeout": float("inf")},  # a stop must stay bounded
        {"shutdown_timeout": -1},
        {"shutdown_timeout": True},
        {"max_abandoned_threads": float("nan")},
        {"max_abandoned_threads": True},
        {"max_abandoned_threads": -1},
        {"block_timeout": float("nan")},
        {"block_timeout": 0},
        {"block_timeout": 3600},
        {"concurrency": float("inf")},
        {"concurrency": True},
        {"concurrency": 2.5},
        {"batch_size": float("nan")},
        {"thread_pool_size": 0},
        {"thread_pool_size": 1.5},
        {"process_pool_size": float("nan")},
        {"queue_concurrency": {"q": float("nan")}},
        {"queue_concurrency": {"q": True}},
        {"handle_signals": "yes"},
        {"strict_memory_policy": 1},
        {"name": 5},
        {"queues": "q1,q2"},
    ],
    ids=repr,
)
def test_bad_worker_option_is_a_configuration_error(options: dict[str, Any]) -> None:
    queue = Queue("q", redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError):
        Worker(queue, **options)


@pytest.mark.parametrize(
    "options",
    [
        {"timeout": float("nan")},
        {"timeout": True},
        {"timeout": 1e300},
        {"retries": float("nan")},
        {"retries": True},
        {"retries": 1.5},
        {"soft_timeout": 1e300},
        {"hard_timeout": float("inf")},
        {"soft_timeout": 5, "timeout": 2},  # the soft one would never fire
        {"soft_timeout": 2, "hard_timeout": 2},
        {"max_age": True},
        {"unique_ttl": float("nan")},
        {"unique": True, "unique_ttl": True},
        {"name": 5},
        {"dead_letter": "no"},
        {"store_result": 0},
        {"rate_limit": "1/s", "rate_key": 5},
        {"lock_ttl": 1e300},
    ],
    ids=repr,
)
def test_bad_task_option_is_a_configuration_error(options: dict[str, Any]) -> None:
    queue = Queue("q", redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError):

        @queue.task(**{"name": "bad.decorated", **options})
        def decorated() -> None:
            return None


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "abc", "1e300"])
def test_cli_shutdown_timeout_refuses_nan_inf_negative(value: str) -> None:
    result = CliRunner().invoke(cli, ["worker", "no.such:queue", "--shutdown-timeout", value])
    assert result.exit_code == 2, result.output
    assert "--shutdown-timeout" in result.output
    assert "finite number of seconds" in result.output or "not a number" in result.output


@pytest.mark.parametrize("value", ["nan", "inf", "0"])
def test_cli_scheduler_poll_interval_refuses_nan_inf(value: str) -> None:
    result = CliRunner().invoke(
        cli, ["scheduler", "run", "no.such:queue", "--poll-interval", value]
    )
    assert result.exit_code == 2, result.output
    assert "--poll-interval" in result.output


# ------------------------------------------------- the worker's reject path (item 1)
async def test_malformed_message_with_a_readable_id_fails_its_waiters(
    make_queue: Callable[..., Queue], mode: str, raw_redis: Any, namespace: str
) -> None:
    """A message malformed in one field (a foreign producer's int correlation_id, a bad
    Decimal, a message over max_message_size) whose id can be read is dead-lettered under
    that id with a final record: ``result()`` raises at once instead of waiting forever."""
    queue = make_queue(mode=mode, max_message_size=2048)

    @queue.task(name="bad.fine")
    async def fine(x: Any) -> Any:
        return x

    @queue.task(name="bad.surrogate", retries=0, dead_letter=False)
    async def surrogate() -> str:
        return "\ud800"  # not encodable: the run fails with SerializationError

    keys = Keys(namespace)

    async def plant(payload: bytes) -> None:
        if mode == "reliable":
            await raw_redis.xadd(keys.stream(queue.name), {MESSAGE_FIELD: payload})
        else:
            await raw_redis.rpush(keys.list(queue.name), payload)

    # What `hello.options(correlation_id=5).enqueue(1)` used to publish.
    await plant(
        msgspec.msgpack.encode(["corr-int", "bad.fine", queue.name, [1], {}, 1, 0.0, 0.0, 5])
    )
    await plant(
        msgspec.msgpack.encode(["corr-bytes", "bad.fine", queue.name, [2], {}, 1, 0.0, 0.0, b"abc"])
    )
    await plant(
        msgspec.msgpack.encode(
            ["bad-dec-2", "bad.fine", queue.name, [msgspec.msgpack.Ext(EXT_DECIMAL, b"x")]]
        )
    )
    await plant(encode_envelope(Envelope("big-1", "bad.fine", queue.name, ["x" * 5000]), 1 << 20))
    try:
        async with running(make_worker(queue, concurrency=4)):
            for ident, reason in [
                ("corr-int", "malformed message"),
                ("corr-bytes", "malformed message"),
                ("bad-dec-2", "malformed message"),
                ("big-1", "message too large"),
            ]:
                with pytest.raises(TaskFailed) as info:
                    await queue.get_result(ident, timeout=15)
                assert info.value.state == TaskState.DEAD_LETTERED.value
                assert info.value.error_type == reason
                record = await queue.inspect(ident)
                assert record is not None
                assert record.task == "bad.fine"
            handle = await surrogate.enqueue()
            with pytest.raises(TaskFailed) as failed:
                await handle.result(timeout=15)
            assert (failed.value.error_type or "").endswith("SerializationError")
            assert "Unicode" in (failed.value.error or "")
            assert await (await fine.enqueue("after")).result(timeout=15) == "after"
        dead = {d.id: d for d in await queue.dead_letters(limit=100)}
        # Listed under the task id (not the stream entry id), with the reason.
        assert set(dead) == {"corr-int", "corr-bytes", "bad-dec-2", "big-1"}
        assert dead["corr-int"].reason == "malformed message"
        assert dead["corr-int"].task == "bad.fine"
        assert "$[8]" in dead["corr-int"].error  # the field that did not decode
        assert dead["big-1"].reason == "message too large"
        stats = await queue.stats([queue.name])
        assert stats["queues"][queue.name] == {"waiting": 0, "in_flight": 0}
    finally:
        await queue.close()


@pytest.mark.parametrize(
    "options",
    [
        {"base": float("nan")},
        {"base": True},
        {"max_delay": float("inf")},
        {"max_delay": 1e300},
        {"factor": float("nan")},
        {"factor": float("inf")},
        {"factor": True},
        {"max_retries": 1.5},
        {"max_retries": True},
    ],
    ids=repr,
)
def test_bad_retry_policy_is_a_configuration_error(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**options)


def test_retry_delay_of_a_huge_factor_stays_at_max_delay() -> None:
    policy = RetryPolicy(factor=1e300, max_delay=60.0, jitter="none")
    assert policy.delay(5) == 60.0  # factor ** 4 overflows a float: the bound applies


@pytest.mark.parametrize(
    "args",
    [(float("nan"), 1.0), (10, float("inf")), (True, 1.0), (10, 1.0, float("nan")), ("5", 1.0)],
    ids=repr,
)
def test_bad_rate_limit_is_a_configuration_error(args: tuple[Any, ...]) -> None:
    with pytest.raises(ConfigurationError):
        RateLimit(*args)


@pytest.mark.parametrize("timeout", [True, float("nan"), float("inf"), 1e300, 0], ids=repr)
def test_bad_workflow_step_timeout_is_a_configuration_error(timeout: Any) -> None:
    with pytest.raises(ConfigurationError, match="timeout"):
        Signature("t.step", (1,), {}, timeout=timeout)


@pytest.mark.parametrize(
    "options",
    [
        {"poll_interval": float("nan")},
        {"poll_interval": float("inf")},
        {"poll_interval": True},
        {"poll_interval": 0},
        {"grace": float("nan")},
        {"max_catch_up": float("inf")},
        {"max_catch_up": True},
        {"promote": "yes"},
    ],
    ids=repr,
)
def test_bad_scheduler_option_is_a_configuration_error(options: dict[str, Any]) -> None:
    queue = Queue("q", redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError):
        Scheduler(queue, **options)


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"args": 5}, ConfigurationError),
        ({"args": "ab"}, ConfigurationError),
        ({"kwargs": [1]}, ConfigurationError),
        ({"args": ("\ud800",)}, SerializationError),
        ({"kwargs": {"k": _deep(5000)}}, SerializationError),
    ],
    ids=["args-int", "args-str", "kwargs-list", "surrogate", "deep"],
)
def test_bad_periodic_arguments_are_refused_at_registration(
    options: dict[str, Any], error: type[Exception]
) -> None:
    queue = Queue("q", redis_url="redis://127.0.0.1:1/0")

    @queue.task(name="bad.periodic")
    async def tick(*args: Any, **kwargs: Any) -> None:
        return None

    with pytest.raises(error):
        queue.add_periodic(tick, Every(60), **options)
    assert queue.periodic_tasks == {}
