"""The process-control options of ``blitzq worker``: ``--autoscale``, ``--max-processes``,
``--group``, ``--max-tasks-per-child``, ``--max-memory-per-child``, ``--pool`` and the
``--cpu-*`` options of the CPU pool, ``--reload``, ``--watch-dir``, ``--no-supervise``,
``--heartbeat-timeout``, ``--max-restarts`` and ``--restart-window`` (docs/supervisor.md).

:func:`process_control_options` adds them to the command; the command hands what they asked
for to :func:`needs_supervisor`, :func:`worker_arguments` (what each supervised worker gets)
and :func:`supervisor_arguments` (what the supervisor does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .._checks import byte_size
from ..exceptions import BlitzQError, ConfigurationError
from ..redaction import mask_url
from ..worker.autoscale import HARD_CAP, AutoscaleSettings, check_group, parse_range
from ._common import CliUsageError, Seconds, Settings, cli_errors

if TYPE_CHECKING:
    from ..queue import Queue

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
    "max_processes",
    "group",
    "max_tasks_per_child",
    "max_memory_per_child",
    "reload",
    "watch_dir",
    "supervise",
    "heartbeat_timeout",
    "max_restarts",
    "restart_window",
    "supervised",
    "pool",
    "cpu_processes",
    "cpu_max_tasks",
    "cpu_max_memory",
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
            "bounds at run time. The supervisor samples the broker, namespace and mode of "
            "the application's Queue (command-line options winning).",
            callback=_autoscale_range,
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
            "--max-processes",
            "max_processes",
            type=click.IntRange(min=1, max=HARD_CAP),
            default=None,
            metavar="N",
            help="Headroom of the control channel: the most worker processes a setpoint of "
            "`blitzq control scale` may ask this supervisor for (a setpoint above it is "
            "rejected, with the reason in `blitzq control status`). Without --autoscale, "
            "the supervisor runs --workers processes until a setpoint changes them. Default "
            f"with --autoscale: {HARD_CAP}.",
        ),
        click.option(
            "--group",
            "group",
            metavar="LABEL",
            default=None,
            callback=_group_label,
            help="Control group of this supervisor: it reads the setpoint of `blitzq control "
            "scale --group LABEL` instead of the namespace's (with --autoscale or "
            "--max-processes).",
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
            "directory changes (development; needs the reload extra: pip install -e "
            "'.[reload]' in the checkout).",
        ),
        click.option(
            "--watch-dir",
            "watch_dir",
            multiple=True,
            type=click.Path(exists=True, file_okay=False, path_type=Path),
            metavar="DIR",
            help="With --reload: also watch DIR for .py changes (repeatable).",
        ),
        click.option(
            "--supervise/--no-supervise",
            "supervise",
            default=True,
            show_default=True,
            envvar="BLITZQ_SUPERVISE",
            show_envvar=True,
            help="Run the worker processes under a supervisor that restarts them (also with "
            "one process). --no-supervise runs the worker in this process, for a process "
            "manager that restarts it itself (systemd, Kubernetes); --burst always does.",
        ),
        click.option(
            "--heartbeat-timeout",
            type=Seconds(minimum=0.0, maximum=86400.0),
            default=30.0,
            show_default=True,
            metavar="SECONDS",
            envvar="BLITZQ_HEARTBEAT_TIMEOUT",
            show_envvar=True,
            help="Replace a supervised worker whose event loop sent no heartbeat for this "
            "long (a stopped process, a blocking call in async code); 0: never.",
        ),
        click.option(
            "--max-restarts",
            type=click.IntRange(min=0),
            default=5,
            show_default=True,
            metavar="N",
            envvar="BLITZQ_MAX_RESTARTS",
            show_envvar=True,
            help="Crash restarts of one worker slot allowed within --restart-window; one more "
            "and the supervisor gives up on the slot. Only the deaths of workers that made no "
            "progress (no task completion written yet, no suspect run alone) count: a worker "
            "that got a task done is restarted uncounted, and the count starts over.",
        ),
        click.option(
            "--restart-window",
            type=Seconds(minimum=1.0, maximum=7 * 86400.0),
            default=3600.0,
            show_default=True,
            metavar="SECONDS",
            envvar="BLITZQ_RESTART_WINDOW",
            show_envvar=True,
            help="The rolling window of --max-restarts.",
        ),
        click.option("--supervised", is_flag=True, default=False, hidden=True),
        click.option(
            "--pool",
            type=click.Choice(["thread", "cpu"]),
            default="thread",
            show_default=True,
            envvar="BLITZQ_POOL",
            show_envvar=True,
            help="Where sync tasks left on their default executor run: threads of the worker, "
            "or the CPU pool (child processes forked from a pre-warmed forkserver, killed "
            "alone at a hard timeout or cancel; POSIX). executor='cpu' on a task picks it "
            "for that task.",
        ),
        click.option(
            "--cpu-processes",
            type=click.IntRange(min=1),
            default=None,
            metavar="N",
            envvar="BLITZQ_CPU_PROCESSES",
            show_envvar=True,
            help="Children of the CPU pool: CPU-pool calls running at once. Default: CPU count.",
        ),
        click.option(
            "--cpu-max-tasks",
            type=click.IntRange(min=1),
            default=None,
            metavar="N",
            envvar="BLITZQ_CPU_MAX_TASKS",
            show_envvar=True,
            help="Replace a CPU-pool child after N calls.",
        ),
        click.option(
            "--cpu-max-memory",
            default=None,
            metavar="SIZE",
            envvar="BLITZQ_CPU_MAX_MEMORY",
            show_envvar=True,
            callback=_byte_size,
            help="Replace a CPU-pool child whose resident memory is past SIZE after a call "
            "(512MiB, 200MB, 1G; a bare number is bytes). Linux.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _autoscale_range(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> tuple[int, int] | None:
    """``--autoscale`` parsed and checked as the command line is read (before anything)."""
    if not value:
        return None
    try:
        return parse_range(value)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc).removeprefix("--autoscale "), ctx, param) from None


def _group_label(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--group`` checked as the command line is read."""
    if value is None:
        return None
    reason = check_group(value)
    if reason is not None:
        raise click.BadParameter(reason, ctx, param)
    return value


