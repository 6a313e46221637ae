"""The process-control options of ``blitzq worker``: ``--autoscale``, ``--max-tasks-per-child``,
``--max-memory-per-child`` and ``--reload`` (docs/supervisor.md).

:func:`process_control_options` adds them to the command; the command hands what they asked
for to :func:`needs_supervisor`, :func:`worker_arguments` (what each supervised worker gets)
and :func:`supervisor_arguments` (what the supervisor does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from ..exceptions import ConfigurationError
from ..worker.autoscale import HARD_CAP, AutoscaleSettings, parse_range
from ._common import CliUsageError, Seconds, Settings

F = TypeVar("F", bound=Callable[..., Any])

#: Names of the options :func:`process_control_options` adds (the command's keyword arguments).
NAMES = (
    "autoscale",
    "autoscale_interval",
    "autoscale_cooldown",
    "autoscale_idle",
    "autoscale_min_age",
    "autoscale_backlog",
    "autoscale_latency",
    "max_tasks_per_child",
    "max_memory_per_child",
    "reload",
    "supervised",
)


def process_control_options(fn: F) -> F:
    """Decorate ``blitzq worker`` with the process-control options (see :data:`NAMES`)."""
    seconds = Seconds(minimum=0.0, maximum=86400.0)
    options = [
        click.option(
            "--autoscale",
            metavar="MIN,MAX",
            envvar="BLITZQ_AUTOSCALE",
            show_envvar=True,
            help="Run between MIN and MAX worker processes, added on queue backlog or latency "
            f"and removed when idle (at most {HARD_CAP}); `blitzq control scale` changes the "
            "bounds at run time. Needs --redis-url or BLITZQ_REDIS_URL.",
        ),
        click.option(
            "--autoscale-interval",
            type=Seconds(minimum=0.05, maximum=3600.0),
            default=1.0,
            show_default=True,
            metavar="SECONDS",
            help="Seconds between two samples of the queues (and of the setpoint).",
        ),
        click.option(
            "--autoscale-cooldown",
            type=seconds,
            default=10.0,
            show_default=True,
            metavar="SECONDS",
            help="Least seconds between two autoscale changes.",
        ),
        click.option(
            "--autoscale-idle",
            type=seconds,
            default=30.0,
            show_default=True,
            metavar="SECONDS",
            help="Seconds a worker process must have run no task before it is removed.",
        ),
        click.option(
            "--autoscale-min-age",
            type=seconds,
            default=30.0,
            show_default=True,
            metavar="SECONDS",
            help="Least age of a worker process that may be removed.",
        ),
        click.option(
            "--autoscale-backlog",
            type=click.IntRange(min=1),
            default=10,
            metavar="N",
            show_default=True,
            help="Messages waiting per worker process above which one is added.",
        ),
        click.option(
            "--autoscale-latency",
            type=seconds,
            default=5.0,
            show_default=True,
            metavar="SECONDS",
            help="Age of the oldest waiting message above which a process is added "
            "(reliable mode).",
        ),
        click.option(
            "--max-tasks-per-child",
            type=click.IntRange(min=1),
            default=None,
            metavar="N",
            help="Recycle a worker process gracefully after N tasks (and a process-pool "
            "child after N calls).",
        ),
        click.option(
            "--max-memory-per-child",
            type=click.IntRange(min=1),
            default=None,
            metavar="MB",
            help="Recycle a worker process gracefully past MB megabytes of resident memory "
            "(and replace its process pool when a child is past it). Linux.",
        ),
        click.option(
            "--reload",
            is_flag=True,
            default=False,
            help="Reload the workers gracefully when a .py file under the application's "
            "directory changes (development; needs blitzq[reload]).",
        ),
        click.option("--supervised", is_flag=True, default=False, hidden=True),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def needs_supervisor(workers: int, control: Mapping[str, Any]) -> bool:
    """Whether the command runs a supervisor rather than the worker itself."""
    if control.get("supervised"):
        return False
    wanted = ("autoscale", "reload", "max_tasks_per_child", "max_memory_per_child")
    return workers > 1 or any(control.get(name) for name in wanted)


def worker_arguments(control: Mapping[str, Any]) -> list[str]:
    """Options for the command line of each supervised worker."""
    argv = ["--supervised"]
    for name in ("max_tasks_per_child", "max_memory_per_child"):
        if control.get(name) is not None:
            argv += ["--" + name.replace("_", "-"), str(control[name])]
    return argv


def supervisor_arguments(
    app: str, workers: int, queues: list[str] | None, s: Settings, control: Mapping[str, Any]
) -> tuple[int, dict[str, Any]]:
    """The worker count and the keyword arguments of
    :func:`~blitzq.worker.launch.supervise` for the options given.

    Raises:
        CliUsageError: a malformed ``--autoscale``, one without a broker URL, or a
            ``--reload`` that cannot watch the application.
    """
    kwargs: dict[str, Any] = {}
    try:
        if control.get("autoscale"):
            low, high = parse_range(control["autoscale"])
            if not s.redis_url:
                raise CliUsageError(
                    "--autoscale needs --redis-url or BLITZQ_REDIS_URL: the supervisor reads "
                    "the queues without importing the application"
                )
            kwargs["autoscale"] = AutoscaleSettings(
                low,
                high,
                interval=control["autoscale_interval"],
                cooldown=control["autoscale_cooldown"],
                idle=control["autoscale_idle"],
                min_age=control["autoscale_min_age"],
                backlog=control["autoscale_backlog"],
                latency=control["autoscale_latency"],
            )
            kwargs.update(redis_url=s.redis_url, namespace=s.namespace, mode=s.mode, queues=queues)
            workers = min(max(workers, low), high)  # --workers: the starting count
        if control.get("reload"):
            from ..worker.reload import SourceWatcher, app_directory

            kwargs["watch"] = directory = app_directory(app)
            SourceWatcher(directory, lambda paths: None)  # fails early without watchfiles
    except ConfigurationError as exc:
        raise CliUsageError(str(exc)) from None
    return workers, kwargs
