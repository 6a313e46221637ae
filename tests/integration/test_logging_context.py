"""Log records of running tasks carry the task's fields (a real worker on a real Redis), the
CLI's JSON lines show them (in process, and from ``blitzq worker --log-format json`` run as a
subprocess), its handler is a QueueHandler that a blocked stderr cannot stall,
and ``--no-configure-logging`` installs nothing."""

from __future__ import annotations

import io
import json
import logging
import logging.handlers
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from blitzq import Queue
from blitzq.cli import cli
from blitzq.logconfig import configure_logging
from blitzq.logcontext import TASK_FIELDS, NonBlockingHandler, TaskContextFilter

from ..polling import wait_until
from .proc_tasks import make_worker, running

pytestmark = pytest.mark.timeout(60)

app_log = logging.getLogger("tests.app")
ROOT = Path(__file__).resolve().parents[2]


class Capture(logging.Handler):
    """Keeps the records it handles (with the task filter, as an application would add it)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.addFilter(TaskContextFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def capture() -> Iterator[Capture]:
    handler = Capture()
    app_log.addHandler(handler)
    app_log.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        app_log.removeHandler(handler)


@pytest.fixture
def cli_handler() -> Iterator[None]:
    """Remove (and stop) whatever handler configure_logging installs in the test."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
            handler.close()
        root.setLevel(level)


async def test_records_inside_tasks_carry_the_fields_and_others_do_not(
    make_queue: Callable[..., Queue], capture: Capture
) -> None:
    queue = make_queue(name="logs")

    @queue.task(name="logs.async")
    async def in_async(n: int) -> None:
        app_log.info("async task %d", n)

    @queue.task(name="logs.thread", executor="thread")
    def in_thread(n: int) -> None:
        app_log.warning("thread task %d", n)

    worker = make_worker(queue, name="w-logs")
    async with running(worker):
        a = await in_async.enqueue(1)
        t = await in_thread.enqueue(2)
        await a.result(timeout=15)
        await t.result(timeout=15)
        app_log.info("outside any task")
    by_message = {r.getMessage(): r for r in capture.records}
    inside = by_message["async task 1"]
    assert (inside.task_id, inside.task, inside.queue, inside.attempt, inside.worker_id) == (  # type: ignore[attr-defined]
        a.id, "logs.async", "logs", 1, "w-logs",
    )  # fmt: skip
    threaded = by_message["thread task 2"]
    assert threaded.task_id == t.id  # type: ignore[attr-defined]
    assert threaded.task == "logs.thread"  # type: ignore[attr-defined]
    assert threaded.worker_id == "w-logs"  # type: ignore[attr-defined]
    outside = by_message["outside any task"]
    assert not any(hasattr(outside, field) for field in TASK_FIELDS)
    await queue.close()


