"""RabbitMQ for the tests: the shared server (skip when it does not answer), queue cleanup,
and a private node with its own settings (``consumer_timeout``).

The shared server is ``BLITZQ_TEST_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``);
tests use unique namespaces there and delete the queues they declared. :class:`PrivateNode`
starts ``rabbitmq-server`` on free ports in a temporary directory, for a test that needs a
server setting of its own, and stops it afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from blitzq.broker.amqp.channels import AmqpLink
from tests.broker_kinds import is_amqp
from tests.conftest import free_port
from tests.polling import wait_until

DEFAULT_AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
RABBITMQ_SERVER = "/usr/sbin/rabbitmq-server"


def amqp_url() -> str:
    """The shared RabbitMQ the tests use."""
    return os.environ.get("BLITZQ_TEST_AMQP_URL", DEFAULT_AMQP_URL)


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at ``url``'s host and port."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), timeout):
            return True
    except OSError:
        return False


def amqp_or_skip() -> str:
    """The shared RabbitMQ's URL, or skip the test (with the reason) when it does not answer."""
    url = amqp_url()
    if not answers(url):
        pytest.skip(f"RabbitMQ does not answer at {urlsplit(url).netloc.rpartition('@')[2]}")
    return url


async def delete_amqp_queues(url: str, brokers: Iterable[Any]) -> None:
    """Delete every RabbitMQ queue the given :class:`AmqpBroker` instances declared, with
    the other priority levels of each (a worker in another process declares those)."""
    names: set[str] = set()
    for broker in brokers:
        if is_amqp(broker):
            for name in broker.transport.link.used:
                base = name.removesuffix(":high").removesuffix(":low")
                names |= {name, base, base + ":high", base + ":low"}
    if not names:
        return
    link = AmqpLink(url, "cleanup", 1)
    try:
        await link.delete(sorted(names))
    finally:
        await link.close()


@asynccontextmanager
async def amqp_brokers(
    redis_url: str, namespace: str, default_query: str = ""
) -> AsyncIterator[Callable[..., Any]]:
    """A factory of :class:`AmqpBroker` instances on the shared RabbitMQ (skips the test when
    it does not answer) with their state on ``redis_url`` in ``namespace``: ``factory(query=
    default_query, **options)``, ``query`` added to the URL (``"?pack=1"``). On exit every
    broker made is closed, then the RabbitMQ queues they declared are deleted (after the
    close, which may publish back)."""
    from blitzq.broker.amqp import AmqpBroker

    url = amqp_or_skip()
    made: list[Any] = []

    def factory(query: str = default_query, **options: Any) -> Any:
        broker = AmqpBroker(url + query, redis_url, namespace, **options)
        made.append(broker)
        return broker

    try:
        yield factory
    finally:
        for broker in made:
            await broker.close()
        await delete_amqp_queues(url, made)


class PrivateNode:
    """A RabbitMQ node of this test on free ports (``rabbitmq-server``), with ``config``
    lines added to its ``rabbitmq.conf`` (e.g. ``consumer_timeout = 10000``).

    ``advanced``: an Erlang-term ``advanced.config`` (e.g. a short ``channel_tick_interval``,
    how often a channel checks its consumers' timeouts). Call :meth:`start` (skips the test
    when the node cannot start here), then :meth:`stop`.
    """

    def __init__(self, config: str = "", advanced: str = "") -> None:
        self.port = free_port()
        self.dist_port = free_port()
        self.name = f"blitzq{uuid.uuid4().hex[:8]}@localhost"
        self.dir = Path(tempfile.mkdtemp(prefix="blitzq-rabbit-"))
        self.dir.chmod(0o777)  # the server script may drop to the rabbitmq user
        (self.dir / "rabbit.conf").write_text(
            f"listeners.tcp.default = {self.port}\nloopback_users = none\n{config}\n"
        )
        (self.dir / "advanced.config").write_text(advanced or "[].\n")
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> str:
        """Start (or, after :meth:`halt`, restart) the node and wait until it accepts
        connections; return its URL."""
        if not Path(RABBITMQ_SERVER).exists():
            pytest.skip(f"no {RABBITMQ_SERVER} to start a private RabbitMQ node")
        env = dict(
            os.environ,
            HOME=str(self.dir),
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_PORT=str(self.port),
            RABBITMQ_DIST_PORT=str(self.dist_port),
            RABBITMQ_MNESIA_BASE=str(self.dir / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.dir / "log"),
            RABBITMQ_CONFIG_FILE=str(self.dir / "rabbit"),
            RABBITMQ_ADVANCED_CONFIG_FILE=str(self.dir / "advanced.config"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.dir / "plugins"),
            RABBITMQ_FEATURE_FLAGS_FILE=str(self.dir / "feature_flags"),
            RABBITMQ_PID_FILE=str(self.dir / "pid"),
            RABBITMQ_LOGS="-",
        )
        (self.dir / "out.txt").unlink(missing_ok=True)  # a restart waits for its own line
        self.proc = subprocess.Popen(
            [RABBITMQ_SERVER],
            env=env,
            stdout=(self.dir / "out.txt").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                pytest.skip("a private RabbitMQ node could not start here")
            if "Server startup complete" in self._log():
                return self.url
            time.sleep(0.2)
        self.stop()
        pytest.skip(f"a private RabbitMQ node did not start within {timeout} s")

    def _log(self) -> str:
        try:
            return (self.dir / "out.txt").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the node (its whole process group) and delete its directory."""
        self.halt()
        # The VM's last files (``clean.dot`` at shutdown) may land while the tree is being
        # deleted: delete again until the directory is gone (give up after 10 s).
        deadline = time.monotonic() + 10.0
        while self.dir.exists() and time.monotonic() < deadline:
            shutil.rmtree(self.dir, ignore_errors=True)
            if self.dir.exists():
                time.sleep(0.1)

    def halt(self) -> None:
        """Stop the node and wait until every process of it has exited, keeping its
        directory: :meth:`start` then restarts it with its durable queues and messages."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            pid_file = self.dir / "pid"
            beam = pid_file.read_text().strip() if pid_file.exists() else ""
            if beam.isdigit():
                os.kill(int(beam), signal.SIGTERM)  # the Erlang VM itself (another user)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        # The VM writes its files until it is gone (it runs as another user, in no group of
        # ours): wait for every process of this node to exit, then delete the directory.
        wait_until(lambda: not _node_processes(self.name), 60, "the RabbitMQ node exits")


def _node_processes(name: str) -> list[int]:
    """Pids whose command line names the node ``name``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if name.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def close_connection_named(name: str, timeout: float = 30.0) -> int:
    """Close, as the server does, the connections of the local RabbitMQ node whose client
    named them ``name`` (``rabbitmqctl``); return how many."""
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "client_properties"],
        capture_output=True, text=True, timeout=timeout, check=True,
    )  # fmt: skip
    pids = [line.split()[0] for line in listed.stdout.splitlines() if f'"{name}"' in line]
    for pid in pids:
        subprocess.run(
            ["rabbitmqctl", "-q", "close_connection", pid, "closed by a blitzq test"],
            capture_output=True, timeout=timeout, check=True,
        )  # fmt: skip
    return len(pids)
