"""A local 3-primary Redis Cluster for the tests (``cluster_url`` in tests/conftest.py).

Three ``redis-server --cluster-enabled yes`` on free ports in one temporary directory, joined by
``redis-cli --cluster create ... --cluster-replicas 0``; ready once every node reports
``cluster_state:ok``. Stopped (and its directory deleted) by :meth:`LocalCluster.stop`.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from tests.ports import free_port


def cluster_port() -> int:
    """A port free on 127.0.0.1 whose cluster bus port (``port + 10000``) is free too, from
    this xdist worker's block (``tests/ports.py``)."""
    return free_port(with_bus=True)


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


def node_id(client: redis.Redis) -> str:
    """The cluster node id of the node ``client`` talks to."""
    raw = client.execute_command("CLUSTER", "MYID")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class SlotMigration:
    """Moving one slot to another node while clients keep using it, in the steps
    ``redis-cli --cluster reshard`` takes: :meth:`begin` (``SETSLOT IMPORTING`` on the target,
    ``MIGRATING`` on the source), :meth:`move_keys` (``MIGRATE`` without ``REPLACE``),
    :meth:`end` (``SETSLOT NODE`` on the target, the source, then the others).

    Args:
        cluster: the cluster.
        slot: the slot to move.
        target: port of the node that receives it.
    """

    def __init__(self, cluster: LocalCluster, slot: int, target: int) -> None:
        self.cluster, self.slot, self.target = cluster, slot, target
        with cluster.node(cluster.ports[0]) as first:
            self.source = next(
                int(primary[1])
                for start, end, primary, *_ in first.execute_command("CLUSTER", "SLOTS")
                if int(start) <= slot <= int(end)
            )
        assert self.source != target
        with cluster.node(self.source) as src, cluster.node(target) as dst:
            self.source_id, self.target_id = node_id(src), node_id(dst)

    def begin(self) -> None:
        """Mark the slot importing on the target and migrating on the source."""
        with self.cluster.node(self.target) as dst:
            dst.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.source_id)
        with self.cluster.node(self.source) as src:
            src.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.target_id)

    def move_keys(self, batch: int = 1) -> int:
        """MIGRATE the slot's keys ``batch`` at a time until none is left; how many moved.

        Raises:
            redis.ResponseError: a ``MIGRATE`` refused (e.g. ``BUSYKEY``).
        """
        moved = 0
        with self.cluster.node(self.source) as src:
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", self.slot, batch):
                src.execute_command("MIGRATE", "127.0.0.1", self.target, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
        return moved

    def end(self) -> None:
        """Give the slot to the target on every node (the target first)."""
        others = [p for p in self.cluster.ports if p not in (self.source, self.target)]
        for port in [self.target, self.source, *others]:
            with self.cluster.node(port) as node:
                node.execute_command("CLUSTER", "SETSLOT", self.slot, "NODE", self.target_id)


def migrate_slot(cluster: LocalCluster, slot: int, target: int, batch: int = 1) -> int:
    """Move ``slot`` to the node on port ``target`` (:class:`SlotMigration`, all steps);
    returns the number of keys moved."""
    migration = SlotMigration(cluster, slot, target)
    migration.begin()
    moved = migration.move_keys(batch)
    migration.end()
    return moved
