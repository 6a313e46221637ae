"""Features SwarmQ users look for, against a real Redis: ``NoRetry``, linear backoff in a
worker, ``queue.send_many`` mixing tasks, ``blitzq task send`` and the burst idle timeout
(docs/coming-from-swarmq.md)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from blitzq import ConfigurationError, NoRetry, Queue, RetryPolicy, TaskFailed, TaskState
from blitzq.cli import cli
from tests.broker_kinds import is_amqp

from . import proc_tasks
from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)

_CLEAN_ENV: dict[str, str | None] = {
    "BLITZQ_REDIS_URL": None,
    "BLITZQ_NAMESPACE": None,
    "BLITZQ_MODE": None,
}


@pytest.fixture(params=["reliable", "fast"])
async def queue(request: pytest.FixtureRequest, make_queue: Callable[..., Queue]) -> Any:
    """A Queue in each mode on the test namespace, closed after the test."""
    q = make_queue(mode=request.param)
    yield q
    await q.close()


# ------------------------------------------------------------------------------- NoRetry
async def test_no_retry_fails_the_task_for_good(queue: Queue) -> None:
    calls: list[int] = []

    @queue.task(name="t.never_again", retries=5, retry_policy=RetryPolicy(base=0.01))
    async def never_again(x: int) -> None:
        calls.append(x)
        raise NoRetry(f"bad input {x}")

    async with running(make_worker(queue, concurrency=2)):
        handle = await never_again.enqueue(7)
        with pytest.raises(TaskFailed) as info:
            await handle.result(timeout=30)
    assert calls == [7]
    assert info.value.error_type == "blitzq.exceptions.NoRetry"
    assert info.value.error == "bad input 7"
    record = await queue.inspect(handle.id)
    assert record is not None
    assert record.attempts == 1
    assert record.state is TaskState.DEAD_LETTERED  # dead_letter=True is the default


async def test_no_retry_from_a_cause_records_the_cause(queue: Queue) -> None:
    @queue.task(name="t.caused", retries=3, retry_policy=RetryPolicy(base=0.01))
    def caused() -> None:
        try:
            {}["missing"]
        except KeyError as exc:
            raise NoRetry from exc

    async with running(make_worker(queue, concurrency=2)):
        handle = await caused.enqueue()
        with pytest.raises(TaskFailed) as info:
            await handle.result(timeout=30)
    assert info.value.error_type == "KeyError"
    record = await queue.inspect(handle.id)
    assert record is not None
    assert record.attempts == 1


async def test_no_retry_and_retry_cross_back_from_a_process_task(
    make_queue: Callable[..., Queue], tmp_path: Any
) -> None:
    """``NoRetry`` and ``Retry(delay=)`` raised in an ``executor="process"`` task reach the
    worker as themselves (they pickle by their arguments), not as a generic remote error."""
    queue = make_queue()
    never = queue.task(
        name="t.proc_never", executor="process", retries=5, retry_policy=RetryPolicy(base=60)
    )(proc_tasks.no_retry_in_process)
    # a policy backoff of 600 s: only the Retry's own delay lets the second call come soon
    slow = RetryPolicy(base=600, jitter="none")
    again = queue.task(name="t.proc_again", executor="process", retries=1, retry_policy=slow)(
        proc_tasks.retry_once_in_process
    )
    try:
        async with running(make_worker(queue, concurrency=2, process_pool_size=1)):
            handle = await never.enqueue("from a child")
            with pytest.raises(TaskFailed) as info:
                await handle.result(timeout=60)
            assert info.value.error_type == "blitzq.exceptions.NoRetry"
            assert info.value.error == "from a child"
            retried = await again.enqueue(str(tmp_path / "calls"), 0.05)
            assert await retried.result(timeout=60) == 2
    finally:
        await queue.close()


async def test_linear_backoff_retries_in_a_worker(queue: Queue) -> None:
    calls: list[int] = []
    policy = RetryPolicy(base=0.05, backoff="linear", jitter="none")

    @queue.task(name="t.flaky", retries=3, retry_policy=policy)
    async def flaky() -> int:
        calls.append(1)
        if len(calls) < 3:
            raise ValueError("not yet")
        return len(calls)

    async with running(make_worker(queue, concurrency=2)):
        handle = await flaky.enqueue()
        assert await handle.result(timeout=30) == 3
    assert [policy.delay(n) for n in (1, 2)] == [0.05, 0.1]


# ----------------------------------------------------------------------------- send_many
async def test_send_many_mixes_tasks_queues_and_options(queue: Queue) -> None:
    @queue.task(name="t.add")
    async def add(a: int, b: int) -> int:
        return a + b

    @queue.task(name="t.greet", queue="greetings")
    async def greet(name: str, punctuation: str = ".") -> str:
        return f"hello {name}{punctuation}"

    handles = await queue.send_many(
        [
            ("t.add", (1, 2), {}),
            ("t.greet", ["ann"], {"punctuation": "!"}),
            ("t.add", [3], {"b": 4}, {"task_id": "sum-7", "delay": 0.05}),
            ("t.greet", ("bob",), None, {"queue": "default"}),
        ]
    )
    assert [h.queue for h in handles] == ["default", "greetings", "default", "default"]
    assert handles[2].id == "sum-7"
    async with running(make_worker(queue, queues=["default", "greetings"], concurrency=4)):
        results = [await h.result(timeout=30) for h in handles]
    assert results == [3, "hello ann!", 7, "hello bob."]


async def test_send_many_is_one_publish_per_physical_queue(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six items for two queues and two delayed ones: one publish per queue, one schedule
    write (the real broker's methods, counted on the way)."""
    broker = queue.broker
    calls: list[tuple[str, int]] = []
    publish, schedule = broker.publish, broker.schedule

    async def counted_publish(name: str, messages: Any) -> None:
        calls.append((name, len(messages)))
        await publish(name, messages)

    async def counted_schedule(items: Any) -> None:
        calls.append(("schedule", len(items)))
        await schedule(items)

    monkeypatch.setattr(broker, "publish", counted_publish)
    monkeypatch.setattr(broker, "schedule", counted_schedule)
    items: list[Any] = [("t.a", (i,), {}) for i in range(3)]
    items += [("t.b", (i,), {}, {"queue": "other"}) for i in range(3)]
    items += [("t.c", (), {}, {"delay": 30}), ("t.c", (), {}, {"delay": 60})]
    handles = await queue.send_many(items)
    assert len(handles) == 8
    assert sorted(calls) == [("default", 3), ("other", 3), ("schedule", 2)]