def _byte_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """``--cpu-max-memory`` parsed to bytes as the command line is read (a usage error)."""
    if value is None:
        return None
    try:
        return byte_size("--cpu-max-memory", value)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def burst_conflicts(workers: int, control: Mapping[str, Any]) -> list[str]:
    """The options given with ``--burst`` that need a supervisor (``--burst`` runs one worker
    process): ``--workers N`` (N > 1), ``--autoscale``, ``--reload``, ``--max-*-per-child``."""
    given = [f"--workers {workers}"] if workers > 1 else []
    names = ("autoscale", "max_processes", "reload", "max_tasks_per_child", "max_memory_per_child")
    for name in names:
        if control.get(name):
            given.append("--" + name.replace("_", "-"))
    return given


def option_conflicts(
    workers: int, control: Mapping[str, Any], burst: bool, burst_idle_timeout: float
) -> str | None:
    """Why the options given cannot go together (a usage error), or ``None``: ``--burst``
    with options that need a supervisor (:func:`burst_conflicts`), ``--burst-idle-timeout``
    without ``--burst``, ``--watch-dir`` without ``--reload``."""
    if burst and (conflicts := burst_conflicts(workers, control)):
        return f"--burst runs one worker process: not with {', '.join(conflicts)}"
    if not control.get("supervise", True) and (conflicts := burst_conflicts(workers, control)):
        return f"--no-supervise runs one worker in this process: not with {', '.join(conflicts)}"
    if burst_idle_timeout and not burst:
        return "--burst-idle-timeout applies to --burst only: give --burst too"
    if control.get("watch_dir") and not control.get("reload"):
        return "--watch-dir applies to --reload only: give --reload too"
    if control.get("group") and not (control.get("autoscale") or control.get("max_processes")):
        return (
            "--group applies to a supervisor that reads a setpoint: give --autoscale or "
            "--max-processes too"
        )
    headroom = control.get("max_processes")
    if headroom:
        top = control["autoscale"][1] if control.get("autoscale") else workers
        if top > headroom:
            what = (
                f"--autoscale maximum {top}" if control.get("autoscale") else f"--workers {workers}"
            )
            return f"--max-processes {headroom} is below the {what}"
    return None


def needs_supervisor(workers: int, control: Mapping[str, Any], burst: bool = False) -> bool:
    """Whether the command runs a supervisor rather than the worker itself: always, unless
    it is a supervised worker already, ``--no-supervise`` was given or ``--burst`` (a burst
    worker exits when the queues are drained; there is nothing to restart)."""
    if control.get("supervised") or burst:
        return False
    return bool(control.get("supervise", True)) or workers > 1


def worker_arguments(control: Mapping[str, Any]) -> list[str]:
    """Options for the command line of each supervised worker."""
    argv = ["--supervised"]
    names = ("max_tasks_per_child", "max_memory_per_child", "cpu_processes", "cpu_max_tasks")
    for name in (*names, "cpu_max_memory"):
        if control.get(name) is not None:
            argv += ["--" + name.replace("_", "-"), str(control[name])]
    if control.get("pool", "thread") != "thread":
        argv += ["--pool", control["pool"]]
    return argv


