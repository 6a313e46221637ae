"""The operations options of ``blitzq worker``: metrics and health ports, their address, and
whether the CLI configures logging (docs/operations.md, "Metrics", "Health", "Logs")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def ops_options(command: F) -> F:
    """Add ``--metrics-port``, ``--health-port``, ``--ops-host`` and
    ``--configure-logging/--no-configure-logging`` to a click command."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


_OPTIONS = [
    click.option(
        "--metrics-port",
        type=click.IntRange(min=0, max=65535),
        default=None,
        envvar="BLITZQ_METRICS_PORT",
        show_envvar=True,
        metavar="PORT",
        help="Serve Prometheus metrics on /metrics at this port (with --workers N: one port per "
        "worker process, PORT + its slot index 0..N-1). Needs blitzq[metrics].",
    ),
    click.option(
        "--health-port",
        type=click.IntRange(min=0, max=65535),
        default=None,
        envvar="BLITZQ_HEALTH_PORT",
        show_envvar=True,
        metavar="PORT",
        help="Serve /health and /ready at this port (with --workers N: PORT + slot index); the "
        "metrics port may be the same. Needs blitzq[ops].",
    ),
    click.option(
        "--ops-host",
        default="0.0.0.0",
        show_default=True,
        metavar="HOST",
        help="Address the metrics and health endpoints listen on.",
    ),
    click.option(
        "--configure-logging/--no-configure-logging",
        "configure_logs",
        default=True,
        show_default=True,
        help="Install blitzq's stderr log handler on the root logger; --no-configure-logging "
        "leaves logging to the application.",
    ),
]


def ops_argv(
    metrics_port: int | None, health_port: int | None, host: str, configure_logs: bool
) -> list[str]:
    """The metrics, health and logging options as a supervisor passes them to its workers
    (each worker adds its slot index to the ports, :func:`~blitzq.worker.ops.slot_port`)."""
    argv = [] if configure_logs else ["--no-configure-logging"]
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    if health_port is not None:
        argv += ["--health-port", str(health_port)]
    if metrics_port is not None or health_port is not None:
        argv += ["--ops-host", host]
    return argv


__all__ = ["ops_argv", "ops_options"]
