"""Failed attempts are logged so that alerts see them (issue 27, item 3), by a real worker on
a real Redis.

A task that fails for good (retries spent, not retried, dead-lettered, timed out on its last
attempt, its result not storable) is one record at ERROR on ``blitzq.worker.outcomes`` with
its traceback (``exc_info``) and the task's fields as record attributes; an attempt that is
retried is one WARNING without a traceback. Both levels are settable
(``Worker(failure_log_level=, retry_log_level=)``, ``--failure-log-level``,
``--retry-log-level``); messages dead-lettered without running (unknown task, past
``max_deliveries``) are logged at the failure level too; the JSON lines of the CLI show the
fields and the traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from blitzq import ConfigurationError, Queue, Retry, RetryPolicy, TaskFailed, Worker
from blitzq.broker.redis import ReliableRedisBroker
from blitzq.cli import cli
from blitzq.routing import levels
from blitzq.worker.ending import OUTCOME_LOGGER

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
FAST_RETRY = RetryPolicy(base=0.05, jitter="none")
FIELDS = ("task_id", "task", "queue", "worker_id", "attempt", "error_type", "error")


class Records(logging.Handler):
    """Keeps every record of the ``blitzq`` loggers."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def outcomes(self, task_id: str | None = None) -> list[logging.LogRecord]:
        """Records of failed attempts (of ``task_id`` only, when given), oldest first."""
        return [
            r
            for r in self.records
            if r.name == OUTCOME_LOGGER and (task_id is None or vars(r)["task_id"] == task_id)
        ]


@pytest.fixture
def logs() -> Iterator[Records]:
    """A handler on ``blitzq`` with the logger at DEBUG, removed after the test."""
    handler = Records()
    logger = logging.getLogger("blitzq")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


