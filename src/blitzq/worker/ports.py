"""The ports of a worker's operations endpoints (:mod:`.endpoints`): which port a worker of a
supervisor's slot serves (``BLITZQ_WORKER_SLOT``), how long a port still held by the slot's
previous worker is retried (``BLITZQ_OPS_PORT_WAIT``), the check of the port options,
:func:`bind_port` (the health endpoints' and the dashboard's socket) and :class:`PortInUse`.
A leaf: the endpoints, the health and metrics servers, the supervisor and ``blitzq
dashboard`` import it, it imports none of them.
"""

from __future__ import annotations

import errno
import math
import os
import socket
from typing import Any

from .._checks import integer, text
from ..exceptions import ConfigurationError

#: Environment variable the supervisor sets to each worker process's slot index.
SLOT_ENV = "BLITZQ_WORKER_SLOT"
#: Environment variable the supervisor sets for a worker replacing another in its slot: the
#: seconds a port still in use is retried before it counts as a configuration error.
PORT_WAIT_ENV = "BLITZQ_OPS_PORT_WAIT"


class PortInUse(ConfigurationError):
    """An ops port is held by another socket (``EADDRINUSE``)."""


def bind_port(host: str, port: int, what: str) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening), for a server to listen on: the
    worker's health endpoints, the dashboard. Bound before anything says it serves, so a port
    in use is an error at once, not after a banner.

    Args:
        host: the address (an IPv6 one holds ``:``).
        port: the TCP port (0: any free port; ``getsockname()`` tells which).
        what: what is served, for the error (``"health endpoints"``, ``"the dashboard"``).

    Raises:
        ConfigurationError: the address cannot be bound (no permission, bad host; a
            :class:`PortInUse` when another socket holds it).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        kind = PortInUse if exc.errno == errno.EADDRINUSE else ConfigurationError
        raise kind(f"cannot serve {what} on {host}:{port}: {exc}") from None
    return sock


def port_wait() -> float:
    """Seconds to retry a port in use (``BLITZQ_OPS_PORT_WAIT``; 0: fail at once)."""
    try:
        wait = float(os.environ.get(PORT_WAIT_ENV, ""))
    except ValueError:
        return 0.0
    return wait if math.isfinite(wait) and wait > 0 else 0.0


def slot_port(base: int | None) -> int | None:
    """``base`` plus this process's supervisor slot index (``BLITZQ_WORKER_SLOT``, 0 when
    not run by a supervisor); ``None`` stays ``None``, and port 0 (any free port) stays 0."""
    if base is None or base == 0:
        return base
    raw = os.environ.get(SLOT_ENV, "0")
    return base + (int(raw) if raw.isdigit() else 0)


def check_ops_options(metrics_port: Any, health_port: Any, host: Any) -> None:
    """Check ``Worker``'s ``metrics_port``, ``health_port`` (``None`` or 0-65535) and
    ``ops_host`` (a non-empty string).

    Raises:
        ConfigurationError: a value of the wrong type or out of range.
    """
    for option, port in (("metrics_port", metrics_port), ("health_port", health_port)):
        if port is not None and integer(option, port, minimum=0) > 65535:
            raise ConfigurationError(f"{option} must be a TCP port (0-65535), got {port}")
    text("ops_host", host, optional=False)


__all__ = [
    "PORT_WAIT_ENV",
    "SLOT_ENV",
    "PortInUse",
    "bind_port",
    "check_ops_options",
    "port_wait",
    "slot_port",
]