async def test_json_lines_show_the_task_fields(
    make_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch, cli_handler: None
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("info", "json")
    handlers = [h for h in logging.getLogger().handlers if isinstance(h, NonBlockingHandler)]
    assert len(handlers) == 1
    assert isinstance(handlers[0], logging.handlers.QueueHandler)
    queue = make_queue(name="jsonlogs")

    @queue.task(name="logs.json")
    async def job() -> None:
        try:
            raise KeyError("k")
        except KeyError:
            app_log.exception("inside %s", "json")

    async with running(make_worker(queue, name="w-json")):
        handle = await job.enqueue()
        await handle.result(timeout=15)
    app_log.warning("outside json")

    def lines() -> list[dict[str, object]]:
        return [json.loads(line) for line in stream.getvalue().splitlines() if line]

    wait_until(lambda: any(d["message"] == "outside json" for d in lines()), 10, "the log lines")
    docs = {d["message"]: d for d in lines()}
    inside = docs["inside json"]
    assert inside["task_id"] == handle.id
    assert (inside["task"], inside["queue"], inside["attempt"]) == ("logs.json", "jsonlogs", 1)
    assert inside["worker_id"] == "w-json"
    assert "KeyError" in str(inside["exc_info"])
    assert not any(field in docs["outside json"] for field in TASK_FIELDS)
    await queue.close()


class BlockedStream(io.StringIO):
    """A stderr whose writes block until :attr:`release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, s: str) -> int:
        self.entered.set()
        self.release.wait(30)
        return super().write(s)


def test_a_blocked_stderr_does_not_block_the_caller(
    monkeypatch: pytest.MonkeyPatch, cli_handler: None
) -> None:
    stream = BlockedStream()
    monkeypatch.setattr("sys.stderr", stream)
    configure_logging("info", "text")
    app_log.warning("first")  # the listener thread blocks writing this one
    wait_until(stream.entered.is_set, 10, "the listener to start writing")
    for n in range(100):  # the caller goes on while stderr is blocked
        app_log.warning("more %d", n)
    assert not stream.release.is_set()
    stream.release.set()
    wait_until(lambda: "more 99" in stream.getvalue(), 10, "the queued lines to be written")


def test_no_configure_logging_installs_no_handler(cli_handler: None) -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    runner = CliRunner()
    # A missing app exits 78 (a configuration error) after the logging setup; the handlers
    # tell what it installed.
    result = runner.invoke(cli, ["worker", "no_such_module_xyz:queue", "--no-configure-logging"])
    assert result.exit_code == 78
    assert root.handlers == before
    result = runner.invoke(cli, ["worker", "no_such_module_xyz:queue"])
    assert result.exit_code == 78
    added = [h for h in root.handlers if h not in before]
    assert len(added) == 1
    assert isinstance(added[0], NonBlockingHandler)


LOG_APP = """
import logging
import threading

import blitzq

queue = blitzq.Queue(name="jsoncli")
log = logging.getLogger("jsoncli.app")


@queue.task(name="jsoncli.charge")
async def charge(amount):
    log.info("charged %s", amount, extra={"amount": amount})
    return amount


@queue.task(name="jsoncli.sync")
def sync_charge():
    log.warning("from a thread %s", threading.current_thread().name)
"""


def test_the_cli_worker_writes_json_lines_with_the_task_fields(
    tmp_path: Path, server_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    """``blitzq worker --log-format json`` as a user runs it (a subprocess): a line the task
    logs (async, and in a thread task) is one JSON object with ``task_id``, ``task``,
    ``queue``, ``attempt`` and ``worker_id`` as keys, beside its own ``extra=`` fields; the
    worker's own lines outside a task carry none of them."""
    (tmp_path / "jsoncli_app.py").write_text(LOG_APP)
    producer = make_queue(name="jsoncli")
    first = producer.send_sync("jsoncli.charge", [7])
    second = producer.send_sync("jsoncli.sync")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "blitzq", "--redis-url", server_url, "--namespace", namespace,
         "worker", "jsoncli_app:queue", "--burst", "--log-format", "json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    by_message = {d["message"]: d for d in lines}
    started = next(d for d in lines if str(d["message"]).startswith("worker "))
    charged = by_message["charged 7"]
    assert charged["task_id"] == first.id
    assert (charged["task"], charged["queue"], charged["attempt"]) == (
        "jsoncli.charge",
        "jsoncli",
        1,
    )
    assert charged["amount"] == 7
    assert charged["logger"] == "jsoncli.app"
    assert charged["level"] == "INFO"
    worker_id = charged["worker_id"]
    assert isinstance(worker_id, str)
    assert worker_id in started["message"]
    threaded = next(d for d in lines if str(d["message"]).startswith("from a thread"))
    assert threaded["task_id"] == second.id
    assert (threaded["task"], threaded["attempt"], threaded["worker_id"]) == (
        "jsoncli.sync", 1, worker_id
    )  # fmt: skip
    assert not any(field in started for field in TASK_FIELDS)
    producer.close_sync()
