"""Fixtures of the reliability suite: worker subprocesses, observation reads, private servers.

Workers are real processes (``run_worker.py``) so they can be SIGKILLed and SIGTERMed; the
``harness`` fixture kills whatever it started that is still alive when the test ends. Each
worker's log goes to a file under the test's ``tmp_path`` and is printed when a test fails.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from blitzq import Queue, TaskRecord
from tests.conftest import free_port
from tests.polling import wait_until

from .reliability_app import build_queue, obs_key, sync_redis

RUNNER = Path(__file__).resolve().parent / "run_worker.py"


class WorkerProcess:
    """One worker subprocess started by :class:`Harness`.

    Attributes:
        proc: the Popen object.
        log: path of its combined stdout/stderr.
    """

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    @property
    def pid(self) -> int:
        """Process id."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the process has not exited."""
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send ``sig`` (e.g. ``signal.SIGKILL``) if the process still runs."""
        if self.alive():
            os.kill(self.pid, sig)

    def kill(self) -> int:
        """SIGKILL the process and reap it; return its exit code."""
        self.signal(signal.SIGKILL)
        return self.wait(10.0)

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the exit; return the exit code.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout``.
        """
        return self.proc.wait(timeout)


class Harness:
    """Starts workers on one server and namespace and reads what their tasks recorded.

    Args:
        url: Redis URL the test process observes through (and, by default, workers use).
        namespace: the test's namespace.
        tmp_path: where worker logs go.
    """

    def __init__(self, url: str | None, namespace: str, tmp_path: Path) -> None:
        self.url = url
        #: URL handed to worker subprocesses (``None``: no URL, the embedded default).
        self.worker_url = url
        self.namespace = namespace
        self.tmp_path = tmp_path
        self.workers: list[WorkerProcess] = []
        self.queues: list[Queue] = []
        self._client: redis.Redis | None = None
        self.env: dict[str, str] = {}

    @property
    def redis(self) -> redis.Redis:
        """A sync client on the test server (made on first use)."""
        if self._client is None:
            assert self.url is not None, "set harness.url first"
            self._client = sync_redis(self.url, socket_timeout=5.0)
        return self._client

    def close_client(self) -> None:
        """Drop the observation client (it reconnects on next use, e.g. after a restart)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def key(self, suffix: str) -> str:
        """Full key name ``{ns}:<suffix>``."""
        return "{" + self.namespace + "}:" + suffix

    def queue(
        self,
        mode: str = "reliable",
        vt: float = 1.5,
        max_deliveries: int = 5,
        fast_task: bool = False,
    ) -> Queue:
        """The suite's Queue on this server and namespace (closed after the test)."""
        q = build_queue(self.worker_url, self.namespace, mode, vt, max_deliveries, fast_task)
        self.queues.append(q)
        return q

    def spawn(
        self,
        mode: str = "reliable",
        concurrency: int = 4,
        vt: float = 1.5,
        shutdown_timeout: float = 5.0,
        max_deliveries: int = 5,
        wait_ready: bool = True,
        block_timeout: float | None = None,
        fast_task: bool = False,
    ) -> WorkerProcess:
        """Start a worker subprocess; by default wait until it has prepared its consumer
        (``block_timeout``: the worker's, ``None`` for run_worker.py's 0.5 s; ``fast_task``:
        its Queue also has the fast-declared ``rel.fast_work``)."""
        log = self.tmp_path / f"worker-{time.monotonic_ns()}.log"
        env = {**os.environ, **self.env}
        env.pop("BLITZQ_REDIS_URL", None)
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [
            sys.executable,
            str(RUNNER),
            self.worker_url or "-",
            self.namespace,
            mode,
            str(concurrency),
            str(vt),
            "--shutdown-timeout",
            str(shutdown_timeout),
            "--max-deliveries",
            str(max_deliveries),
        ]
        if block_timeout is not None:
            cmd += ["--block-timeout", str(block_timeout)]
        if fast_task:
            cmd.append("--fast-task")
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        worker = WorkerProcess(proc, log)
        self.workers.append(worker)
        if wait_ready:
            self.wait_ready(worker)
        return worker

    def wait_ready(self, worker: WorkerProcess, timeout: float = 60.0) -> None:
        """Wait until ``worker`` announced itself in ``{ns}:obs:ready``.

        Raises:
            AssertionError: it exited or did not announce itself in time.
        """
        ready = obs_key(self.namespace, "ready")

        def check() -> bool:
            if not worker.alive():
                raise AssertionError(
                    f"worker {worker.pid} exited with {worker.proc.returncode} at start:\n"
                    + worker.log.read_text(errors="replace")[-3000:]
                )
            return bool(self.redis.sismember(ready, worker.pid))

        wait_until(check, timeout, f"worker {worker.pid} ready")

    def _hash(self, kind: str) -> dict[str, int]:
        raw = self.redis.hgetall(obs_key(self.namespace, kind))
        return {k.decode(): int(v) for k, v in raw.items()}

    def runs(self) -> dict[str, int]:
        """label -> times a task body started."""
        return self._hash("runs")

    def done(self) -> dict[str, int]:
        """label -> times a task body returned."""
        return self._hash("done")

    def pids(self) -> dict[str, int]:
        """label -> pid of the process that last started the body."""
        return self._hash("pid")

    def in_flight(self, pid: int) -> list[str]:
        """Labels whose body was last started by ``pid`` and has not returned."""
        runs, done = self.runs(), self.done()
        return [
            label
            for label, p in self.pids().items()
            if p == pid and runs.get(label, 0) > done.get(label, 0)
        ]

    def enqueue(self, queue: Queue, task: str, items: list[tuple[str, float]]) -> None:
        """Enqueue ``task(label, seconds)`` for each item, with the label as task id."""
        registered = queue.tasks[task]
        for label, seconds in items:
            registered.options(task_id=label).enqueue_sync(label, seconds)

    def records(self, ids: list[str]) -> dict[str, bytes | None]:
        """Raw records of ``ids`` (``None`` where missing), in one MGET."""
        if not ids:
            return {}
        values = self.redis.mget([self.key("t:" + i) for i in ids])
        return dict(zip(ids, values, strict=True))

    def states(self, ids: list[str]) -> dict[str, TaskRecord | None]:
        """Decoded records of ``ids`` (``None`` where missing)."""
        return {
            i: (TaskRecord.from_bytes(raw) if raw is not None else None)
            for i, raw in self.records(ids).items()
        }

    def all_final(self, ids: list[str]) -> bool:
        """Whether every id has a record in a final state."""
        return all(r is not None and r.state.is_final for r in self.states(ids).values())

    def logs(self) -> str:
        """Tail of every worker log (for failure messages)."""
        parts = []
        for w in self.workers:
            text = w.log.read_text(errors="replace") if w.log.exists() else ""
            parts.append(f"--- worker {w.pid} (rc={w.proc.poll()}) ---\n{text[-2500:]}")
        return "\n".join(parts)

    def close(self) -> None:
        """Kill leftover workers, close queues and the client."""
        for w in self.workers:
            if w.alive():
                w.kill()
        for q in self.queues:
            q.close_sync()
        if self._client is not None:
            self._client.close()


