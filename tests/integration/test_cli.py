"""The ``blitzq`` command line against a real Redis.

Inspection commands run in-process through click's CliRunner, after a Worker (in a thread) has
run the tasks; the worker command runs as a real subprocess that is stopped with SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from blitzq import ConfigurationError, Queue, SerializationError, TaskRecord, Worker
from blitzq.cli import cli
from blitzq.cli._common import mask_url
from blitzq.logconfig import JsonFormatter, configure_logging
from tests.conftest import free_port
from tests.polling import wait_until

# The CLI reads these; the tests pass everything explicitly.
_CLEAN_ENV: dict[str, str | None] = {
    "BLITZQ_REDIS_URL": None,
    "BLITZQ_NAMESPACE": None,
    "BLITZQ_MODE": None,
}


# ------------------------------------------------------------------ helpers
@contextlib.contextmanager
def running_worker(queue: Queue, **kwargs: Any) -> Iterator[Worker]:
    """Run a Worker for ``queue`` on its own event loop in a thread; stop it on exit."""
    kwargs.setdefault("concurrency", 4)
    kwargs.setdefault("block_timeout", 0.1)
    kwargs.setdefault("shutdown_timeout", 2.0)
    worker = Worker(queue, **kwargs)
    loop = asyncio.new_event_loop()
    errors: list[BaseException] = []

    async def main() -> None:
        try:
            await worker.run()
        finally:
            await queue.close()

    def target() -> None:
        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=target, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        with contextlib.suppress(RuntimeError):  # loop already closed after a crash
            loop.call_soon_threadsafe(worker.stop)
        thread.join(10)
        assert not thread.is_alive(), "worker did not stop"
        if errors:
            raise errors[0]


def final_record(queue: Queue, task_id: str) -> TaskRecord:
    """Wait until the task's record is in a final state and return it."""

    def check() -> TaskRecord | None:
        record = queue.inspect_sync(task_id)
        return record if record is not None and record.state.is_final else None

    return wait_until(check, 30.0, f"a final record for {task_id}", interval=0.02)


