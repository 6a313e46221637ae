"""A local 3-primary Redis Cluster for the tests (``cluster_url`` in tests/conftest.py).

Three ``redis-server --cluster-enabled yes`` on free ports in one temporary directory, joined by
``redis-cli --cluster create ... --cluster-replicas 0``; ready once every node reports
``cluster_state:ok``. Stopped (and its directory deleted) by :meth:`LocalCluster.stop`.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def cluster_port() -> int:
    """A port free on 127.0.0.1 whose cluster bus port (``port + 10000``) is free too."""
    while True:
        port = random.randrange(20000, 45000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port


class LocalCluster:
    """Three cluster-enabled ``redis-server`` processes joined into one cluster.

    Args:
        server: path of ``redis-server``.
        cli: path of ``redis-cli``.
    """

    def __init__(self, server: str, cli: str) -> None:
        self.cli = cli
        self.workdir = Path(tempfile.mkdtemp(prefix="blitzq-test-cluster-"))
        self.ports: list[int] = []
        while len(self.ports) < 3:
            port = cluster_port()
            if all(abs(port - p) > 1 for p in self.ports):
                self.ports.append(port)
        self.procs = [
            subprocess.Popen(
                [
                    server, "--bind", "127.0.0.1", "--port", str(port),
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", str(self.workdir / f"nodes-{port}.conf"),
                    "--cluster-node-timeout", "5000",
                    "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                    "--logfile", str(self.workdir / f"log-{port}"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for port in self.ports
        ]  # fmt: skip

    def url(self, port: int | None = None) -> str:
        """``redis://`` URL of the node on ``port`` (the first node by default)."""
        return f"redis://127.0.0.1:{port or self.ports[0]}/0"

    def node(self, port: int) -> redis.Redis:
        """A plain (single-node) client on the node on ``port``; close it after use."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)

    def start(self, timeout: float = 60.0) -> bool:
        """Wait for the servers, create the cluster, wait for ``cluster_state:ok`` everywhere.

        Returns False when a server exited or the cluster was not ready within ``timeout``
        seconds.
        """
        deadline = time.monotonic() + timeout
        for port, proc in zip(self.ports, self.procs, strict=True):
            while not self._pings(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        created = subprocess.run(
            [self.cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=max(1.0, deadline - time.monotonic()),
        )
        if created.returncode != 0:
            return False
        while not all(self._ok(port) for port in self.ports):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def _pings(self, port: int) -> bool:
        try:
            with self.node(port) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    def _ok(self, port: int) -> bool:
        try:
            with self.node(port) as client:
                info = client.execute_command("CLUSTER", "INFO")
        except (redis.RedisError, OSError):
            return False
        text = info.decode() if isinstance(info, bytes) else str(info)
        return "cluster_state:ok" in text

    def owner(self, key: str) -> int:
        """Port of the primary that owns ``key``'s slot now."""
        with self.node(self.ports[0]) as client:
            slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
            for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if int(start) <= slot <= int(end):
                    return int(primary[1])
        raise LookupError(f"no node owns the slot of {key!r}")

    def stop(self) -> None:
        """Stop every server (SIGTERM, then SIGKILL after 10 s); delete the directory."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)