async def test_send_many_refuses_a_bad_item_before_publishing(queue: Queue) -> None:
    bad_items: list[Any] = [
        [("t.a", (), {}), ("t.b", ())],  # too short
        [("t.a", (), {}), ("t.b", "abc", {})],  # args not a list
        [("t.a", (), {}), ("t.b", (), [])],  # kwargs not a dict
        [("t.a", (), {}), ("t.b", (), {}, {"nope": 1})],  # unknown option
        [("t.a", (), {}), ("t.b", (), {}, "opts")],  # options not a dict
        [("t.a", (), {}), (None, (), {})],  # name not a str
        [("t.a", (), {}, {"task_id": "x"}), ("t.b", (), {}, {"task_id": "x"})],  # same id
        "t.a",
    ]
    for items in bad_items:
        with pytest.raises(ConfigurationError):
            await queue.send_many(items)
    assert not any(c["waiting"] for c in (await queue.stats())["queues"].values())
    assert await queue.send_many([]) == []


def test_send_many_sync(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()
    try:
        handles = queue.send_many_sync([("t.x", (1,), {}), ("t.y", (), {"k": "v"})])
        assert [h.task for h in handles] == ["t.x", "t.y"]
        assert queue.stats_sync()["queues"]["default"]["waiting"] == 2
    finally:
        queue.close_sync()


# ----------------------------------------------------------------------- blitzq task send
@pytest.fixture
def invoke(server_url: str, namespace: str) -> Callable[..., Any]:
    """Run ``blitzq --redis-url <test server> --namespace <test ns> ARGS`` in-process."""

    def run(*args: str) -> Any:
        return CliRunner().invoke(
            cli, ["--redis-url", server_url, "--namespace", namespace, *args], env=_CLEAN_ENV
        )

    return run


async def test_task_send_enqueues_by_name(queue: Queue, invoke: Callable[..., Any]) -> None:
    @queue.task(name="t.mul")
    async def mul(a: int, b: int = 1) -> int:
        return a * b

    mode = ["--mode", queue.mode]
    result = await asyncio.to_thread(
        invoke, *mode, "task", "send", "t.mul", "--args", "[6]", "--kwargs", '{"b": 7}'
    )
    assert result.exit_code == 0, result.output
    task_id = result.stdout.strip()
    doc_run = await asyncio.to_thread(
        invoke, *mode, "--json", "task", "send", "t.mul", "--args", "[2, 3]", "--delay", "0.05"
    )
    assert doc_run.exit_code == 0, doc_run.output
    doc = json.loads(doc_run.stdout)
    assert doc["task"] == "t.mul"
    assert doc["queue"] == "default"
    async with running(make_worker(queue, concurrency=2)):
        assert await queue.get_result(task_id, timeout=30) == 42
        assert await queue.get_result(doc["id"], timeout=30) == 6


def test_task_send_to_a_queue(make_queue: Callable[..., Queue], invoke: Callable[..., Any]) -> None:
    result = invoke("--json", "task", "send", "t.any", "--queue", "emails")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["queue"] == "emails"
    queue = make_queue()
    try:
        assert queue.stats_sync()["queues"]["emails"]["waiting"] == 1
    finally:
        queue.close_sync()


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--args", "{not json"], "--args"),
        (["--args", '{"a": 1}'], "--args"),
        (["--args", "[NaN]"], "--args"),
        (["--args", "[" * 200 + "]" * 200], "--args"),
        (["--kwargs", "[1]"], "--kwargs"),
        (["--kwargs", '{"a": Infinity}'], "--kwargs"),
        (["--delay", "-1"], "--delay"),
        (["--delay", "nan"], "--delay"),
        (["--queue", "a b"], "--queue"),
        (["--queue", "emails:high"], "--queue"),
    ],
    ids=repr,
)
def test_task_send_bad_input_is_a_usage_error(
    invoke: Callable[..., Any], args: list[str], option: str
) -> None:
    result = invoke("task", "send", "t.any", *args)
    assert result.exit_code == 2, result.output
    assert option in result.stderr
    assert "Traceback" not in result.output
    as_json = invoke("--json", "task", "send", "t.any", *args)
    assert as_json.exit_code == 2
    assert json.loads(as_json.stdout)["exit_code"] == 2


