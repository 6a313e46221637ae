"""The ports of a worker's operations endpoints (:mod:`.endpoints`): which port a worker of a
supervisor's slot serves (``BLITZQ_WORKER_SLOT``), how long a port still held by the slot's
previous worker is retried (``BLITZQ_OPS_PORT_WAIT``), the check of the port options, and
:class:`PortInUse`. A leaf: the endpoints, the health and metrics servers and the supervisor
import it, it imports none of them.
"""

from __future__ import annotations

import math
import os
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


__all__ = ["PORT_WAIT_ENV", "SLOT_ENV", "PortInUse", "check_ops_options", "port_wait", "slot_port"]
