"""The operations endpoints of one worker: Prometheus metrics and health, started with the
worker and stopped at its shutdown.

``Worker(metrics_port=..., health_port=..., ops_host=...)`` (``blitzq worker --metrics-port
--health-port --ops-host``). Metrics are served by prometheus-client's HTTP server (a daemon
thread) on the metrics port; health by a Starlette app under uvicorn in the worker's event
loop on the health port; when both ports are the same, that one app serves ``/metrics`` too.
The modules are imported only when a port is given, so a worker without them installs nothing
and pays nothing (the runner's observer stays ``None``).

Under ``blitzq worker --workers N`` every worker process serves its own ports: the base
port plus its slot index (0 … N-1, from ``BLITZQ_WORKER_SLOT``); see :func:`slot_port`.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

from .._checks import integer, text
from ..exceptions import ConfigurationError

if TYPE_CHECKING:
    from .fetch import Fetcher
    from .health import Readiness
    from .metrics import RunMetrics
    from .worker import Worker

#: Environment variable the supervisor sets to each worker process's slot index.
SLOT_ENV = "BLITZQ_WORKER_SLOT"


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


class Ops:
    """Starts and stops the metrics and health endpoints of ``worker``.

    Args:
        worker: the worker; its ``metrics_port``, ``health_port`` and ``ops_host`` say what
            to serve.

    Raises:
        ConfigurationError: a port is given and its extra (``metrics``: prometheus-client;
            ``ops``: starlette and uvicorn) is not installed.

    Attributes:
        metrics: the worker's metrics (the runner's observer), or ``None``.
        metrics_address: ``(host, port)`` the metrics are served on, or ``None``.
        health_address: ``(host, port)`` the health endpoints are served on, or ``None``.
    """

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.metrics: RunMetrics | None = None
        self.metrics_address: tuple[str, int] | None = None
        self.health_address: tuple[str, int] | None = None
        self._metrics_server: tuple[Any, Any] | None = None
        self._health_server: tuple[Any, asyncio.Task[None]] | None = None
        self._readiness: type[Readiness] | None = None
        if worker.metrics_port is not None:
            from .metrics import RunMetrics

            self.metrics = RunMetrics(worker)
        if worker.health_port is not None:  # a missing extra is refused here, not at run()
            from .health import Readiness

            self._readiness = Readiness

    async def start(self, fetcher: Fetcher) -> list[asyncio.Task[None]]:
        """Serve the endpoints; return the background tasks (sampling, probing) for the
        worker to cancel at shutdown.

        Raises:
            ConfigurationError: a port cannot be bound, or an extra is not installed.
        """
        worker, host = self.worker, self.worker.ops_host
        tasks: list[asyncio.Task[None]] = []
        metrics, health_port = self.metrics, worker.health_port
        shared = metrics is not None and health_port == worker.metrics_port
        if metrics is not None:
            await metrics.first_sample()  # before serving: the first scrape has the gauges
            tasks.append(asyncio.create_task(metrics.sample_loop(), name="blitzq-metrics"))
            if not shared:
                from .metrics import serve_metrics

                server, _ = self._metrics_server = serve_metrics(
                    metrics.registry, host, worker.metrics_port or 0
                )
                self.metrics_address = (host, int(server.server_address[1]))
        if health_port is not None and self._readiness is not None:
            from .health import make_app, serve_health

            readiness = self._readiness(worker, fetcher.running)
            app = make_app(readiness, metrics.registry if shared and metrics else None)
            server, _ = self._health_server = await serve_health(app, host, health_port)
            port = int(server.servers[0].sockets[0].getsockname()[1])
            self.health_address = (host, port)
            if shared:
                self.metrics_address = self.health_address
            tasks.append(asyncio.create_task(readiness.probe_loop(), name="blitzq-readiness"))
        return tasks

    async def stop(self) -> None:
        """Stop serving (bounded); safe to call when nothing was started."""
        if self._metrics_server is not None:
            from .metrics import stop_metrics

            server, thread = self._metrics_server
            self._metrics_server = None
            await asyncio.to_thread(stop_metrics, server, thread)
        if self._health_server is not None:
            from .health import stop_health

            server, task = self._health_server
            self._health_server = None
            await stop_health(server, task)


__all__ = ["SLOT_ENV", "Ops", "check_ops_options", "slot_port"]
