"""Health endpoints of one worker (``Worker(health_port=...)``, ``blitzq worker
--health-port``); needs the ``ops`` extra (``starlette`` and ``uvicorn``).

- ``GET /health``: 200 ``{"status": "alive"}`` while the process (and its event loop) lives.
- ``GET /ready``: 200 with a JSON body when the broker's transport and its state store answer
  a PING and every fetch loop runs; otherwise 503 with the same body naming the failing parts
  (``"failing": ["broker", "state_store"]``, each check with its backend, e.g. ``"redis"``,
  and its error). Also 503 while the worker is starting or stopping.
- ``GET /metrics``: only when the metrics port is the same as the health port: the
  Prometheus text of the worker's metrics.

The checks run in :meth:`Readiness.probe_loop`, in the worker's event loop, every
:data:`PROBE_INTERVAL` seconds, each PING bounded by :data:`PROBE_TIMEOUT`; ``/ready``
answers from the last probe, and a probe in flight longer than :data:`PROBE_TIMEOUT` + 1 s
counts as failed (a PING stuck in a reconnect that ignores its cancellation). So a server that
went down is reported within ``PROBE_INTERVAL + PROBE_TIMEOUT + 1`` seconds (6 s), and one
that came back within about as long of answering again.

The app is a small Starlette application served by a ``uvicorn.Server`` task inside the
worker's event loop (uvicorn's own signal handling is left out: the worker handles
SIGTERM/SIGINT).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import ConfigurationError
from ..redaction import redact
from .ports import bind_port

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError(
        "health endpoints need starlette and uvicorn: pip install starlette uvicorn (or "
        "install blitzq from its checkout with the extra: pip install -e '.[ops]')"
    ) from exc

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from prometheus_client import CollectorRegistry

    from ..broker import Broker

logger = logging.getLogger("blitzq.worker")


class Checked(Protocol):
    """What the readiness checks see of the worker (a :class:`~blitzq.Worker`)."""

    @property
    def id(self) -> str: ...

    @property
    def instance(self) -> str: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def stopping(self) -> bool: ...


#: Seconds between two readiness probes.
PROBE_INTERVAL = 2.0
#: Seconds one PING may take before its part counts as failing.
PROBE_TIMEOUT = 3.0


def _backend(component: Any) -> str:
    """``"redis"`` for the Redis transport and store, else the component's class name."""
    kind = type(component)
    return "redis" if kind.__module__.startswith("blitzq.broker.redis") else kind.__name__


class Readiness:
    """The worker's readiness: probes the broker's parts and the fetch loops.

    Args:
        worker: the worker checked (its id, broker and ``stopping`` flag).
        loops: returns whether each fetch loop runs, by queue name.
    """

    def __init__(self, worker: Checked, loops: Callable[[], dict[str, bool]]) -> None:
        self.worker = worker
        self._loops = loops
        self._checks: dict[str, dict[str, Any]] = {}
        self._probing_since: float | None = None

    @staticmethod
    async def _ping(ping: Callable[[], Awaitable[None]], backend: str) -> dict[str, Any]:
        try:
            await asyncio.wait_for(ping(), PROBE_TIMEOUT)
        except Exception as exc:
            if isinstance(exc, TimeoutError):
                error = f"no answer within {PROBE_TIMEOUT:.0f} s"
            else:
                error = redact(f"{type(exc).__name__}: {exc}")  # no password on a page
            return {"ok": False, "backend": backend, "error": error}
        return {"ok": True, "backend": backend}

    async def probe(self) -> None:
        """Ping the transport and the state store once, at the same time, each bounded by
        :data:`PROBE_TIMEOUT`; the answers replace the previous ones together."""
        broker = self.worker.broker
        self._probing_since = time.monotonic()
        try:
            transport, state = await asyncio.gather(
                self._ping(broker.transport.ping, _backend(broker.transport)),
                self._ping(broker.state.ping, _backend(broker.state)),
            )
        finally:
            self._probing_since = None
        self._checks = {"broker": transport, "state_store": state}

    async def probe_loop(self) -> None:
        """:meth:`probe` every :data:`PROBE_INTERVAL` seconds until cancelled."""
        while True:
            await self.probe()
            await asyncio.sleep(PROBE_INTERVAL)

    def status(self) -> tuple[bool, dict[str, Any]]:
        """``(ready, body)`` from the last probe and the fetch loops' state now."""
        worker = self.worker
        checks = {name: dict(check) for name, check in self._checks.items()}
        since = self._probing_since
        if since is not None and time.monotonic() - since > PROBE_TIMEOUT + 1.0:
            for check in checks.values():  # a PING stuck past its bound (a swallowed cancel)
                check.update(ok=False, error=f"no answer for {time.monotonic() - since:.0f} s")
        if not checks:
            checks["broker"] = {"ok": False, "error": "not probed yet"}
        loops = self._loops()
        dead = sorted(q for q, running in loops.items() if not running)
        checks["fetch_loops"] = {"ok": bool(loops) and not dead, "queues": sorted(loops)}
        if dead:
            checks["fetch_loops"]["stopped"] = dead
        failing = [name for name, check in checks.items() if not check["ok"]]
        if worker.stopping:
            failing.append("worker")
            checks["worker"] = {"ok": False, "error": "stopping"}
        ready = not failing
        body: dict[str, Any] = {
            "status": "ready" if ready else "not ready",
            "worker": worker.id,
            "instance": worker.instance,
        }
        body.update(failing=failing, checks=checks)
        return ready, body


def make_app(readiness: Readiness, registry: CollectorRegistry | None = None) -> Starlette:
    """The Starlette app: ``/health``, ``/ready`` and, given a ``registry``, ``/metrics``."""

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "alive", "worker": readiness.worker.id})

    async def ready(request: Request) -> Response:
        ok, body = readiness.status()
        return JSONResponse(body, status_code=200 if ok else 503)

    routes = [Route("/health", health), Route("/ready", ready)]
    if registry is not None:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        async def metrics(request: Request) -> Response:
            return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

        routes.append(Route("/metrics", metrics))
    return Starlette(routes=routes)


class _Server(uvicorn.Server):
    """A uvicorn server that leaves the process's signals to the worker."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install nothing: SIGTERM/SIGINT stop the worker, which stops this server."""
        yield


async def serve_health(app: Starlette, host: str, port: int) -> tuple[Any, asyncio.Task[None]]:
    """Start serving ``app`` on ``host:port`` in the running event loop; return the server
    and its task once it listens.

    Raises:
        ConfigurationError: the address cannot be bound.
    """
    sock = bind_port(host, port, "health endpoints")
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="off", log_level="warning"
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="blitzq-health")
    # uvicorn sets a flag, not an event, once it listens (a few ms).
    while not server.started and not task.done():  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    if task.done():
        sock.close()
        raise ConfigurationError(f"cannot serve health endpoints on {host}:{port}")
    return server, task


async def stop_health(server: Any, task: asyncio.Task[None]) -> None:
    """Stop a server made by :func:`serve_health` (bounded: cancelled after 5 s)."""
    server.should_exit = True
    try:
        await asyncio.wait_for(task, 5.0)
    except TimeoutError:
        task.cancel()
    except Exception:  # the server failed while serving: already logged by uvicorn
        logger.debug("health server ended with an error", exc_info=True)


__all__ = ["PROBE_INTERVAL", "PROBE_TIMEOUT", "Readiness", "make_app", "serve_health"]
