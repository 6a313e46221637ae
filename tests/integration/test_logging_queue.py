"""The worker's logging: a bounded non-blocking queue that drops lesser records first, a
bounded drain at exit, a dictConfig file, per-logger levels, the task lifecycle records with
their fields, and the opt-in queue of an embedded application (docs/operations.md, "Logs")."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blitzq import ConfigurationError, Queue
from blitzq.logconfig import configure_logging
from blitzq.logcontext import NonBlockingHandler, dropped_records

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


class Held(logging.Handler):
    """Keeps what it is asked to write; blocks each write until :attr:`gate` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.written: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.entered.set()
        self.gate.wait(30)
        self.written.append(record.getMessage())


def _record(level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord("blitzq.test", level, __file__, 1, message, None, None)


def test_a_full_queue_drops_lesser_records_first_and_counts_them() -> None:
    held = Held()
    handler = NonBlockingHandler(held, queue_size=20)
    try:
        handler.emit(_record(logging.INFO, "first"))  # taken by the listener, which blocks
        assert held.entered.wait(10)
        before = dropped_records()
        for n in range(30):
            handler.emit(_record(logging.INFO, f"info {n}"))
        # 20 held at most, 2 of them (10 %) kept for WARNING and above: 18 lesser records.
        assert handler.dropped == 12
        for n in range(5):
            handler.emit(_record(logging.WARNING, f"warning {n}"))
        assert handler.dropped == 15  # the reserve took 2 warnings, then the queue was full
        assert dropped_records() - before == 15
    finally:
        held.gate.set()
        handler.close()
    assert held.written == [
        "first",
        *(f"info {n}" for n in range(18)),
        "warning 0",
        "warning 1",
    ]


def test_the_drain_at_close_is_bounded_and_what_it_leaves_is_counted() -> None:
    held = Held()
    handler = NonBlockingHandler(held, queue_size=100, drain_timeout=0.05)
    try:
        handler.emit(_record(logging.INFO, "stuck"))
        assert held.entered.wait(10)
        for n in range(7):
            handler.emit(_record(logging.ERROR, f"error {n}"))
        before = dropped_records()
        handler.close()  # returns although the target never finishes writing
        assert handler.dropped == 7
        assert dropped_records() - before == 7
    finally:
        held.gate.set()


@pytest.mark.parametrize(("size", "drain"), [(9, 1.0), (True, 1.0), (100, -1.0), (100, "x")])
def test_bad_queue_settings_are_configuration_errors(size: object, drain: object) -> None:
    with pytest.raises(ConfigurationError, match=r"log (queue size|drain timeout)"):
        NonBlockingHandler(logging.NullHandler(), queue_size=size, drain_timeout=drain)  # type: ignore[arg-type]


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level restored after the test (the ones a test
    installed closed), and blitzq.task's and test loggers' levels reset."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield root
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)
        for name in ("aio_pika", "blitzq.cfgtest", "blitzq.cfgyaml"):
            logging.getLogger(name).setLevel(logging.NOTSET)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_dictconfig_file_replaces_the_stderr_handler(
    tmp_path: Path, root_logging: logging.Logger, suffix: str
) -> None:
    out = tmp_path / "app.log"
    document = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(name)s %(message)s"}},
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": str(out), "formatter": "plain"}
        },
        "loggers": {"blitzq.cfgtest": {"handlers": ["file"], "level": "INFO"}},
    }
    config = tmp_path / f"logging{suffix}"
    if suffix == ".json":
        config.write_text(json.dumps(document))
    else:
        import yaml

        config.write_text(yaml.safe_dump(document))
    configure_logging("debug", "text", config_file=str(config), logger_levels=("aio_pika=WARNING",))
    logger = logging.getLogger("blitzq.cfgtest")
    logger.info("through the file handler")
    for handler in logger.handlers:
        handler.flush()
    assert out.read_text() == "INFO blitzq.cfgtest through the file handler\n"
    assert logging.getLogger("aio_pika").level == logging.WARNING
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


@pytest.mark.parametrize(
    ("content", "message"),
    [("[1, 2]", "must be a mapping"), ("{", "not valid JSON"), ('{"handlers": 3}', "dictConfig")],
)
def test_a_bad_dictconfig_file_names_the_file(
    tmp_path: Path, root_logging: logging.Logger, content: str, message: str
) -> None:
    config = tmp_path / "bad.json"
    config.write_text(content)
    with pytest.raises(ConfigurationError, match=message) as raised:
        configure_logging("info", "text", config_file=str(config))
    assert str(config) in str(raised.value)


@pytest.mark.parametrize("item", ["aio_pika", "=INFO", "aio_pika=LOUD"])
def test_a_bad_logger_level_is_a_configuration_error(
    item: str, root_logging: logging.Logger
) -> None:
    with pytest.raises(ConfigurationError, match=r"aio_pika|NAME=LEVEL"):
        configure_logging("info", "text", logger_levels=(item,))


