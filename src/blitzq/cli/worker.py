"""``blitzq worker MODULE:ATTR``: import the application's Queue and run a Worker for it."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import logging
import os
import sys
import threading
from typing import Any

import click

from ..exceptions import BlitzQError, BrokerError, ConfigurationError
from ..logconfig import configure_logging
from ..queue import Queue
from ..routing import check_name, check_queue_name
from ..worker import Worker
from ..worker.deferral import OutageBackoff
from ..worker.heartbeat import start_beating
from ..worker.ports import slot_port
from ..worker.worker import EXIT_RESTART
from ._common import (
    EXIT_CONFIG,
    EXIT_USAGE,
    CliConfigError,
    CliUsageError,
    Seconds,
    Settings,
    amqp_of,
    cli_errors,
    emit_json,
    global_options,
    log_options,
    mask_url,
    settings,
)
from ._logging import logging_options, logging_settings
from ._worker_options import deferral_argv, log_levels, ops_argv, ops_options
from .process_control import (
    app_queue,
    needs_supervisor,
    option_conflicts,
    process_control_options,
    supervisor_arguments,
    worker_arguments,
)

logger = logging.getLogger("blitzq.cli")

#: Environment variables a Queue reads as defaults, per global option.
_ENV = {
    "redis_url": "BLITZQ_REDIS_URL",
    "amqp_url": "BLITZQ_AMQP_URL",
    "namespace": "BLITZQ_NAMESPACE",
    "mode": "BLITZQ_MODE",
}


_usage = CliUsageError
#: An application or ``--configure`` that cannot be loaded: a configuration error (exit 78).
_config = CliConfigError


def _parse_app(spec: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``MODULE:ATTR``, the current directory put first on
    ``sys.path``.

    Raises:
        CliError: (exit code 78) a malformed spec or one that looks like a file path.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise _config(f"expected MODULE:ATTR (for example myapp.tasks:queue), got {spec!r}")
    if module_name.endswith(".py") or "/" in module_name:
        raise _config(
            f"{module_name!r} looks like a file path: give the module name (myapp.tasks, not "
            "myapp/tasks.py), importable from the current directory"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    return module_name, attr


def precheck_app(spec: str) -> None:
    """What the supervisor checks of ``MODULE:ATTR`` before it starts worker processes,
    without importing anything: the spec's form and that its top-level package exists. An
    error found only on import (in a worker) ends the worker, and so the supervisor, with
    exit code 78 too.

    Raises:
        CliError: (exit code 78) a malformed spec, or no such top-level module.
    """
    module_name, attr = _parse_app(spec)
    top = module_name.partition(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise _config(
            f"cannot import module {module_name!r}: no such module in {os.getcwd()} or on sys.path"
        )
    kind = _defined_as(found, module_name, attr.partition(".")[0])
    if kind is not None:
        raise _config(f"{spec} is a {kind}, not a blitzq.Queue")


def _defined_as(top: Any, module_name: str, name: str) -> str | None:
    """What the module's source (read, never imported) makes ``name`` when it is plainly not
    a Queue: ``"Task"`` for a function decorated with ``.task`` (``@queue.task``), else
    ``"function"`` or ``"class"`` for a top-level ``def``/``class`` never re-assigned; ``None``
    when the source cannot tell (not found, not Python source, assigned, or unknown)."""
    import ast

    parts = module_name.split(".")
    roots = list(top.submodule_search_locations or ()) if len(parts) > 1 else []
    if len(parts) == 1:
        path = top.origin
    else:
        path = None
        for root in roots:
            base = os.path.join(root, *parts[1:])
            for candidate in (base + ".py", os.path.join(base, "__init__.py")):
                if os.path.isfile(candidate):
                    path = candidate
                    break
            if path:
                break
    if not path or not str(path).endswith(".py"):
        return None
    try:
        with open(path, encoding="utf-8") as source:
            tree = ast.parse(source.read())
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    kind: str | None = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name != name:
                continue
            called = [ast.unparse(d).split("(")[0].rpartition(".")[2] for d in node.decorator_list]
            if "task" in called:
                kind = "Task"
            elif called:
                kind = None  # another decorator may return anything
            else:
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            kind = None if name in names else kind
        elif isinstance(node, ast.Import | ast.ImportFrom) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            kind = None
    return kind


def load_queue(spec: str) -> Queue:
    """Import ``MODULE:ATTR`` (the current directory first on ``sys.path``), return the Queue.

    ``ATTR`` may be dotted (``app:tasks.queue``).

    Raises:
        CliError: (exit code 78, ``EX_CONFIG``) a malformed spec, a module that cannot be
            imported or fails while importing, a missing attribute, or an attribute that is
            not a Queue.
    """
    module_name, attr = _parse_app(spec)
    cwd = os.getcwd()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise _config(
                f"cannot import module {module_name!r}: no such module in {cwd} or on sys.path"
            ) from None
        logger.debug("importing %s failed", module_name, exc_info=True)
        raise _config(f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:
        logger.debug("importing %s failed", module_name, exc_info=True)
        raise _config(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc} "
            "(--log-level debug shows the traceback)"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _config(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Queue):
        raise _config(f"{spec} is a {type(obj).__name__}, not a blitzq.Queue")
    return obj


def configure_queue(queue: Queue, spec: str) -> None:
    """Import ``MODULE:CALLABLE`` and call it with ``queue`` (``--configure``): a place to
    register middleware and signal handlers without a custom entry point.

    Raises:
        CliError: (exit code 78, ``EX_CONFIG``) a malformed spec, an import that fails, a
            missing or non-callable attribute, a coroutine function, or a callable that raises.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise _config(f"--configure expects MODULE:CALLABLE (myapp.setup:configure), got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:
        raise _config(f"--configure {spec}: {type(exc).__name__}: {exc}") from None
    if not callable(obj) or inspect.iscoroutinefunction(obj):
        raise _config(f"--configure {spec}: expected a plain function taking the Queue")
    try:
        obj(queue)
    except Exception as exc:
        logger.debug("--configure %s failed", spec, exc_info=True)
        raise _config(f"--configure {spec} failed: {type(exc).__name__}: {exc}") from None


def _export_settings(s: Settings) -> None:
    """Put the global options that apply to the command into the environment a Queue reads
    its defaults from, before the application's module makes its Queue: typed ones, and those
    of the command's own variable (``BLITZQ_WORKER_REDIS_URL``) or table
    (``[tool.blitzq.worker] redis_url``), which win over ``BLITZQ_REDIS_URL`` and the plain
    key. What the module passes its Queue still wins over all but a typed option
    (:func:`_override`)."""
    for name, env in _ENV.items():
        value = getattr(s, name)
        if value is not None:
            os.environ[env] = value


def _override(queue: Queue, s: Settings) -> None:
    """Command-line options win over what the application module passed to its Queue."""
    if "namespace" in s.from_command_line and s.namespace is not None:
        queue.namespace = check_name("namespace", s.namespace)
    if "mode" in s.from_command_line and s.mode in ("reliable", "fast"):
        queue.mode = "fast" if s.mode == "fast" else "reliable"
    if "redis_url" in s.from_command_line and s.redis_url is not None:
        if queue._shared_broker is not None:
            raise _usage("--redis-url cannot apply: the application's Queue was given a broker")
        queue._connect_to(s.redis_url)
    if "amqp_url" in s.from_command_line and s.amqp_url is not None:
        if queue._shared_broker is not None:
            raise _usage("--amqp-url cannot apply: the application's Queue was given a broker")
        queue._amqp_url = s.amqp_url
        queue._amqp_injected = None  # the URL given wins over an injected connection


def _split_queues(value: str | None) -> list[str] | None:
    if value is None:
        return None
    names = [name.strip() for name in value.split(",") if name.strip()]
    for name in names:
        try:  # the rule enqueue applies: a priority level ("default:high") is refused
            check_queue_name("queue name", name)
        except ConfigurationError as exc:
            raise _usage(f"--queues: {exc}") from None
    if not names:
        raise _usage("--queues needs at least one queue name")
    return names


def _startup(worker: Worker, url: str) -> None:
    queue = worker.queue
    doc = {
        "event": "worker_started",
        "worker": worker.id,
        "queues": worker.queues,
        "concurrency": worker.concurrency,
        "mode": queue.mode,
        "namespace": queue.namespace,
        "broker": mask_url(url),
        "amqp": amqp_of(queue),
        "pid": os.getpid(),
    }
    if settings().json:
        emit_json(doc)
        return
    click.echo(
        click.style(f"blitzq worker {worker.id}", bold=True)
        + f" queues={','.join(worker.queues)} concurrency={worker.concurrency}"
        f" mode={queue.mode} namespace={queue.namespace} broker={mask_url(url)}"
        + (f" amqp={doc['amqp']}" if doc["amqp"] else "")
    )


#: Seconds between two tries of a supervised worker waiting for its broker at start: the
#: first, and the longest (doubling in between).
BROKER_WAIT = (0.5, 30.0)


async def _reach_broker(worker: Worker, patient: bool) -> None:
    """Ping the worker's broker; a supervised (``patient``) worker whose broker is not there
    yet waits for it, retrying with backoff (logged; no crash, so no restart is spent).

    Raises:
        BrokerError: the broker does not answer and the worker is not ``patient``.
        ConfigurationError: the broker cannot be configured, or it refused the URL's
            password, user or database number (``BrokerRefusedSettings``): never retried.
    """
    delay, longest = BROKER_WAIT
    while True:
        try:
            await worker.queue.broker.ping()
            return
        except ConfigurationError:  # a refused password or DB number: no wait can cure it
            raise
        except BrokerError as exc:
            if not patient:
                raise
            logger.warning(
                "broker not reachable yet (%s): waiting for it, next try in %.1f s", exc, delay
            )
        await asyncio.sleep(delay)
        delay = min(delay * 2, longest)


async def _serve(worker: Worker, with_scheduler: bool = False, patient: bool = False) -> None:
    queue = worker.queue
    beating = start_beating()  # the supervisor's heartbeat, from this loop
    try:
        await _reach_broker(worker, patient)
        _startup(worker, queue.url)
        if not with_scheduler:
            await worker.run()
            return
        from ..scheduler import Scheduler

        scheduler = Scheduler(queue)
        scheduling = asyncio.create_task(scheduler.run(), name="blitzq-scheduler")
        try:
            await worker.run()
        finally:
            scheduler.stop()
            await scheduling
    finally:
        if beating is not None:
            beating.cancel()
        with contextlib.suppress(BlitzQError):
            await queue.close()


@click.command("worker", short_help="Run a worker for the Queue at MODULE:ATTR.")
@click.argument("app", metavar="MODULE:ATTR", required=False)
@click.option(
    "-Q",
    "--queues",
    metavar="Q1,Q2",
    help="Queues to consume, comma-separated. Default: the Queue's name and its tasks' queues.",
)
@click.option(
    "-c",
    "--concurrency",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Tasks running at once in this process.",
)
@click.option(
    "--shutdown-timeout",
    type=Seconds(minimum=0.0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="On SIGTERM/SIGINT, wait this long for running tasks, then requeue.",
)
@click.option(
    "--max-abandoned-threads",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Sync-task threads past their hard timeout and still running that the worker "
    f"tolerates; one more and it stops gracefully and exits {EXIT_RESTART} to be restarted. "
    "Such a thread keeps its slot until it returns: the worker exits the same way once they "
    "hold all its slots.",
)
@log_options
@click.option(
    "--scheduler",
    "with_scheduler",
    is_flag=True,
    default=False,
    help="Also run a scheduler (periodic tasks) in this process; stopped with the worker.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    envvar="BLITZQ_WORKERS",
    show_envvar=True,
    help="Worker processes, run and restarted by a supervisor (see --no-supervise).",
)
@click.option(
    "--configure",
    "configure",
    metavar="MODULE:CALLABLE",
    multiple=True,
    help="Call CALLABLE(queue) after loading the app, to register middleware and signal "
    "handlers (repeatable, applied in order).",
)
@click.option(
    "--strict-memory-policy",
    is_flag=True,
    default=False,
    envvar="BLITZQ_STRICT_MEMORY_POLICY",
    show_envvar=True,
    help="Refuse to start when the server's maxmemory-policy can evict blitzq's keys "
    "(default: log a warning).",
)
@process_control_options
@ops_options
@logging_options
@global_options
def worker_command(
    app: str | None,
    queues: str | None,
    concurrency: int,
    shutdown_timeout: float,
    log_level: str,
    log_format: str,
    with_scheduler: bool,
    workers: int,
    configure: tuple[str, ...] = (),
    max_abandoned_threads: int = 10,
    strict_memory_policy: bool = False,
    burst: bool = False,
    burst_idle_timeout: float = 0.0,
    unknown_task_grace: float = 300.0,
    defer_base_delay: float = 1.0,
    defer_max_delay: float = 60.0,
    start_check_timeout: float = 10.0,
    metrics_port: int | None = None,
    health_port: int | None = None,
    ops_host: str = "0.0.0.0",
    configure_logs: bool = True,
    django: bool = False,
    **control: Any,
) -> None:
    """Run a worker for the blitzq.Queue at MODULE:ATTR (for example myapp.tasks:queue).

    The module is imported with the current directory on sys.path. The worker stops
    gracefully on SIGTERM or SIGINT (exit code 0): it stops fetching, waits up to
    --shutdown-timeout for running tasks and puts the rest back on their queues.

    The command supervises its worker processes (also one): it restarts a crashed worker or
    one whose heartbeat stopped, and a configuration error ends it with exit code 78.
    --no-supervise (for systemd or Kubernetes) and --burst run the worker in this process.
    SIGHUP to the supervisor reloads the workers gracefully. With --django
    instead of MODULE:ATTR (and DJANGO_SETTINGS_MODULE set) it runs the tasks of Django's
    tasks framework whose TASKS backend is blitzq's.

    `blitzq worker list` shows the live workers; `blitzq worker shutdown ID` stops one.
    """
    s = settings()
    if configure_logs:
        with cli_errors(s.redis_url, config_exit=EXIT_CONFIG):
            configure_logging(
                log_level, "json" if log_format == "json" else "text", **logging_settings(control)
            )
    if bool(app) == django:
        both = "not both" if django else "for example myapp.tasks:queue"
        raise _usage(f"give MODULE:ATTR or --django (Django's tasks framework), {both}")
    deferral = (defer_base_delay, defer_max_delay, start_check_timeout)
    # options that contradict each other: a usage error, 2
    with cli_errors(s.redis_url, config_exit=EXIT_USAGE):
        OutageBackoff.checked(*deferral)  # before any worker process starts
    ops = ops_argv(metrics_port, health_port, ops_host, configure_logs, control)
    ops += deferral_argv(*deferral)
    if conflict := option_conflicts(workers, control, burst, burst_idle_timeout):
        raise CliUsageError(conflict)
    if needs_supervisor(workers, control, burst):  # it runs copies of this command, --workers 1
        if app:
            precheck_app(app)  # the common mistakes exit 78 here, once, not in every worker
        elif not os.environ.get("DJANGO_SETTINGS_MODULE"):
            raise _config("--django needs DJANGO_SETTINGS_MODULE (your project's settings)")
        from ..worker.launch import supervise
        from ..worker.processes import worker_command

        typed = {n: getattr(s, n) if n in s.from_command_line else None for n in _ENV}
        argv = worker_command(
            app or "--django",  # the APP slot carries the flag: `worker --django --workers 1`
            queues=queues,
            concurrency=concurrency,
            shutdown_timeout=shutdown_timeout,
            log_level=log_level,
            log_format=log_format,
            json_output=s.json,
            extra=(["--scheduler"] if with_scheduler else [])
            + (["--strict-memory-policy"] if strict_memory_policy else [])
            + [arg for spec in configure for arg in ("--configure", spec)]
            + ["--max-abandoned-threads", str(max_abandoned_threads)]
            + ["--unknown-task-grace", repr(unknown_task_grace)]
            + worker_arguments(control)
            + ops,
            **typed,
        )
        # --reload with --django watches the package of the settings module.
        watched = app or os.environ.get("DJANGO_SETTINGS_MODULE", "")
        workers, more = supervisor_arguments(
            watched, workers, _split_queues(queues), control, lambda: app_queue(app, s, queues)
        )
        sys.exit(supervise(argv, workers, shutdown_timeout, json_output=s.json, **more))
    _export_settings(s)
    default_queues, worker_name = None, None
    if django:  # blitzq.integrations.django_worker: the Queue of the TASKS backend
        from ..integrations.django_worker import django_queue

        with cli_errors(s.redis_url, config_exit=EXIT_CONFIG):
            queue, default_queues, worker_name = django_queue(queues is not None)
    else:
        queue = load_queue(app or "")
    _override(queue, s)
    for spec in configure:
        configure_queue(queue, spec)
    with cli_errors(queue._redis_url or s.redis_url, config_exit=EXIT_CONFIG):
        worker = Worker(
            queue,
            queues=_split_queues(queues) or default_queues,
            concurrency=concurrency,
            shutdown_timeout=shutdown_timeout,
            handle_signals=True,
            max_abandoned_threads=max_abandoned_threads,
            strict_memory_policy=strict_memory_policy,
            max_tasks_per_child=control.get("max_tasks_per_child"),
            max_memory_per_child=control.get("max_memory_per_child"),
            pool=control.get("pool", "thread"),
            cpu_processes=control.get("cpu_processes"),
            cpu_max_tasks=control.get("cpu_max_tasks"),
            cpu_max_memory=control.get("cpu_max_memory"),
            burst=burst,
            burst_idle_timeout=burst_idle_timeout,
            unknown_task_grace=unknown_task_grace,
            defer_base_delay=defer_base_delay,
            defer_max_delay=defer_max_delay,
            start_check_timeout=start_check_timeout,
            metrics_port=slot_port(metrics_port),
            health_port=slot_port(health_port),
            ops_host=ops_host,
            name=worker_name,
            **log_levels(control),
        )
        asyncio.run(_serve(worker, with_scheduler, patient=bool(control.get("supervised"))))
    # A worker that stopped to be restarted (too many abandoned threads, recycling: 75; its
    # CPU pool's forkserver refused: 71) says so.
    code = worker.exit_code if worker.restart_requested else 0
    _exit_past_abandoned_threads(code)
    if code:
        sys.exit(code)


def _exit_past_abandoned_threads(code: int = 0) -> None:
    """Exit now, with ``code``, if a non-daemon thread outlived the shutdown timeout (a
    thread cannot be interrupted, and the interpreter would otherwise wait for it at exit)."""
    main = threading.main_thread()
    if any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate()):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
