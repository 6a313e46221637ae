"""The operations options of ``blitzq worker``: metrics and health ports, their address,
whether the CLI configures logging and the levels of failed tasks' records (docs/operations.md,
"Metrics", "Health", "Logs"), burst mode, the grace of unknown tasks, the deferral of tasks
whose start check meets a broker outage (:mod:`blitzq.worker.deferral`), and ``--django``
(Django's tasks framework)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypedDict, TypeVar

import click

from .._checks import LOG_LEVELS
from ._common import Seconds
from ._logging import logging_argv

F = TypeVar("F", bound=Callable[..., Any])


def ops_options(command: F) -> F:
    """Add ``--metrics-port``, ``--health-port``, ``--ops-host``,
    ``--configure-logging/--no-configure-logging``, ``--failure-log-level``,
    ``--retry-log-level``, ``--burst``, ``--burst-idle-timeout``, ``--unknown-task-grace``,
    ``--defer-base-delay``, ``--defer-max-delay``, ``--start-check-timeout`` and ``--django``
    to a click command (the two levels reach it in its ``**`` keyword arguments:
    :func:`log_levels`)."""
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
        "worker process, PORT + its slot index 0..N-1). Needs the metrics extra (pip install "
        "-e '.[metrics]' in the checkout).",
    ),
    click.option(
        "--health-port",
        type=click.IntRange(min=0, max=65535),
        default=None,
        envvar="BLITZQ_HEALTH_PORT",
        show_envvar=True,
        metavar="PORT",
        help="Serve /health and /ready at this port (with --workers N: PORT + slot index); the "
        "metrics port may be the same. Needs the ops extra (pip install -e '.[ops]' in the "
        "checkout).",
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
    click.option(
        "--failure-log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="error",
        show_default=True,
        help="Level of the record of a task that failed for good (with its traceback) and "
        "of a message dead-lettered without running.",
    ),
    click.option(
        "--retry-log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="warning",
        show_default=True,
        help="Level of the record of a failed attempt that will be retried.",
    ),
    click.option(
        "--log-lifecycle-level",
        "lifecycle_log_level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="debug",
        show_default=True,
        help="Level of the task received/started/succeeded records on the blitzq.task "
        "logger (debug: not shown at the default --log-level info).",
    ),
    click.option(
        "--burst",
        is_flag=True,
        default=False,
        help="Drain the queues (waiting and due scheduled messages), then exit 0 once they "
        "are empty and nothing runs.",
    ),
    click.option(
        "--burst-idle-timeout",
        type=Seconds(minimum=0.0, maximum=86400.0),
        default=0.0,
        show_default=True,
        metavar="SECONDS",
        help="With --burst: exit only once the queues have stayed drained this long (work "
        "arriving meanwhile runs and restarts the count); 0 exits when first drained.",
    ),
    click.option(
        "--unknown-task-grace",
        type=Seconds(minimum=0.0),
        default=300.0,
        show_default=True,
        metavar="SECONDS",
        help="A task this worker does not know goes back on the schedule for a worker that "
        "knows it, for this long after its enqueue; then it is dead-lettered (0: at once).",
    ),
    click.option(
        "--defer-base-delay",
        type=Seconds(minimum=0.001),
        default=1.0,
        show_default=True,
        metavar="SECONDS",
        help="A task whose start check (rate limit, lock) cannot reach the broker goes back on "
        "the schedule for this long, doubling with each deferral in a row (+-20 % jitter), "
        "without spending an attempt.",
    ),
    click.option(
        "--defer-max-delay",
        type=Seconds(minimum=0.001),
        default=60.0,
        show_default=True,
        metavar="SECONDS",
        help="Longest deferral of a task whose start check cannot reach the broker.",
    ),
    click.option(
        "--start-check-timeout",
        type=Seconds(minimum=0.001),
        default=10.0,
        show_default=True,
        metavar="SECONDS",
        help="A start check that takes longer counts as a broker outage (the task is deferred).",
    ),
    click.option(
        "--django",
        "django",
        is_flag=True,
        default=False,
        help="Run the tasks of Django's tasks framework (TASKS with the blitzq backend; needs "
        "DJANGO_SETTINGS_MODULE) instead of MODULE:ATTR.",
    ),
]


class LogLevels(TypedDict):
    """The levels of failed tasks' records and of the lifecycle records, as
    :class:`~blitzq.Worker` takes them."""

    failure_log_level: str
    retry_log_level: str
    lifecycle_log_level: str


def log_levels(options: Mapping[str, Any]) -> LogLevels:
    """``failure_log_level``, ``retry_log_level`` and ``lifecycle_log_level`` of the
    command's keyword arguments
    ``options`` (their defaults when absent)."""
    return LogLevels(
        failure_log_level=str(options.get("failure_log_level") or "error"),
        retry_log_level=str(options.get("retry_log_level") or "warning"),
        lifecycle_log_level=str(options.get("lifecycle_log_level") or "debug"),
    )


def deferral_argv(base: float, ceiling: float, timeout: float) -> list[str]:
    """``--defer-base-delay``, ``--defer-max-delay`` and ``--start-check-timeout`` as a
    supervisor passes them to its workers."""
    argv = ["--defer-base-delay", repr(base), "--defer-max-delay", repr(ceiling)]
    return [*argv, "--start-check-timeout", repr(timeout)]


def ops_argv(
    metrics_port: int | None,
    health_port: int | None,
    host: str,
    configure_logs: bool,
    options: Mapping[str, Any] | None = None,
) -> list[str]:
    """The metrics, health and logging options as a supervisor passes them to its workers
    (each worker adds its slot index to the ports, :func:`~blitzq.worker.ports.slot_port`);
    ``options``: the command's other keyword arguments (the log levels, :func:`log_levels`)."""
    argv = [] if configure_logs else ["--no-configure-logging"]
    levels = log_levels(options or {})
    argv += ["--failure-log-level", levels["failure_log_level"]]
    argv += ["--retry-log-level", levels["retry_log_level"]]
    argv += ["--log-lifecycle-level", levels["lifecycle_log_level"]]
    argv += logging_argv(options or {})
    if metrics_port is not None:
        argv += ["--metrics-port", str(metrics_port)]
    if health_port is not None:
        argv += ["--health-port", str(health_port)]
    if metrics_port is not None or health_port is not None:
        argv += ["--ops-host", host]
    return argv


__all__ = ["LogLevels", "deferral_argv", "log_levels", "ops_argv", "ops_options"]