@pytest.fixture
def invoke(redis_url: str, namespace: str) -> Callable[..., Result]:
    """Run ``blitzq --redis-url <test server> --namespace <test ns> ARGS`` in-process."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None) -> Result:
        return runner.invoke(
            cli,
            ["--redis-url", redis_url, "--namespace", namespace, *args],
            input=input,
            env=_CLEAN_ENV,
            catch_exceptions=False,
        )

    return run


@pytest.fixture
def app_queue(make_queue: Callable[..., Queue]) -> Iterator[Queue]:
    """A Queue with three tasks: ``add`` succeeds, ``flaky`` fails once (no dead letter),
    ``boom`` fails and is dead-lettered."""
    queue = make_queue(visibility_timeout=2)

    @queue.task(name="add")
    async def add(a: int, b: int) -> int:
        return a + b

    @queue.task(name="flaky", retries=0, dead_letter=False)
    async def flaky() -> None:
        raise ValueError("flaky says no")

    @queue.task(name="boom", retries=0)
    def boom(n: int) -> None:
        raise RuntimeError(f"boom {n}")

    yield queue
    queue.close_sync()


def json_out(result: Result) -> Any:
    """The single JSON document a ``--json`` command printed on stdout."""
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# -------------------------------------------------------------- task inspect
def test_task_inspect_shows_result_error_times_and_worker(
    app_queue: Queue, invoke: Callable[..., Result]
) -> None:
    ok = app_queue.send_sync("add", [2, 3])
    bad = app_queue.send_sync("flaky")
    with running_worker(app_queue) as worker:
        final_record(app_queue, ok.id)
        final_record(app_queue, bad.id)

    human = invoke("task", "inspect", ok.id)
    assert human.exit_code == 0, human.output
    assert "succeeded" in human.stdout
    assert ok.id in human.stdout
    assert worker.id in human.stdout

    doc = json_out(invoke("task", "inspect", ok.id, "--json"))
    assert doc["state"] == "succeeded"
    assert doc["result"] == 5
    assert doc["attempts"] == 1
    assert doc["worker"] == worker.id
    started = datetime.fromisoformat(doc["started_at"])
    finished = datetime.fromisoformat(doc["finished_at"])
    assert started <= finished
    assert abs(finished.timestamp() - time.time()) < 60

    failed = json_out(invoke("--json", "task", "inspect", bad.id))
    assert failed["state"] == "failed"
    assert failed["error_type"].endswith("ValueError")
    assert failed["error"] == "flaky says no"
    human_failed = invoke("task", "inspect", bad.id)
    assert "failed" in human_failed.stdout
    assert "flaky says no" in human_failed.stdout


def test_task_inspect_unknown_id_exits_1_with_message(invoke: Callable[..., Result]) -> None:
    result = invoke("task", "inspect", "no-such-task")
    assert result.exit_code == 1
    assert "no record for task no-such-task" in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ("task", "inspect", "no-such-task"),
        ("dead-letter", "show", "no-such-task"),
        ("check", "no_such_module_xyz:app"),
    ],
)
def test_json_errors_are_one_json_document_on_stdout(
    invoke: Callable[..., Result], args: tuple[str, ...]
) -> None:
    """Under --json a failing command still prints one JSON document on stdout (a script
    parses stdout), with the error, and keeps the human line on stderr and its exit code."""
    result = invoke("--json", *args)
    assert result.exit_code in (1, 2, 78)  # check: a configuration error is 78
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == result.exit_code
    assert doc["error"]
    assert doc["error"].splitlines()[0] in result.stderr
    assert "Traceback" not in result.output


# -------------------------------------------------------------- dead letters
def test_dead_letter_list_replay_and_purge(app_queue: Queue, invoke: Callable[..., Result]) -> None:
    first = app_queue.send_sync("boom", [1])
    second = app_queue.send_sync("boom", [2])
    with running_worker(app_queue):
        for handle in (first, second):
            assert final_record(app_queue, handle.id).state.value == "dead_lettered"

    listing = json_out(invoke("dead-letter", "list", "--json"))
    assert listing["total"] == 2
    by_id = {d["id"]: d for d in listing["dead_letters"]}
    assert set(by_id) == {first.id, second.id}
    assert by_id[first.id]["task"] == "boom"
    assert by_id[first.id]["args"] == [1]
    assert by_id[first.id]["mode"] == "reliable"
    assert "boom 1" in by_id[first.id]["error"]
    datetime.fromisoformat(by_id[first.id]["failed_at"])
    limited = json_out(invoke("dead-letter", "list", "--limit", "1", "--json"))
    assert len(limited["dead_letters"]) == 1
    assert limited["total"] == 2
    human = invoke("dead-letter", "list")
    assert first.id in human.stdout
    assert second.id in human.stdout

    # Replay puts the task back on its queue with fresh attempts, once.
    replayed = json_out(invoke("dead-letter", "replay", first.id, "--json"))
    assert replayed == {"replayed": True, "id": first.id, "queue": "default", "mode": "reliable"}
    stats = json_out(invoke("queue", "stats", "--json"))
    assert stats["queues"]["default"]["waiting"] == 1
    assert stats["dead_letters"] == 1
    again = invoke("dead-letter", "replay", first.id)
    assert again.exit_code == 1
    assert f"no dead letter with id {first.id}" in again.stderr

    # Purge asks first; answering no keeps everything.
    declined = invoke("dead-letter", "purge", input="n\n")
    assert declined.exit_code == 1
    assert "not confirmed" in declined.stderr
    # Under --json a question left unanswered (no input) still gives one JSON document.
    unanswered = invoke("dead-letter", "purge", "--json", input="")
    assert unanswered.exit_code == 1
    assert json.loads(unanswered.stdout) == {
        "error": "not confirmed: nothing was changed (--yes skips the question)",
        "exit_code": 1,
    }
    assert json_out(invoke("dead-letter", "list", "--json"))["total"] == 1
    assert json_out(invoke("dead-letter", "purge", "--yes", "--json")) == {"purged": 1}
    assert json_out(invoke("dead-letter", "list", "--json"))["total"] == 0
    assert "no dead letters" in invoke("dead-letter", "list").stdout


def test_a_wrong_type_dead_letter_key_does_not_break_the_listing(
    app_queue: Queue, invoke: Callable[..., Result], redis_url: str, namespace: str
) -> None:
    """Issue input: ``SET {ns}:d:corrupt4 x; ZADD {ns}:dlq <now> corrupt4`` made ``dead-letter
    list`` and ``queue.dead_letters()`` fail with WRONGTYPE and ``replay`` show it raw."""
    real = app_queue.send_sync("boom", [1])
    with running_worker(app_queue):
        assert final_record(app_queue, real.id).state.value == "dead_lettered"
    client = redis.Redis.from_url(redis_url)
    try:
        client.set("{" + namespace + "}:d:corrupt4", b"x")
        client.zadd("{" + namespace + "}:dlq", {"corrupt4": time.time()})
    finally:
        client.close()

    letters = {d.id: d for d in app_queue.dead_letters_sync()}
    assert set(letters) == {real.id, "corrupt4"}
    assert letters["corrupt4"].reason == "unreadable entry"
    assert letters[real.id].task == "boom"

    listing = invoke("dead-letter", "list", "--json")
    assert listing.exit_code == 0, listing.output
    by_id = {d["id"]: d for d in json_out(listing)["dead_letters"]}
    assert by_id["corrupt4"]["reason"] == "unreadable entry"
    assert by_id[real.id]["task"] == "boom"
    human = invoke("dead-letter", "list")
    assert human.exit_code == 0, human.output
    assert "corrupt4" in human.stdout

    replay = invoke("dead-letter", "replay", "corrupt4")
    assert replay.exit_code == 1
    assert "dead letter corrupt4 cannot be replayed" in replay.stderr
    assert "unreadable" in replay.stderr
    assert "WRONGTYPE" not in replay.output
    with pytest.raises(SerializationError, match="unreadable"):
        app_queue.retry_sync("corrupt4")
    # The good one still replays, and a purge clears the bad one.
    assert json_out(invoke("dead-letter", "replay", real.id, "--json"))["replayed"] is True
    assert json_out(invoke("dead-letter", "purge", "--yes", "--json")) == {"purged": 1}


# ---------------------------------------------------------------- queue stats
def test_queue_stats_counts_waiting_scheduled_and_live_workers(
    app_queue: Queue, invoke: Callable[..., Result]
) -> None:
    for n in range(3):
        app_queue.send_sync("add", [n, n])
    app_queue.send_sync("add", [1, 1], delay=300)
    app_queue.send_sync("add", [1, 1], queue="other")

    doc = json_out(invoke("queue", "stats", "--json"))
    assert doc["queues"]["default"] == {"waiting": 3, "in_flight": 0}
    assert doc["queues"]["other"]["waiting"] == 1
    assert doc["scheduled"] == 1
    assert doc["dead_letters"] == 0
    assert doc["workers"] == []
    only = json_out(invoke("queue", "stats", "-Q", "other", "--json"))
    assert set(only["queues"]) == {"other"}

    with running_worker(app_queue, queues=["default"]) as worker:

        def registered() -> Any:
            doc = json_out(invoke("queue", "stats", "--json"))
            return doc if doc["workers"] and doc["queues"]["default"]["waiting"] == 0 else None

        doc = wait_until(
            registered, 30.0, "the worker to register and drain 'default'", interval=0.02
        )
        assert [w["id"] for w in doc["workers"]] == [worker.id]
        assert doc["workers"][0]["queues"] == ["default"]
        human = invoke("queue", "stats")
        assert human.exit_code == 0, human.output
        assert "live workers: 1" in human.stdout
        assert "default" in human.stdout
    assert doc["queues"]["other"]["waiting"] == 1  # not subscribed: left alone


def test_queue_stats_text_and_json_show_the_same_worker_counts(
    app_queue: Queue, invoke: Callable[..., Result]
) -> None:
    # The issue: the table said "done 0" while --json a moment later said 206 processed.
    for n in range(5):
        app_queue.send_sync("add", [n, n])
    app_queue.send_sync("boom", [1])
    with running_worker(app_queue) as worker:

        def counted() -> Any:
            docs = json_out(invoke("queue", "stats", "--json"))["workers"]
            done = docs and docs[0]["processed"] == 5 and docs[0]["failed"] == 1
            return docs[0] if done else None

        doc = wait_until(counted, 30.0, "the worker's registration to count 5 + 1 runs")
        assert doc["id"] == worker.id
        human = invoke("queue", "stats")
        assert human.exit_code == 0, human.output
    lines = human.stdout.splitlines()
    header = next(line.split() for line in lines if line.split()[:1] == ["worker"])
    row = next(line.split() for line in lines if line.split()[:1] == [worker.id])
    assert header[:6] == ["worker", "queues", "slots", "running", "processed", "failed"]
    counts = dict(zip(header[2:6], row[2:6], strict=True))
    assert counts == {"slots": "4", "running": "0", "processed": "5", "failed": "1"}
    zone = datetime.now().astimezone().strftime("%Z")
    assert row[-1] == row[-4] == zone  # started and "as of" name their time zone
    assert "the same numbers as --json" in human.stdout


def test_queue_stats_follows_a_busy_worker_between_maintenance_rounds(
    make_queue: Callable[..., Queue],
    invoke: Callable[..., Result],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The maintenance round (which registers the worker) is an hour apart here: the counts
    # can only arrive through the refresh that follows them.
    from blitzq.worker import maintenance, worker

    class HourlyMaintenance(maintenance.Maintenance):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            self.interval = 3600.0

    monkeypatch.setattr(worker, "Maintenance", HourlyMaintenance)
    queue = make_queue()

    @queue.task(name="add")
    async def add(a: int, b: int) -> int:
        return a + b

    with running_worker(queue) as running:

        def registered() -> Any:
            docs = json_out(invoke("queue", "stats", "--json"))["workers"]
            return docs[0] if docs else None

        assert wait_until(registered, 30.0, "the worker's registration")["processed"] == 0
        for n in range(4):
            queue.send_sync("add", [n, n])

        def counted() -> Any:
            doc = registered()
            return doc if doc is not None and doc["processed"] == 4 else None

        doc = wait_until(counted, 30.0, "the registration to count the 4 runs")
        assert doc["id"] == running.id
        assert doc["running"] == 0


def test_global_options_before_or_after_the_command_and_from_env(
    redis_url: str, namespace: str
) -> None:
    runner = CliRunner()
    env = {**_CLEAN_ENV, "BLITZQ_REDIS_URL": redis_url, "BLITZQ_NAMESPACE": namespace}
    from_env = runner.invoke(cli, ["queue", "stats", "--json"], env=env)
    assert json.loads(from_env.stdout)["namespace"] == namespace
    # A flag typed on the command line wins over the environment, wherever it is typed.
    for args in (
        ["--namespace", namespace + "-x", "--mode", "fast", "queue", "stats", "--json"],
        ["queue", "stats", "--namespace", namespace + "-x", "--json", "--mode", "fast"],
        ["--json", "--namespace", namespace + "-x", "queue", "stats", "--mode", "fast"],
    ):
        result = runner.invoke(cli, args, env=env)
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert (doc["namespace"], doc["mode"]) == (namespace + "-x", "fast"), args


# ------------------------------------------------------------------ errors
def test_unreachable_broker_is_one_red_line_with_masked_password() -> None:
    url = f"redis://:s3cret@127.0.0.1:{free_port()}/0"
    for args in (["queue", "stats"], ["task", "inspect", "x"], ["dead-letter", "list"]):
        result = CliRunner().invoke(cli, ["--redis-url", url, *args], env=_CLEAN_ENV)
        assert result.exit_code == 1, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("Error: broker error (redis://:***@127.0.0.1")
        assert "s3cret" not in result.output
        assert "Traceback" not in result.output


def test_invalid_option_values_exit_2_without_traceback(redis_url: str) -> None:
    runner = CliRunner()
    cases = [
        (["--redis-url", redis_url, "--mode", "turbo", "queue", "stats"], "turbo"),
        (["--redis-url", redis_url, "--namespace", "a b", "queue", "stats"], "namespace"),
        (["--redis-url", "http://example.com", "queue", "stats"], "unsupported broker URL"),
        (["--redis-url", redis_url, "dead-letter", "list", "--limit", "0"], "--limit"),
    ]
    for args, needle in cases:
        result = runner.invoke(cli, args, env=_CLEAN_ENV)
        assert result.exit_code == 2, (args, result.output)
        assert needle in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["queue", "stats"],
        ["dead-letter", "list"],
        ["worker", "tests.nowhere:queue"],
        ["scheduler", "list", "tests.nowhere:queue"],
    ],
)
def test_memory_url_is_refused_with_exit_2(args: list[str]) -> None:
    """A memory:// server is private to the CLI process: refused, typed (a usage error, 2)
    or from the env (a configuration error, 78)."""
    runner = CliRunner()
    for result, code in (
        (runner.invoke(cli, ["--redis-url", "memory://x", *args], env=_CLEAN_ENV), 2),
        (runner.invoke(cli, args, env={**_CLEAN_ENV, "BLITZQ_REDIS_URL": "memory://x"}), 78),
    ):
        assert result.exit_code == code, (args, result.output)
        assert "private to the one process" in result.stderr, result.stderr
        assert "redis://" in result.stderr
        assert "embedded server" in result.stderr
        assert "Traceback" not in result.output


def test_redis_url_help_lists_every_scheme() -> None:
    from blitzq.broker.factory import SCHEMES

    help_text = " ".join(CliRunner().invoke(cli, ["--help"]).stdout.split())
    for scheme in (*SCHEMES, "valkey://", "valkeys://"):
        if scheme != "memory://":
            assert scheme in help_text, scheme


def test_mask_url_hides_passwords() -> None:
    assert mask_url("redis://user:pw@host:6379/0") == "redis://user:***@host:6379/0"
    assert mask_url("rediss://:pw@host/1") == "rediss://:***@host/1"
    assert mask_url("redis://pw@host") == "redis://***@host"
    assert mask_url("unix:///tmp/r.sock?db=1&password=pw") == "unix:///tmp/r.sock?db=1&password=***"
    assert mask_url("unix:///tmp/r.sock") == "unix:///tmp/r.sock"
    assert mask_url("redis://host:6379/0") == "redis://host:6379/0"
    assert (
        mask_url("redis+sentinel://:pw@h1,h2:26380/m?sentinel_password=s&timeout=2")
        == "redis+sentinel://:***@h1,h2:26380/m?sentinel_password=***&timeout=2"
    )


# ------------------------------------------------------------------ logging
def test_json_log_lines_carry_extra_fields_and_bad_levels_are_rejected() -> None:
    record = logging.LogRecord("blitzq.worker", logging.WARNING, __file__, 1, "hi %s", ("x",), None)
    record.task_id = "abc"
    doc = json.loads(JsonFormatter().format(record))
    assert doc["level"] == "WARNING"
    assert doc["logger"] == "blitzq.worker"
    assert doc["message"] == "hi x"
    assert doc["task_id"] == "abc"
    datetime.fromisoformat(doc["time"])
    root = logging.getLogger()
    before = list(root.handlers), root.level
    with pytest.raises(ConfigurationError):
        configure_logging("loud", "text")
    with pytest.raises(ConfigurationError):
        configure_logging("info", "xml")  # type: ignore[arg-type]
    assert (list(root.handlers), root.level) == before


# ------------------------------------------------------------ worker process
APP = """
import asyncio
import os

