"""Shared fixtures: a real Redis (or the embedded Valkey) and a unique namespace per test.

``BLITZQ_TEST_REDIS_URL`` picks the server: a ``redis://`` URL, or ``embedded`` for a private
embedded Valkey in a temporary directory. By default the tests use 127.0.0.1:6379 when it
answers; otherwise the session starts its own ``redis-server`` on a free port (and stops it
when the session ends), and falls back to a private embedded Valkey when no ``redis-server``
binary exists. Tests never flush the server: each one uses its own namespace and deletes its
keys afterwards, so tests can run in parallel against one server.

A test (or module, with ``pytestmark``) marked ``both_servers`` runs twice: on that server
(``[redis]``) and on a private embedded Valkey started once per session (``[valkey]``). Redis
>= 7.2 and Valkey differ from Redis 7.0 where it matters to fetching (a blocked XREADGROUP
over several streams returns one entry from *each* stream that got data), so the fetch,
priority and shutdown tests run on both in every ``make test``. The ``[valkey]`` run is
skipped when the session's server is Valkey already. Fixtures built on ``server_url``
(``namespace``, ``make_queue``, ``raw_redis``, the reliability ``harness``) follow the run.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from blitzq import Queue

DEFAULT_URL = "redis://127.0.0.1:6379/0"

# CI machines export COLUMNS=80; every run does, so a test that passes here passes there
# (the CLI's output off a terminal must not depend on it: cli/_common.py, console()).
os.environ["COLUMNS"] = "80"


def _answers(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2) as client:
            client.ping()
    except (redis.RedisError, OSError):
        return False
    return True


class SessionRedis:
    """A ``redis-server`` this test session started on a free port; stopped at session end.

    Args:
        binary: path of the ``redis-server`` executable.
    """

    def __init__(self, binary: str) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="blitzq-test-redis-"))
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(
            [
                binary,
                "--bind",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--logfile",
                str(self.workdir / "log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def wait_ready(self, timeout: float = 30.0) -> bool:
        """Wait up to ``timeout`` seconds for PING; False if it exited or never answered."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if _answers(self.url):
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s) and delete its directory."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of the Redis/Valkey server the tests use.

    ``BLITZQ_TEST_REDIS_URL`` if set (``embedded``: a private embedded Valkey); else
    127.0.0.1:6379 if it answers; else a ``redis-server`` of this session on a free port;
    else (no binary) a private embedded Valkey. A server the session started is stopped when
    the session ends.
    """
    wanted = os.environ.get("BLITZQ_TEST_REDIS_URL", "")
    if wanted and wanted != "embedded":
        yield wanted
        return
    if wanted != "embedded":
        if _answers(DEFAULT_URL):
            yield DEFAULT_URL
            return
        binary = shutil.which("redis-server")
        if binary is not None:
            server = SessionRedis(binary)
            try:
                if server.wait_ready():
                    yield server.url
                    return
            finally:
                server.stop()
    from blitzq.broker.redis.embedded import ensure_server, stop_server

    data_dir = Path(tempfile.mkdtemp(prefix="blitzq-test-valkey-"))
    url = ensure_server(data_dir)
    try:
        yield url
    finally:
        stop_server(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def _is_valkey(url: str) -> bool:
    with redis.Redis.from_url(url, socket_connect_timeout=2) as client:
        info = client.info("server")
    return "valkey_version" in info or info.get("server_name") == "valkey"


@pytest.fixture(scope="session")
def valkey_url(redis_url: str) -> Iterator[str]:
    """URL of a private embedded Valkey (blitzq's default server) for the whole session.

    Reuses the session's server when that one is already Valkey.
    """
    if _is_valkey(redis_url):
        yield redis_url
        return
    from blitzq.broker.redis.embedded import ensure_server, stop_server

    data_dir = Path(tempfile.mkdtemp(prefix="blitzq-test-valkey-both-"))
    url = ensure_server(data_dir)
    try:
        yield url
    finally:
        stop_server(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run ``both_servers`` tests on the session's server and on the embedded Valkey."""
    if "server_url" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "both_servers"
    ):
        metafunc.parametrize("server_url", ["redis", "valkey"], indirect=True)