# ------------------------------------------------------------------- burst idle timeout
async def test_burst_idle_timeout_waits_for_late_work(queue: Queue) -> None:
    done = asyncio.Event()

    @queue.task(name="t.late")
    async def late() -> str:
        done.set()
        return "ran"

    worker = make_worker(queue, burst=True, burst_idle_timeout=30.0)
    task = asyncio.create_task(worker.run())
    try:
        # the worker found its queues drained, and waits out its idle timeout
        await eventually(lambda: asyncio.sleep(0, worker.idle_since is not None), bool)
        handle = await late.enqueue()
        assert await handle.result(timeout=30) == "ran"
        assert done.is_set()
        assert not task.done()
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def test_burst_idle_timeout_stops_an_idle_worker(queue: Queue) -> None:
    worker = make_worker(queue, burst=True, burst_idle_timeout=0.3)
    started = time.monotonic()
    await asyncio.wait_for(worker.run(), 30)
    assert time.monotonic() - started >= 0.3  # idle that long, not less


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), True, "1"])
def test_burst_idle_timeout_is_checked(make_queue: Callable[..., Queue], value: Any) -> None:
    with pytest.raises(ConfigurationError):
        make_worker(make_queue(), burst=True, burst_idle_timeout=value)


def test_burst_idle_timeout_needs_burst(invoke: Callable[..., Any]) -> None:
    result = invoke("worker", "myapp.tasks:queue", "--burst-idle-timeout", "5")
    assert result.exit_code == 2, result.output
    assert "--burst-idle-timeout" in result.stderr
    bad = invoke("worker", "myapp.tasks:queue", "--burst", "--burst-idle-timeout", "nan")
    assert bad.exit_code == 2
    assert "--burst-idle-timeout" in bad.stderr