async def settle(handle: Any) -> None:
    """Wait for the task of ``handle`` to end (it fails)."""
    with pytest.raises(TaskFailed):
        await handle.result(timeout=30)


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The task fields of ``record``."""
    return {name: vars(record).get(name) for name in (*FIELDS, "outcome")}


async def test_final_failure_is_an_error_with_traceback_and_a_retry_a_warning(
    make_queue: Callable[..., Queue], mode: str, logs: Records
) -> None:
    queue = make_queue(name="flog", mode=mode)
    tries: list[int] = []

    @queue.task(name="flog.broken", retries=1, retry_policy=FAST_RETRY, dead_letter=False)
    async def broken(n: int) -> None:
        raise ValueError(f"no {n}")

    @queue.task(name="flog.flaky", retries=2, retry_policy=FAST_RETRY)
    async def flaky() -> str:
        tries.append(1)
        if len(tries) == 1:
            raise KeyError("once")
        return "ok"

    async with running(make_worker(queue, name="w-flog")):
        bad = await broken.enqueue(3)
        await settle(bad)
        good = await flaky.enqueue()
        assert await good.result(timeout=30) == "ok"
    await queue.close()

    retry, final = logs.outcomes(bad.id)
    assert retry.levelno == logging.WARNING
    assert retry.exc_info is None
    assert fields(retry) == {
        "task_id": bad.id,
        "task": "flog.broken",
        "queue": "flog",
        "worker_id": "w-flog",
        "attempt": 1,
        "error_type": "ValueError",
        "error": "no 3",
        "outcome": "retried",
    }
    assert vars(retry)["delay"] >= 0
    assert "attempt 1 failed, retry in" in retry.getMessage()
    assert final.levelno == logging.ERROR
    assert fields(final) == {**fields(retry), "attempt": 2, "outcome": "failed"}
    assert "workflow_id" not in vars(final)
    assert "failed for good on attempt 2" in final.getMessage()
    assert final.exc_info is not None
    assert final.exc_info[0] is ValueError
    trace = logging.Formatter().formatException(final.exc_info)
    assert "in broken" in trace
    assert "ValueError: no 3" in trace
    # A task that fails once, then succeeds: one WARNING, no ERROR.
    (only,) = logs.outcomes(good.id)
    assert only.levelno == logging.WARNING
    assert (vars(only)["error_type"], vars(only)["outcome"]) == ("KeyError", "retried")


async def test_dead_lettered_timed_out_and_unstorable_results_are_errors(
    make_queue: Callable[..., Queue], logs: Records
) -> None:
    queue = make_queue(name="flog2")
    release = threading.Event()

    @queue.task(name="flog.dead", retries=0, dead_letter=True)
    async def dead() -> None:
        raise RuntimeError("to the dead letters")

    @queue.task(name="flog.slow", retries=0, timeout=0.2, dead_letter=False)
    async def slow() -> None:
        await asyncio.Event().wait()

    @queue.task(name="flog.hung", executor="thread", retries=0, timeout=0.2, dead_letter=False)
    def hung() -> None:
        release.wait(30)

    @queue.task(name="flog.retry", retries=1, retry_policy=FAST_RETRY, dead_letter=False)
    async def retry_always() -> None:
        try:
            raise OSError("disk")
        except OSError as exc:
            raise Retry(delay=0.01) from exc

    @queue.task(name="flog.unstorable", retries=0, dead_letter=False)
    async def unstorable() -> object:
        return object()

    try:
        async with running(make_worker(queue)):
            handles = [
                await dead.enqueue(),
                await slow.enqueue(),
                await hung.enqueue(),
                await retry_always.enqueue(),
                await unstorable.enqueue(),
            ]
            for handle in handles:
                await settle(handle)
    finally:
        release.set()
    await queue.close()

    expected = {
        handles[0].id: ("dead_lettered", "RuntimeError", "dead-lettered on attempt 1"),
        handles[1].id: ("failed", "blitzq.exceptions.TaskTimeout", "failed for good"),
        handles[2].id: ("failed", "blitzq.exceptions.TaskTimeout", "failed for good"),
        handles[3].id: ("failed", "OSError", "failed for good on attempt 2"),
        handles[4].id: ("failed", "blitzq.exceptions.SerializationError", "failed for good"),
    }
    for task_id, (outcome, error_type, text) in expected.items():
        final = logs.outcomes(task_id)[-1]
        assert final.levelno == logging.ERROR, final.getMessage()
        assert (vars(final)["outcome"], vars(final)["error_type"]) == (outcome, error_type)
        assert text in final.getMessage()
        assert final.exc_info is not None
    # A Retry past the last attempt is logged as its cause, with the cause's traceback.
    retried = logs.outcomes(handles[3].id)
    assert [r.levelno for r in retried] == [logging.WARNING, logging.ERROR]
    assert retried[-1].exc_info is not None
    assert retried[-1].exc_info[0] is OSError
    assert vars(retried[-1])["error"] == "disk"


async def test_a_failed_workflow_step_carries_its_workflow_id(
    make_queue: Callable[..., Queue], logs: Records
) -> None:
    queue = make_queue(name="flogwf")

    @queue.task(name="flog.add")
    async def add(a: int, b: int) -> int:
        return a + b

    @queue.task(name="flog.explode")
    async def explode(x: int) -> int:
        raise ZeroDivisionError(f"step saw {x}")

    async with running(make_worker(queue)):
        workflow = await queue.apply(add.s(1, 2) | explode.s())
        (final,) = await eventually(
            lambda: asyncio.sleep(0, result=[r for r in logs.outcomes() if r.levelno >= 40]),
            lambda found: len(found) == 1,
            30.0,
        )
    await queue.close()
    assert vars(final)["workflow_id"] == workflow.id
    assert (vars(final)["task"], vars(final)["error"]) == ("flog.explode", "step saw 3")


async def test_levels_are_settable(make_queue: Callable[..., Queue], logs: Records) -> None:
    queue = make_queue(name="floglv")

    @queue.task(name="flog.lv", retries=1, retry_policy=FAST_RETRY)
    async def always() -> None:
        raise ValueError("x")

    worker = make_worker(queue, failure_log_level="critical", retry_log_level=logging.INFO)
    assert (worker.failure_log_level, worker.retry_log_level) == (logging.CRITICAL, logging.INFO)
    async with running(worker):
        handle = await always.enqueue()
        await settle(handle)
    await queue.close()
    assert [r.levelno for r in logs.outcomes(handle.id)] == [logging.INFO, logging.CRITICAL]


@pytest.mark.parametrize("value", ["loud", "", True, 0, -5, 2.5, None], ids=repr)
@pytest.mark.parametrize("option", ["failure_log_level", "retry_log_level"])
def test_a_bad_level_is_a_configuration_error(option: str, value: Any) -> None:
    queue = Queue("q", redis_url="redis://127.0.0.1:1/0")
    with pytest.raises(ConfigurationError, match=option):
        Worker(queue, **{option: value})


def test_the_cli_refuses_a_bad_level_naming_the_option() -> None:
    for option in ("--failure-log-level", "--retry-log-level"):
        result = CliRunner().invoke(cli, ["worker", "x:queue", option, "loud"])
        assert result.exit_code == 2
        assert option in result.output
        assert "Traceback" not in result.output


async def test_messages_dead_lettered_without_running_are_logged_at_the_failure_level(
    make_queue: Callable[..., Queue], logs: Records
) -> None:
    queue = make_queue(name="flogrej", mode="reliable", visibility_timeout=0.5, max_deliveries=1)

    @queue.task(name="flog.fine")
    async def fine() -> None:
        return None

    poison = await fine.enqueue()
    # A worker takes the message and dies: its next delivery is past max_deliveries.
    ghost = ReliableRedisBroker(queue.url, queue.namespace)
    try:
        await ghost.prepare_consumer(levels("flogrej"), "crashed-worker")
        assert len(await ghost.fetch_first(levels("flogrej"), 10, 0)) == 1
    finally:
        await ghost.close()
    unknown = await queue.send("flog.nobody")

    def found() -> list[logging.LogRecord]:
        return [r for r in logs.records if r.levelno == logging.ERROR]

    async with running(make_worker(queue, unknown_task_grace=0)):
        await eventually(lambda: asyncio.sleep(0, result=found()), lambda f: len(f) == 2, 30.0)
    await queue.close()
    by_outcome = {vars(r)["outcome"]: r for r in found()}
    rejected = by_outcome["rejected"]
    assert rejected.name == "blitzq.worker"
    assert (vars(rejected)["task_id"], vars(rejected)["task"]) == (unknown.id, "flog.nobody")
    assert (vars(rejected)["queue"], vars(rejected)["reason"]) == ("flogrej", "unknown task")
    dead = by_outcome["dead_lettered"]
    assert dead.name == "blitzq.worker"
    assert (vars(dead)["queue"], vars(dead)["count"]) == ("flogrej", 1)
    assert vars(dead)["reason"] == "max deliveries exceeded"
    assert (await poison.status()).state.value == "dead_lettered"  # type: ignore[union-attr]


LOG_APP = """
import blitzq