def supervisor_arguments(
    app: str,
    workers: int,
    queues: list[str] | None,
    control: Mapping[str, Any],
    app_queue: Callable[[], Queue],
) -> tuple[int, dict[str, Any]]:
    """The worker count and the keyword arguments of
    :func:`~blitzq.worker.launch.supervise` for the options given.

    ``app_queue`` returns the Queue the workers will build, command-line options applied;
    with ``--autoscale`` it is called (the application imported in the supervisor) to read
    the broker URL, namespace and mode the autoscaler samples (:func:`autoscale_target`).

    Raises:
        CliUsageError: an ``--autoscale`` without a broker the supervisor can sample, an
            application that cannot be loaded, or a ``--reload`` that cannot watch it.
    """
    kwargs: dict[str, Any] = {
        "max_restarts": control.get("max_restarts", 5),
        "restart_window": control.get("restart_window", 3600.0),
        "heartbeat_timeout": control.get("heartbeat_timeout", 30.0) or None,
    }
    try:
        if control.get("autoscale") or control.get("max_processes"):
            # parsed by _autoscale_range; --max-processes alone: the fixed --workers count,
            # until a setpoint changes it
            low, high = control.get("autoscale") or (workers, workers)
            kwargs.update(autoscale_target(app_queue()), queues=queues)
            kwargs["autoscale"] = AutoscaleSettings(
                low,
                high,
                headroom=control.get("max_processes") or HARD_CAP,
                group=control.get("group"),
                interval=control["autoscale_interval"],
                cooldown=control["autoscale_cooldown"],
                idle=control["autoscale_idle"],
                min_age=control["autoscale_min_age"],
                backlog=control["autoscale_backlog"],
                latency=control["autoscale_latency"],
            )
            workers = min(max(workers, low), high)  # --workers: the starting count
        if control.get("reload"):
            from ..worker.reload import SourceWatcher, app_directory

            extra = [d.resolve() for d in control.get("watch_dir", ())]
            kwargs["watch"] = directories = [app_directory(app), *extra]
            SourceWatcher(directories, lambda paths: None)  # fails early without watchfiles
    except ConfigurationError as exc:
        raise CliUsageError(str(exc)) from None
    return workers, kwargs


def app_queue(app: str | None, s: Settings, queues: str | None = None) -> Queue:
    """The Queue a worker of ``blitzq worker`` builds: the one at ``app`` (``MODULE:ATTR``)
    or, with ``app=None`` (``--django``), the Django backend's; the command-line options of
    ``s`` applied as the worker applies them. What ``--autoscale`` samples.

    ``queues``: the command's ``-Q`` value (``None``: not given; ``--django`` then needs the
    backend's ``QUEUES``).

    Raises:
        CliError: (exit code 2) the application cannot be loaded (see
            :func:`~blitzq.cli.worker.load_queue` and
            :func:`~blitzq.integrations.django_worker.django_queue`).
    """
    from .worker import _export_settings, _override, load_queue  # (import cycle)

    _export_settings(s)
    if app is None:
        from ..integrations.django_worker import django_queue

        with cli_errors(s.redis_url):
            queue = django_queue(queues is not None)[0]
    else:
        queue = load_queue(app)
    _override(queue, s)
    return queue


def autoscale_target(queue: Queue) -> dict[str, Any]:
    """``redis_url``, ``namespace`` and ``mode`` for the autoscaler's sampler: those of the
    workers' ``queue`` (its URL resolved as a worker resolves it: the Queue's own,
    ``BLITZQ_REDIS_URL``, else the embedded server, which this may start).

    Raises:
        CliUsageError: the Queue was given a ready ``broker=`` or uses an in-process
            ``memory://`` URL (no server the supervisor shares with its workers), or its URL
            cannot be resolved.
    """
    if queue._shared_broker is not None:
        raise CliUsageError(
            "--autoscale cannot sample the queues: the application's Queue was given a "
            "ready broker=, give it a redis_url (or --redis-url) instead"
        )
    try:
        url = queue.url
    except BlitzQError as exc:
        raise CliUsageError(f"--autoscale: no broker to sample the queues on: {exc}") from None
    if url.startswith("memory://"):
        raise CliUsageError(
            "--autoscale needs a Redis server its workers share, not the in-process "
            f"{mask_url(url)!r}"
        )
    return {"redis_url": url, "namespace": queue.namespace, "mode": queue.mode}