APP = """
import logging

import blitzq

queue = blitzq.Queue(name="lifelog")


@queue.task(name="lifelog.hello")
async def hello(who):
    logging.getLogger("lifelog.body").info("hello %s", who)
    return who
"""


def _worker(
    tmp_path: Path, server_url: str, namespace: str, *options: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "blitzq", "--redis-url", server_url]
    command += ["--namespace", namespace, "worker", "lifelog_app:queue", "--burst", *options]
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_lifecycle_records_carry_the_task_fields(
    tmp_path: Path, server_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    (tmp_path / "lifelog_app.py").write_text(APP)
    producer = make_queue(name="lifelog")
    handle = producer.send_sync("lifelog.hello", ["ada"])
    done = _worker(
        tmp_path, server_url, namespace, "--log-format", "json", "--log-lifecycle-level", "info"
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    events = [d for d in lines if d["logger"] == "blitzq.task"]
    assert [d["event"] for d in events] == ["received", "started", "succeeded"]
    for event in events:
        assert (event["level"], event["task_id"], event["task"]) == (
            "INFO",
            handle.id,
            "lifelog.hello",
        )
        assert (event["queue"], event["attempt"]) == ("lifelog", 1)
        assert event["worker_id"]
    (body,) = [d for d in lines if d["logger"] == "lifelog.body"]
    assert (body["message"], body["task_id"], body["attempt"]) == ("hello ada", handle.id, 1)
    producer.close_sync()


def test_lifecycle_records_are_off_at_the_default_levels(
    tmp_path: Path, server_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    (tmp_path / "lifelog_app.py").write_text(APP)
    producer = make_queue(name="lifelog")
    producer.send_sync("lifelog.hello", ["bob"])
    done = _worker(tmp_path, server_url, namespace, "--log-format", "json")
    assert done.returncode == 0, done.stderr
    assert '"blitzq.task"' not in done.stderr
    assert "hello bob" in done.stderr
    producer.close_sync()


def test_the_cli_takes_a_log_config_file_and_logger_levels(
    tmp_path: Path, server_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    (tmp_path / "lifelog_app.py").write_text(APP)
    out = tmp_path / "worker.log"
    (tmp_path / "logging.json").write_text(
        json.dumps(
            {
                "version": 1,
                "handlers": {"file": {"class": "logging.FileHandler", "filename": str(out)}},
                "root": {"handlers": ["file"], "level": "INFO"},
            }
        )
    )
    producer = make_queue(name="lifelog")
    producer.send_sync("lifelog.hello", ["cy"])
    done = _worker(
        tmp_path,
        server_url,
        namespace,
        "--log-config",
        "logging.json",
        "--logger-level",
        "lifelog.body=WARNING",
    )
    assert done.returncode == 0, done.stderr
    assert "hello cy" not in out.read_text()  # lifelog.body raised to WARNING
    bad = _worker(tmp_path, server_url, namespace, "--logger-level", "lifelog.body=LOUD")
    assert bad.returncode != 0
    assert "lifelog.body" in bad.stderr
    assert "Traceback" not in bad.stderr
    producer.close_sync()


class Keep(logging.Handler):
    """Keeps the records it is asked to write, with the thread that wrote each."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, str]] = []
        self.wrote = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((record.getMessage(), threading.current_thread().name))
        self.wrote.set()


@pytest.mark.parametrize("by", ["argument", "environment"])
def test_an_embedded_app_opts_into_the_log_queue(
    root_logging: logging.Logger,
    server_url: str,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    by: str,
) -> None:
    kept = Keep()
    for handler in list(root_logging.handlers):
        root_logging.removeHandler(handler)
    root_logging.addHandler(kept)
    root_logging.setLevel(logging.INFO)
    if by == "environment":
        monkeypatch.setenv("BLITZQ_LOG_QUEUE", "1")
        queue = Queue(redis_url=server_url, namespace=namespace)
    else:
        queue = Queue(redis_url=server_url, namespace=namespace, log_queue=True)
    (queued,) = root_logging.handlers
    assert isinstance(queued, NonBlockingHandler)
    assert queued.targets == (kept,)
    logging.getLogger("app").info("off the caller's thread")
    assert kept.wrote.wait(10)
    assert kept.records == [("off the caller's thread", "blitzq-log-listener")]
    Queue(redis_url=server_url, namespace=namespace, log_queue=True)  # a second one: no change
    assert root_logging.handlers == [queued]
    for made in (queue,):
        made.close_sync()


def test_a_bad_log_queue_setting_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, server_url: str
) -> None:
    monkeypatch.setenv("BLITZQ_LOG_QUEUE", "maybe")
    with pytest.raises(ConfigurationError, match="BLITZQ_LOG_QUEUE"):
        Queue(redis_url=server_url)