queue = blitzq.Queue(name="flogcli")


@queue.task(name="flogcli.broken", retries=1, retry_policy=blitzq.RetryPolicy(base=0.05))
async def broken():
    raise ValueError("cli says no")
"""


def test_the_cli_worker_logs_json_at_the_levels_given(
    tmp_path: Path, server_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    """``blitzq worker --log-format json --failure-log-level critical --retry-log-level info``
    as a user runs it: the retry is an INFO line, the final failure a CRITICAL line with the
    fields as keys and the traceback in ``exc_info``."""
    (tmp_path / "flogcli_app.py").write_text(LOG_APP)
    producer = make_queue(name="flogcli")
    handle = producer.send_sync("flogcli.broken")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "blitzq",
            "--redis-url",
            server_url,
            "--namespace",
            namespace,
            "worker",
            "flogcli_app:queue",
            "--burst",
            "--log-format",
            "json",
            "--failure-log-level",
            "critical",
            "--retry-log-level",
            "info",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    mine = [d for d in lines if d.get("logger") == OUTCOME_LOGGER]
    retry, final = mine
    assert (retry["level"], retry["outcome"], retry["attempt"]) == ("INFO", "retried", 1)
    assert "exc_info" not in retry
    assert (final["level"], final["outcome"], final["attempt"]) == ("CRITICAL", "dead_lettered", 2)
    assert final["task_id"] == handle.id
    assert (final["task"], final["queue"]) == ("flogcli.broken", "flogcli")
    assert (final["error_type"], final["error"]) == ("ValueError", "cli says no")
    assert isinstance(final["worker_id"], str)
    assert final["worker_id"]
    assert "Traceback" in final["exc_info"]
    assert "ValueError: cli says no" in final["exc_info"]
    producer.close_sync()


def test_the_text_format_shows_the_fields_and_the_traceback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from blitzq.logconfig import TextFormatter

    try:
        raise ValueError("text")
    except ValueError:
        record = logging.getLogger(OUTCOME_LOGGER).makeRecord(
            OUTCOME_LOGGER,
            logging.ERROR,
            __file__,
            1,
            "task %s failed",
            ("t",),
            sys.exc_info(),
            extra={"task_id": "abc", "attempt": 2, "error_type": "ValueError"},
        )
    line = TextFormatter().format(record)
    assert "ERROR   blitzq.worker.outcomes: task t failed" in line
    assert "task_id='abc' attempt=2 error_type='ValueError'" in line
    assert "Traceback" in line
    assert "ValueError: text" in line


def test_a_supervisor_passes_the_levels_to_its_workers() -> None:
    from blitzq.cli._worker_options import ops_argv

    given = {
        "failure_log_level": "critical",
        "retry_log_level": "info",
        "lifecycle_log_level": "info",
        "log_queue_size": 500,
        "log_drain_timeout": 1.5,
        "log_config": "logging.yaml",
        "logger_level": ("aio_pika=WARNING", "app=DEBUG"),
    }
    assert ops_argv(None, None, "0.0.0.0", True, given) == [
        "--failure-log-level",
        "critical",
        "--retry-log-level",
        "info",
        "--log-lifecycle-level",
        "info",
        "--log-queue-size",
        "500",
        "--log-drain-timeout",
        "1.5",
        "--log-config",
        "logging.yaml",
        "--logger-level",
        "aio_pika=WARNING",
        "--logger-level",
        "app=DEBUG",
    ]
    assert ops_argv(9100, None, "::", False) == [
        "--no-configure-logging",
        "--failure-log-level",
        "error",
        "--retry-log-level",
        "warning",
        "--log-lifecycle-level",
        "debug",
        "--log-queue-size",
        "10000",
        "--log-drain-timeout",
        "5.0",
        "--metrics-port",
        "9100",
        "--ops-host",
        "::",
    ]