@pytest.fixture
def server_url(request: pytest.FixtureRequest, redis_url: str) -> str:
    """URL of the server this test runs on: the session's (``redis_url``), or in the
    ``[valkey]`` run of a ``both_servers`` test the embedded Valkey (``valkey_url``)."""
    if getattr(request, "param", "redis") != "valkey":
        return redis_url
    if _is_valkey(redis_url):
        pytest.skip("the session's server is Valkey already: the [redis] run covers it")
    return str(request.getfixturevalue("valkey_url"))


@pytest.fixture
def namespace(server_url: str) -> Iterator[str]:
    """A fresh namespace; its keys are deleted after the test."""
    ns = "test-" + uuid.uuid4().hex[:12]
    yield ns
    client = redis.Redis.from_url(server_url)
    keys = list(client.scan_iter(match="{" + ns + "}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def make_queue(server_url: str, namespace: str) -> Callable[..., Queue]:
    """Factory of Queues on the test server and namespace; keyword arguments pass through."""

    def factory(**kwargs: Any) -> Queue:
        kwargs.setdefault("redis_url", server_url)
        kwargs.setdefault("namespace", namespace)
        return Queue(**kwargs)

    return factory


@pytest.fixture
async def raw_redis(server_url: str) -> AsyncIterator[Any]:
    """A plain redis.asyncio client on the test server (to plant or inspect keys by hand)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(server_url)
    yield client
    await client.aclose()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, from this xdist worker's own block of ports
    (``tests/ports.py``), so that two workers never start servers on one port."""
    from tests.ports import free_port as _free_port

    return _free_port()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A local 3-primary Redis Cluster of this session (``tests/cluster_server.py``), started
    on first use and stopped at session end; skips where ``redis-server``/``redis-cli`` are
    absent."""
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        pytest.skip("redis-server and redis-cli are needed to start a local Redis Cluster")
    from tests.cluster_server import LocalCluster

    cluster = LocalCluster(server, cli)
    try:
        if not cluster.start():
            pytest.fail("the local Redis Cluster did not start")
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(autouse=True)
def _environment_restored() -> Iterator[None]:
    """Put ``os.environ`` back as it was before the test. A worker command run in-process
    (click's CliRunner) exports its command-line options (``--redis-url`` ->
    ``BLITZQ_REDIS_URL``, ``cli/worker.py``), and CliRunner restores only the variables it
    was given: left behind, they would send a later test's ``Queue()`` to another server.
    Which test runs later in the same process depends on pytest-xdist's distribution."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _no_cli_log_handler_left() -> Iterator[None]:
    """A command run in-process (click's CliRunner) installs blitzq's stderr handler on the
    root logger (``logconfig.configure_logging``); take it off after the test, with the
    root level, so that later tests' log lines do not reach the terminal."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if getattr(h, "_blitzq_cli_handler", False)]:
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


#: Under pytest-xdist, the test directories whose files run first, slowest kind first: each
#: of their files takes 10-100 s (worker processes, kills, restarts), most other files a few
#: seconds. ``make test`` runs ``--dist loadfile --no-loadscope-reorder``: whole files, handed
#: out in collection order, so these start early and the short files fill the gaps at the
#: end, instead of one worker finishing a long file alone (xdist's own order, by number of
#: tests per file, puts the slow files, which have few tests, last).
SLOW_FIRST = ("tests/chaos/", "tests/reliability/")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker, move the files of :data:`SLOW_FIRST` to the front (a stable sort:
    every worker collects the same order, as xdist requires); one process keeps pytest's
    order."""
    if not hasattr(config, "workerinput"):
        return

    def rank(item: pytest.Item) -> int:
        starts = [i for i, d in enumerate(SLOW_FIRST) if item.nodeid.startswith(d)]
        return starts[0] if starts else len(SLOW_FIRST)

    items.sort(key=rank)


#: Figures of the chaos scenarios run in this session (``tests/chaos``), as plain data taken
#: from their tests' teardown reports (``tests/chaos/conftest.py``'s ``record_figures``): in
#: one process, and in pytest-xdist's controller, which gets the workers' reports.
_CHAOS_FIGURES: list[dict[str, Any]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the chaos figures a test's teardown report carries."""
    if report.when == "teardown":
        _CHAOS_FIGURES.extend(
            data for name, data in report.user_properties if name == "chaos_figures"
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the figures of every chaos scenario that ran (docs/testing.md, chaos suite)."""
    if not _CHAOS_FIGURES:
        return
    from tests.chaos.invariants import summary_lines

    terminalreporter.section("chaos figures")
    for line in summary_lines(_CHAOS_FIGURES):
        terminalreporter.write_line(line)