import redis.asyncio as aioredis

import blitzq

queue = blitzq.Queue()


async def _set(key, value):
    client = aioredis.Redis.from_url(os.environ["TEST_REDIS_URL"])
    try:
        await client.set(key, value)
    finally:
        await client.aclose()


@queue.task
async def mark(key, value):
    await _set(key, value)
    return value


@queue.task
async def slow(key):
    await _set(key + ":started", 1)
    await asyncio.sleep(0.5)
    await _set(key + ":done", 1)
    return "finished"
"""


def _blitzq_command() -> list[str]:
    script = Path(sys.executable).with_name("blitzq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "blitzq"]


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    data = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace")


def test_worker_process_runs_tasks_and_stops_gracefully_on_sigterm(
    tmp_path: Path, redis_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    (tmp_path / "cli_app.py").write_text(APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["TEST_REDIS_URL"] = redis_url
    proc = subprocess.Popen(
        [
            *_blitzq_command(),
            "worker",
            "cli_app:queue",
            "--redis-url",
            redis_url,
            "--namespace",
            namespace,
            "-c",
            "2",
            "--shutdown-timeout",
            "5",
            "--log-format",
            "json",
            "--no-supervise",  # this process is the worker: its banner, its exit code
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    client = redis.Redis.from_url(redis_url)
    producer = make_queue()
    try:
        line = _read_line(proc, timeout=20)
        assert line.startswith("blitzq worker "), line
        assert "queues=default" in line
        assert "concurrency=2" in line
        assert f"namespace={namespace}" in line

        prefix = "{" + namespace + "}:cli-test"
        handles = [producer.send_sync("cli_app.mark", [f"{prefix}:mark:{n}", n]) for n in range(5)]
        for n, handle in enumerate(handles):
            assert handle.result_sync(timeout=15) == n
        assert [client.get(f"{prefix}:mark:{n}") for n in range(5)] == [
            str(n).encode() for n in range(5)
        ]

        # SIGTERM while a task runs: the worker lets it finish, then exits 0.
        slow = producer.send_sync("cli_app.slow", [f"{prefix}:slow"])
        wait_until(
            lambda: client.exists(f"{prefix}:slow:started"), 30.0, "the slow task to start", 0.02
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert client.get(f"{prefix}:slow:done") == b"1"
        assert slow.result_sync(timeout=5) == "finished"
        assert proc.stderr is not None
        logs = [json.loads(line) for line in proc.stderr.read().decode().splitlines() if line]
        assert logs, "the worker logged nothing"
        assert {"time", "level", "logger", "message"} <= set(logs[0])
        assert any("stopped" in entry["message"] for entry in logs)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        client.close()
        producer.close_sync()


BAD_APPS = {
    "bad_missing_module": ("no_such_module_xyz:queue", "cannot import module 'no_such_module_xyz'"),
    "bad_missing_attr": ("cli_bad_app:nothing", "has no attribute 'nothing'"),
    "bad_not_a_queue": ("cli_bad_app:value", "is a int, not a blitzq.Queue"),
    "bad_spec": ("cli_bad_app", "expected MODULE:ATTR"),
    "bad_import_error": ("cli_broken_app:queue", "ZeroDivisionError"),
}


@pytest.mark.parametrize(
    "params", ["max_connection=5", "bogus_param=1", "socket_timeout=0", "max_connections=2"]
)
def test_worker_with_bad_url_option_exits_78(params: str, tmp_path: Path, redis_url: str) -> None:
    """Issue input: an unknown URL option used to print a redis-py traceback and exit 1; it
    is a configuration error (78), which the supervisor does not restart."""
    (tmp_path / "cli_url_app.py").write_text("from blitzq import Queue\nqueue = Queue()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    url = redis_url + ("&" if "?" in redis_url else "?") + params
    result = subprocess.run(
        [sys.executable, "-m", "blitzq", "worker", "cli_url_app:queue", "--redis-url", url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 78, result.stderr
    assert "restarting worker slot" not in result.stderr
    assert params.split("=")[0] in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("supervised", [True, False], ids=["supervised", "no-supervise"])
@pytest.mark.parametrize("case", sorted(BAD_APPS))
def test_worker_with_bad_module_attr_exits_78_with_readable_message(
    case: str, supervised: bool, tmp_path: Path, redis_url: str
) -> None:
    """A bad application is a configuration error: exit 78 (EX_CONFIG) from the worker and,
    by default, from its supervisor too (which does not restart it)."""
    spec, needle = BAD_APPS[case]
    (tmp_path / "cli_bad_app.py").write_text("value = 42\n")
    (tmp_path / "cli_broken_app.py").write_text("x = 1 / 0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    cmd = [sys.executable, "-m", "blitzq", "worker", spec, "--redis-url", redis_url]
    result = subprocess.run(
        cmd if supervised else [*cmd, "--no-supervise"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 78, result.stderr
    assert result.stderr.count(needle) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "restarting worker slot" not in result.stderr
    if not supervised:
        assert result.stderr.startswith("Error: ")