def test_watch_dir_needs_reload_and_an_existing_directory(
    invoke: Callable[..., Any], tmp_path: Any
) -> None:
    result = invoke("worker", "myapp.tasks:queue", "--watch-dir", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "--watch-dir" in result.stderr
    missing = invoke("worker", "myapp.tasks:queue", "--reload", "--watch-dir", "/no/such/dir")
    assert missing.exit_code == 2
    assert "--watch-dir" in missing.stderr


# ---------------------------------------------------------------------- x-delivery-limit
async def test_quorum_queue_delivery_limit_comes_from_max_deliveries(
    server_url: str, namespace: str
) -> None:
    """The default Queue declares ``x-delivery-limit`` 19 (the backstop, ``4 x
    max_deliveries``, minus the first delivery; the worker counts a crashing task's solo runs
    against ``max_deliveries`` itself), not SwarmQ's 20: RabbitMQ refuses to redeclare it
    with 20."""
    import aio_pika

    from tests.amqp_server import amqp_or_skip, delete_amqp_queues

    url = amqp_or_skip()
    queue = Queue("dl", redis_url=server_url, namespace=namespace, amqp_url=url)
    broker = queue.broker
    try:
        assert is_amqp(broker)
        assert broker.transport.link.arguments()["x-delivery-limit"] == 19
        await queue.send("t.any")  # declares <namespace>.dl
        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel()
            args = dict(broker.transport.link.arguments())
            await channel.declare_queue(f"{namespace}.dl", durable=True, arguments=args)
            args["x-delivery-limit"] = 20
            with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
                await channel.declare_queue(f"{namespace}.dl", durable=True, arguments=args)
        finally:
            await connection.close()
    finally:
        await delete_amqp_queues(url, [broker])
        await queue.close()


async def test_a_queue_declared_with_the_earlier_limit_is_used_as_it_is(
    server_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A queue an earlier version declared (``x-delivery-limit`` ``max_deliveries - 1``) is
    declared again with that limit, with a WARNING, instead of refused."""
    import aio_pika

    from tests.amqp_server import amqp_or_skip, delete_amqp_queues

    url = amqp_or_skip()
    queue = Queue("old", redis_url=server_url, namespace=namespace, amqp_url=url)
    broker = queue.broker
    try:
        assert is_amqp(broker)
        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel()
            args = broker.transport.link.arguments(legacy=True)
            assert args["x-delivery-limit"] == 4
            await channel.declare_queue(f"{namespace}.old", durable=True, arguments=args)
        finally:
            await connection.close()
        with caplog.at_level("WARNING", logger="blitzq.broker.amqp"):
            await queue.send("t.any")
        assert "declared by an earlier blitzq with x-delivery-limit 4" in caplog.text
        assert await queue.broker.transport.link.message_count("old") == 1
    finally:
        await delete_amqp_queues(url, [broker])
        await queue.close()
