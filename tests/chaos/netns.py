"""Worker "hosts" in Linux network namespaces of the test's own (``ip netns``), for the
multi-host chaos scenario (test_hosts.py).

:class:`HostNetwork` makes, with names and addresses no one else uses (a random token in every
name, a ``10.<n>.0.0/16`` that no interface or route of the machine touches):

- a veth pair in the root namespace whose first end carries the *server* addresses
  ``10.<n>.0.1`` (the cluster the hosts use) and ``10.<n>.0.2`` (the observation server);
- per host ``k`` (1, 2, ...) a namespace ``blitzq-<token>-h<k>`` and a veth pair: the root
  end ``10.<n>.<k>.1/24``, the namespace end ``10.<n>.<k>.2/24``, the namespace routing
  ``10.<n>.0.0/24`` through the root end.

:meth:`HostNetwork.partition` cuts host ``k`` from the cluster's address, inside *its*
namespace: a ``blackhole`` route for ``10.<n>.0.1/32`` (packets to the cluster are dropped
there, new connections fail, open ones go silent); the observation server stays reachable.
:meth:`HostNetwork.heal` deletes that route. :meth:`HostNetwork.close` deletes every
namespace and link it made (the namespace ends go with their namespace), whatever state the
test left; nothing else on the machine is touched (no iptables, no global route, no
``sysctl``).
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import subprocess

#: Second octets of the ``10.<n>.0.0/16`` networks tried.
_OCTETS = range(64, 250)


class NamespaceUnavailable(Exception):
    """Network namespaces cannot be made here (the message says why)."""


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    """Run ``ip ARGS`` (inside ``netns`` when given); return its output.

    Raises:
        subprocess.CalledProcessError: it failed and ``check``.
    """
    prefix = ["ip", "netns", "exec", netns] if netns else []
    done = subprocess.run(
        [*prefix, "ip", *args], capture_output=True, text=True, timeout=60, check=False
    )
    if check and done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


def unavailable_reason() -> str | None:
    """Why network namespaces cannot be made here, or None when they can (probed by making
    and deleting one, with a veth pair, of a random name)."""
    if os.name != "posix" or not hasattr(os, "geteuid"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    token = secrets.token_hex(3)
    name, a, b = f"blitzq-probe-{token}", f"bqp{token}a", f"bqp{token}b"
    try:
        _ip("netns", "add", name)
    except subprocess.CalledProcessError as e:
        return f"`ip netns add` failed: {e.stderr.strip()}"
    try:
        _ip("link", "add", a, "type", "veth", "peer", "name", b, "netns", name)
    except subprocess.CalledProcessError as e:
        return f"a veth pair cannot be made: {e.stderr.strip()}"
    finally:
        _ip("link", "del", a, check=False)
        _ip("netns", "del", name, check=False)
    return None


def _taken_networks() -> set[int]:
    """Second octets of the ``10.x`` addresses and routes the machine has now."""
    text = _ip("-o", "addr") + _ip("route") + _ip("-4", "route", "show", "table", "all")
    taken = set()
    for word in text.split():
        address = word.split("/")[0]
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            continue
        if parsed.version == 4 and address.startswith("10."):
            taken.add(int(address.split(".")[1]))
    return taken


class HostNetwork:
    """``hosts`` network namespaces wired to the root namespace (see the module docstring).

    Args:
        hosts: how many worker hosts (namespaces).

    Raises:
        NamespaceUnavailable: a step failed (everything made so far is deleted).
    """

    def __init__(self, hosts: int) -> None:
        self.token = secrets.token_hex(3)
        free = [n for n in _OCTETS if n not in _taken_networks()]
        if not free:
            raise NamespaceUnavailable("no free 10.<n>.0.0/16 network for the test")
        self.octet = secrets.choice(free)
        self.hosts = hosts
        self.names = [f"blitzq-{self.token}-h{k}" for k in range(1, hosts + 1)]
        self.links: list[str] = []  # root-namespace ends, deleted by close()
        self.made: list[str] = []  # namespaces made, deleted by close()
        self.partitioned: set[int] = set()
        try:
            self._make()
        except subprocess.CalledProcessError as e:
            self.close()
            raise NamespaceUnavailable(f"{' '.join(e.cmd)}: {e.stderr.strip()}") from e

    @property
    def server_address(self) -> str:
        """Where the cluster listens (``10.<n>.0.1``)."""
        return f"10.{self.octet}.0.1"

    @property
    def observer_address(self) -> str:
        """Where the observation server listens (``10.<n>.0.2``): never partitioned."""
        return f"10.{self.octet}.0.2"

    def _make(self) -> None:
        server, server_peer = f"bq{self.token}s0", f"bq{self.token}s1"
        _ip("link", "add", server, "type", "veth", "peer", "name", server_peer)
        self.links.append(server)
        _ip("addr", "add", f"{self.server_address}/32", "dev", server)
        _ip("addr", "add", f"{self.observer_address}/32", "dev", server)
        _ip("link", "set", server, "up")
        _ip("link", "set", server_peer, "up")
        for k, name in enumerate(self.names, start=1):
            _ip("netns", "add", name)
            self.made.append(name)
            root_end, ns_end = f"bq{self.token}h{k}", f"bq{self.token}n{k}"
            _ip("link", "add", root_end, "type", "veth", "peer", "name", ns_end, "netns", name)
            self.links.append(root_end)
            _ip("addr", "add", f"10.{self.octet}.{k}.1/24", "dev", root_end)
            _ip("link", "set", root_end, "up")
            _ip("link", "set", "lo", "up", netns=name)
            _ip("addr", "add", f"10.{self.octet}.{k}.2/24", "dev", ns_end, netns=name)
            _ip("link", "set", ns_end, "up", netns=name)
            via = f"10.{self.octet}.{k}.1"
            _ip("route", "add", f"10.{self.octet}.0.0/24", "via", via, netns=name)

    def prefix(self, host: int) -> list[str]:
        """The command prefix that runs a program on host ``host`` (1-based):
        ``ip netns exec <name>`` (the program keeps its pid and environment)."""
        return ["ip", "netns", "exec", self.names[host - 1]]

    def partition(self, host: int) -> None:
        """Cut host ``host`` from the cluster's address (a blackhole route in its namespace)."""
        _ip("route", "add", "blackhole", f"{self.server_address}/32", netns=self.names[host - 1])
        self.partitioned.add(host)

    def heal(self, host: int) -> None:
        """Undo :meth:`partition` of host ``host``."""
        _ip("route", "del", "blackhole", f"{self.server_address}/32", netns=self.names[host - 1])
        self.partitioned.discard(host)

    def close(self) -> None:
        """Delete every namespace and link made (idempotent; never raises). Processes still
        running in a namespace keep it alive until they exit: kill them first."""
        for name in self.made:
            _ip("netns", "del", name, check=False)
        for link in self.links:
            _ip("link", "del", link, check=False)
        self.made, self.links = [], []
