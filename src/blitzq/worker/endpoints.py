"""The operations endpoints of one worker: Prometheus metrics and health, started with the
worker and stopped at its shutdown.

``Worker(metrics_port=..., health_port=..., ops_host=...)`` (``blitzq worker --metrics-port
--health-port --ops-host``). Metrics are served by prometheus-client's HTTP server (a daemon
thread) on the metrics port; health by a Starlette app under uvicorn in the worker's event
loop on the health port; when both ports are the same, that one app serves ``/metrics`` too.
The modules are imported only when a port is given, so a worker without them installs nothing
and pays nothing (the runner's observer stays ``None``).

Under ``blitzq worker --workers N`` every worker process serves its own ports: the base
port plus its slot index (0 … N-1, from ``BLITZQ_WORKER_SLOT``); see :func:`.ports.slot_port`.
A worker the supervisor starts to *replace* another in its slot (a reload, a recycle, a
restart) finds the slot's ports still held while its predecessor finishes its runs: the
supervisor sets ``BLITZQ_OPS_PORT_WAIT`` (seconds) for it, and a port in use is then retried in
the background every :data:`RETRY_INTERVAL` seconds while the worker runs its tasks, until it
is free; still in use after that long, the worker logs an ERROR and stops with a
:class:`ConfigurationError` (exit code 2). Without the variable (a first start) a port in use
fails at once. The port is bound exclusively either way (no ``SO_REUSEPORT``): two live
processes never share it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import ConfigurationError
from .ports import PortInUse, port_wait

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .fetch import Fetcher
    from .health import Checked, Readiness
    from .metrics import Measured, RunMetrics

    class Served(Checked, Measured, Protocol):
        """What the endpoints see of the worker (a :class:`~blitzq.Worker`): what its
        readiness checks and metrics see, its ports and ``stop``."""

        @property
        def metrics_port(self) -> int | None: ...

        @property
        def health_port(self) -> int | None: ...

        @property
        def ops_host(self) -> str: ...

        def stop(self) -> None: ...


#: Seconds between two tries of a port still in use.
RETRY_INTERVAL = 0.25

logger = logging.getLogger("blitzq.worker")


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

    def __init__(self, worker: Served) -> None:
        self.worker = worker
        self.metrics: RunMetrics | None = None
        self.metrics_address: tuple[str, int] | None = None
        self.health_address: tuple[str, int] | None = None
        #: seconds a port in use is retried (:func:`port_wait`).
        self.port_wait = port_wait()
        #: the error that stopped the worker: a port still in use after :attr:`port_wait`.
        self.error: ConfigurationError | None = None
        self._metrics_server: tuple[Any, Any] | None = None
        self._health_server: tuple[Any, asyncio.Task[None]] | None = None
        self._readiness: type[Readiness] | None = None
        self._app: Any = None
        self._retry: asyncio.Task[None] | None = None
        if worker.metrics_port is not None:
            from .metrics import RunMetrics

            self.metrics = RunMetrics(worker)
        if worker.health_port is not None:  # a missing extra is refused here, not at run()
            from .health import Readiness

            self._readiness = Readiness

    @property
    def _shared(self) -> bool:
        return self.metrics is not None and self.worker.health_port == self.worker.metrics_port

    async def start(self, fetcher: Fetcher) -> list[asyncio.Task[None]]:
        """Serve the endpoints; return the background tasks (sampling, probing) for the
        worker to cancel at shutdown. A port in use is retried in the background for
        :attr:`port_wait` seconds when that is above 0 (see the module docstring).

        Raises:
            ConfigurationError: a port cannot be bound (in use and no wait), or an extra is
                not installed.
        """
        worker = self.worker
        tasks: list[asyncio.Task[None]] = []
        metrics, shared = self.metrics, self._shared
        serves: list[Callable[[], Awaitable[None]]] = []
        if metrics is not None:
            await metrics.first_sample()  # before serving: the first scrape has the gauges
            tasks.append(asyncio.create_task(metrics.sample_loop(), name="blitzq-metrics"))
            if not shared:
                serves.append(self._serve_metrics)
        if worker.health_port is not None and self._readiness is not None:
            from .health import make_app

            readiness = self._readiness(worker, fetcher.running)
            self._app = make_app(readiness, metrics.registry if shared and metrics else None)
            serves.append(self._serve_health)
            tasks.append(asyncio.create_task(readiness.probe_loop(), name="blitzq-readiness"))
        waiting: list[tuple[Callable[[], Awaitable[None]], PortInUse]] = []
        for serve in serves:
            try:
                await serve()
            except PortInUse as exc:
                if self.port_wait <= 0:
                    raise
                waiting.append((serve, exc))
        if waiting:
            logger.warning(
                "%s: presumably the previous worker of this slot, still finishing its runs; "
                "this worker runs its tasks meanwhile and retries for up to %.0f s",
                "; ".join(str(exc) for _, exc in waiting),
                self.port_wait,
            )
            self._retry = asyncio.create_task(self._retry_loop(waiting), name="blitzq-ops-bind")
        return tasks

    async def _serve_metrics(self) -> None:
        from .metrics import serve_metrics

        assert self.metrics is not None
        host = self.worker.ops_host
        server, _ = self._metrics_server = serve_metrics(
            self.metrics.registry, host, self.worker.metrics_port or 0
        )
        self.metrics_address = (host, int(server.server_address[1]))

    async def _serve_health(self) -> None:
        from .health import serve_health

        host, port = self.worker.ops_host, self.worker.health_port
        assert port is not None
        server, _ = self._health_server = await serve_health(self._app, host, port)
        self.health_address = (host, int(server.servers[0].sockets[0].getsockname()[1]))
        if self._shared:
            self.metrics_address = self.health_address

    async def _retry_loop(
        self, waiting: list[tuple[Callable[[], Awaitable[None]], PortInUse]]
    ) -> None:
        """Try the ports in use again until bound; past :attr:`port_wait` seconds, log an
        ERROR, keep it in :attr:`error` and stop the worker (which raises it)."""
        deadline = time.monotonic() + self.port_wait
        while waiting:
            await asyncio.sleep(RETRY_INTERVAL)
            still = []
            for serve, _ in waiting:
                try:
                    await serve()
                except PortInUse as exc:
                    still.append((serve, exc))
                except ConfigurationError as exc:
                    self._fail(str(exc))
                    return
            waiting = still
            if waiting and time.monotonic() >= deadline:
                self._fail(f"{waiting[0][1]} (still in use after {self.port_wait:.0f} s)")
                return
        logger.info(
            "ops endpoints served now: metrics %s, health %s",
            self.metrics_address,
            self.health_address,
        )

    def _fail(self, message: str) -> None:
        logger.error("%s: the worker stops", message)
        self.error = ConfigurationError(message)
        self.worker.stop()

    async def stop(self) -> None:
        """Stop serving (bounded); safe to call when nothing was started."""
        if self._retry is not None:
            self._retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retry
            self._retry = None
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


__all__ = ["RETRY_INTERVAL", "Ops"]
