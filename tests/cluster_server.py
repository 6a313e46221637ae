"""A local 3-primary Redis Cluster for the tests (``cluster_url`` in tests/conftest.py).

Three ``redis-server --cluster-enabled yes`` on free ports in one temporary directory, joined by
``redis-cli --cluster create ... --cluster-replicas 0``; ready once every node reports
``cluster_state:ok``. Stopped (and its directory deleted) by :meth:`LocalCluster.stop`.
With ``replicas=1`` each primary has a replica (six servers), which a SIGKILL of the primary
(:meth:`LocalCluster.kill`) promotes; ``host`` binds the nodes to another local address than
127.0.0.1 (the chaos suite's network namespaces reach them there, tests/chaos/netns.py).
"""

from __future__ import annotations

import shutil
import socket
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
    """Three cluster-enabled primaries (and ``replicas`` replicas of each) joined into one
    cluster.

    Args:
        server: path of ``redis-server``.
        cli: path of ``redis-cli``.
        host: the local address the nodes bind to and announce.
        replicas: replicas per primary.
        node_timeout: ``cluster-node-timeout`` (milliseconds): how long a primary may be
            unreachable before its replica is promoted.
    """

    def __init__(
        self,
        server: str,
        cli: str,
        host: str = "127.0.0.1",
        replicas: int = 0,
        node_timeout: int = 5000,
    ) -> None:
        self.server, self.cli, self.host, self.replicas = server, cli, host, replicas
        self.node_timeout = node_timeout
        self.workdir = Path(tempfile.mkdtemp(prefix="blitzq-test-cluster-"))
        self.ports: list[int] = []
        while len(self.ports) < 3 * (1 + replicas):
            port = cluster_port()
            if all(abs(port - p) > 1 for p in self.ports) and _bindable(host, port):
                self.ports.append(port)
        self.procs = {port: self._spawn(port) for port in self.ports}

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                self.server,
                "--bind",
                self.host,
                "--port",
                str(port),
                "--cluster-enabled",
                "yes",
                "--cluster-announce-ip",
                self.host,
                # Another address than loopback is one of the test's own (reachable from its
                # network namespaces only): no password, so protected mode would refuse it.
                "--protected-mode",
                "no" if self.host != "127.0.0.1" else "yes",
                "--cluster-config-file",
                str(self.workdir / f"nodes-{port}.conf"),
                "--cluster-node-timeout",
                str(self.node_timeout),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--logfile",
                str(self.workdir / f"log-{port}"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def url(self, port: int | None = None) -> str:
        """``redis://`` URL of the node on ``port`` (the first node by default)."""
        return f"redis://{self.host}:{port or self.ports[0]}/0"

    def node(self, port: int) -> redis.Redis:
        """A plain (single-node) client on the node on ``port``; close it after use."""
        return redis.Redis(host=self.host, port=port, socket_timeout=10, socket_connect_timeout=10)

    def start(self, timeout: float = 60.0) -> bool:
        """Wait for the servers, create the cluster, wait for ``cluster_state:ok`` everywhere.

        Returns False when a server exited or the cluster was not ready within ``timeout``
        seconds.
        """
        deadline = time.monotonic() + timeout
        for port, proc in self.procs.items():
            while not self._pings(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
        nodes = [f"{self.host}:{p}" for p in self.ports]
        replicas = ["--cluster-replicas", str(self.replicas)]
        created = subprocess.run(
            [self.cli, "--cluster", "create", *nodes, *replicas, "--cluster-yes"],
            capture_output=True,
            timeout=max(1.0, deadline - time.monotonic()),
        )
        if created.returncode != 0:
            return False
        while not all(self._ok(port) for port in self.ports) or (
            self.replicas and not self.replicated(0.0)
        ):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def alive(self, port: int) -> bool:
        """Whether the server on ``port`` runs."""
        return self.procs[port].poll() is None

    def kill(self, port: int) -> None:
        """SIGKILL the server on ``port`` and reap it."""
        proc = self.procs[port]
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)

    def restart(self, port: int) -> None:
        """Start the server on ``port`` again (after :meth:`kill`): it reads its
        ``nodes.conf`` and rejoins, as a replica when its slots went to another node."""
        self.procs[port] = self._spawn(port)

    def primaries(self) -> dict[int, list[int]]:
        """Port of each live primary holding slots -> ports of its live replicas (from a live
        node's ``CLUSTER NODES``; nodes flagged ``fail`` and servers not running are left
        out)."""
        view = self._nodes()
        by_id = {fields[0]: fields for fields in view}
        found: dict[int, list[int]] = {}
        for fields in view:
            flags = fields[2].split(",")
            port = _port_of(fields[1])
            if "master" in flags and "fail" not in flags and len(fields) > 8 and self.alive(port):
                found.setdefault(port, [])
        for fields in view:
            flags = fields[2].split(",")
            port = _port_of(fields[1])
            if "slave" in flags and "fail" not in flags and fields[3] in by_id and self.alive(port):
                primary = _port_of(by_id[fields[3]][1])
                if primary in found:
                    found[primary].append(port)
        return found

    def _nodes(self) -> list[list[str]]:
        for port in self.ports:
            if not self.alive(port):
                continue
            try:
                with self.node(port) as client:
                    raw = client.execute_command("CLUSTER", "NODES")
            except (redis.RedisError, OSError):
                continue
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            return [line.split() for line in text.splitlines() if line.strip()]
        raise LookupError("no node of the cluster answers")

    def healthy(self) -> bool:
        """Whether every live node reports ``cluster_state:ok`` and three live primaries
        hold the slots."""
        live = [p for p in self.ports if self.alive(p)]
        try:
            return all(self._ok(p) for p in live) and len(self.primaries()) == 3
        except LookupError:
            return False

    def replicated(self, timeout: float) -> bool:
        """Wait until every live replica has processed what its primary had written when
        this was called (``master_repl_offset`` / ``slave_repl_offset``); False after
        ``timeout`` seconds, or when a primary has no live replica."""
        targets: dict[int, int] = {}
        groups = self.primaries()
        for primary, replicas in groups.items():
            if not replicas:
                return False
            with self.node(primary) as client:
                offset = int(client.info("replication")["master_repl_offset"])
            for replica in replicas:
                targets[replica] = offset
        deadline = time.monotonic() + timeout
        while True:
            behind = []
            for replica, offset in targets.items():
                try:
                    with self.node(replica) as client:
                        info = client.info("replication")
                except (redis.RedisError, OSError):
                    behind.append(replica)
                    continue
                if (
                    info.get("master_link_status") != "up"
                    or int(info.get("slave_repl_offset", -1)) < offset
                ):
                    behind.append(replica)
            if not behind:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)

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
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _port_of(address: str) -> int:
    """The client port of a ``CLUSTER NODES`` address (``ip:port@bus[,hostname]``)."""
    return int(address.split("@")[0].rsplit(":", 1)[1])


def _bindable(host: str, port: int) -> bool:
    """Whether ``port`` and its bus port are free on ``host`` too (not only 127.0.0.1)."""
    try:
        with socket.socket() as a, socket.socket() as b:
            a.bind((host, port))
            b.bind((host, port + 10000))
    except OSError:
        return False
    return True


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
                src.execute_command(
                    "MIGRATE", self.cluster.host, self.target, "", 0, 5000, "KEYS", *keys
                )
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