@pytest.fixture
def make_harness(
    namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[[str | None], Harness]]:
    """Factory of :class:`Harness` objects on a given URL and the test's namespace.

    Every harness is closed after the test (its workers killed); worker logs are printed
    when the test failed.
    """
    made: list[Harness] = []

    def make(url: str | None) -> Harness:
        h = Harness(url, namespace, tmp_path)
        made.append(h)
        return h

    yield make
    report = getattr(request.node, "rep_call", None)
    for h in made:
        if report is not None and report.failed:
            sys.stderr.write(h.logs())
        h.close()


@pytest.fixture
def harness(server_url: str, make_harness: Callable[[str | None], Harness]) -> Harness:
    """A :class:`Harness` on the test's server (see ``server_url``) and namespace."""
    return make_harness(server_url)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's report on the item (so fixtures can tell a failed test)."""
    report = yield
    setattr(item, "rep_" + report.when, report)
    return report


class PrivateRedis:
    """A ``redis-server`` of one test, on a free port, AOF-persisted in a temp directory.

    Args:
        directory: its working directory (AOF, log).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until it answers PING (AOF loaded).

        Raises:
            AssertionError: it did not answer within 10 s.
        """
        binary = shutil.which("redis-server")
        assert binary is not None
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                str(self.directory),
                "--logfile",
                str(self.directory / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answers() -> bool:
            try:
                with redis.Redis.from_url(self.url, socket_connect_timeout=0.5) as c:
                    return bool(c.ping())
            except (redis.RedisError, OSError):
                return False

        wait_until(answers, 30.0, f"private redis-server on port {self.port}")

    def shutdown(self) -> None:
        """SHUTDOWN the server (flushing its AOF) and wait for the process to exit."""
        with redis.Redis.from_url(self.url) as c:
            c.shutdown()
        assert self.proc is not None
        self.proc.wait(10)

    def stop(self) -> None:
        """Kill the server if it runs (finalizer)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A started :class:`PrivateRedis`; killed after the test."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    directory = tmp_path / "redis"
    directory.mkdir()
    server = PrivateRedis(directory)
    server.start()
    yield server
    server.stop()
