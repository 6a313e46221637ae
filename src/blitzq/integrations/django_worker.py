"""``blitzq worker --django``: run the tasks of Django's tasks framework on a blitzq worker.

:func:`django_queue` sets Django up (``DJANGO_SETTINGS_MODULE``), takes the Queue of the
:class:`~blitzq.integrations.django_tasks.BlitzqTaskBackend` in ``TASKS`` and gives it a task
registry, :class:`DjangoTasks`, that registers a blitzq task for each Django task the first
time a message names it: the name is the task's dotted module path, which is imported then,
so the worker needs no list of task modules. Only an attribute that is a Django ``Task`` of
a blitzq backend, at exactly that path, is run; any other name is dead-lettered as an
unknown task (importing the module runs its top level: the broker must be trusted, as
with the framework's own database backend, which imports task paths the same way).

Each run calls the task's function (a coroutine function on the worker's event loop, a plain
one in its thread pool) between two ``django.db.close_old_connections()`` calls, as Django
does around a request, and sends the framework's ``task_started`` / ``task_finished``
signals. A task with ``takes_context`` gets a ``TaskContext`` whose ``attempt`` is blitzq's.
The return value is normalized to JSON data as the framework does (a value that is not
JSON data fails the task). A Django task is not retried (``retries=0``): the framework has no
retries; a failure ends it ``FAILED``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections
from django.utils import timezone
from django.utils.module_loading import import_string

from ..context import current_task
from ..exceptions import ConfigurationError
from ..queue import Queue
from ..task import Task
from ..worker.identity import default_worker_id, new_instance
from . import django_tasks as fw

logger = logging.getLogger("blitzq.django")

#: The ``BACKEND`` paths of blitzq's task backend (the same class).
BACKEND_PATHS = frozenset(
    {
        "blitzq.integrations.django.BlitzqTaskBackend",
        "blitzq.integrations.django_tasks.BlitzqTaskBackend",
    }
)
#: A dotted module path of a function (``app.tasks.send_mail``).
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


class DjangoTasks(dict[str, Task[Any, Any]]):
    """A Queue's task registry that registers Django tasks on first use, by name.

    Args:
        queue: the Queue its tasks are registered on.
        worker_id: id of the worker running them (in a ``TaskContext``).

    Attributes:
        refused: names that are not Django tasks of a blitzq backend (looked up once).
    """

    def __init__(self, queue: Queue, worker_id: str) -> None:
        super().__init__()
        self.queue = queue
        self.worker_id = worker_id
        self.refused: set[str] = set()

    def get(self, name: str, default: Any = None) -> Any:
        """The task registered as ``name``, registering the Django task at that dotted path
        first if there is one; else ``default``."""
        found = super().get(name)
        if found is None and name not in self.refused:
            found = self.register(name)
        return default if found is None else found

    def register(self, name: str) -> Task[Any, Any] | None:
        """Import the Django task at dotted path ``name`` and register a blitzq task running
        it; ``None`` (and ``name`` added to :attr:`refused`) when it is not one."""
        django_task = self._import(name)
        if django_task is None:
            self.refused.add(name)
            return None
        if iscoroutinefunction(django_task.func):

            async def run_async(*args: Any, **kwargs: Any) -> Any:
                return await arun(django_task, args, kwargs, self.worker_id)

            function: Any = run_async
        else:

            def run_sync(*args: Any, **kwargs: Any) -> Any:
                return run(django_task, args, kwargs, self.worker_id)

            function = run_sync
        register = self.queue.task(name=name, queue=django_task.queue_name, retries=0)
        return register(function)

    def _import(self, name: str) -> Any:
        if not _DOTTED.fullmatch(name):
            return None
        try:
            found = import_string(name)
        except Exception as exc:
            logger.warning("cannot import Django task %s: %s: %s", name, type(exc).__name__, exc)
            return None
        if not isinstance(found, fw.DjangoTask) or found.module_path != name:
            logger.warning("%s is not a Django task (a @task function)", name)
            return None
        if not isinstance(found.get_backend(), fw.BlitzqTaskBackend):
            logger.warning("Django task %s does not use a blitzq backend", name)
            return None
        return found


def _running(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], worker_id: str) -> Any:
    """The framework's ``TaskResult`` of the run in progress (``RUNNING``)."""
    ctx = current_task()
    attempt = ctx.attempt if ctx is not None else 1
    now = timezone.now()
    return fw.TaskResult(
        task=task,
        id=ctx.id if ctx is not None else "",
        status=fw.TaskResultStatus.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=list(args),
        kwargs=dict(kwargs),
        backend=task.backend,
        errors=[],
        worker_ids=[""] * (attempt - 1) + [worker_id],
    )


def _finished(result: Any, error: BaseException | None) -> None:
    """Mark ``result`` finished (``SUCCESSFUL``, or ``FAILED`` with ``error``) and send
    ``task_finished``."""
    object.__setattr__(result, "finished_at", timezone.now())
    status = fw.TaskResultStatus.SUCCESSFUL if error is None else fw.TaskResultStatus.FAILED
    object.__setattr__(result, "status", status)
    sender = fw.BlitzqTaskBackend
    fw.signals.task_finished.send(sender, task_result=result)


def run(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], worker_id: str) -> Any:
    """Run the sync function of Django ``task`` (in a worker thread); return its value as
    JSON data.

    Raises:
        Exception: whatever the function raises; ``TypeError`` for a return value that is
            not JSON data.
    """
    close_old_connections()
    result = _running(task, args, kwargs, worker_id)
    fw.signals.task_started.send(fw.BlitzqTaskBackend, task_result=result)
    try:
        if task.takes_context:
            value = task.func(fw.TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.func(*args, **kwargs)
        value = fw.normalize_json(value)
    except BaseException as exc:
        _finished(result, exc)
        raise
    finally:
        close_old_connections()
    _finished(result, None)
    return value


async def arun(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any], worker_id: str) -> Any:
    """:func:`run` for a coroutine function (awaited on the worker's loop; the connection
    checks run in Django's thread for sync code)."""
    await sync_to_async(close_old_connections)()
    result = _running(task, args, kwargs, worker_id)
    fw.signals.task_started.send(fw.BlitzqTaskBackend, task_result=result)
    try:
        if task.takes_context:
            value = await task.func(fw.TaskContext(task_result=result), *args, **kwargs)
        else:
            value = await task.func(*args, **kwargs)
        value = fw.normalize_json(value)
    except BaseException as exc:
        _finished(result, exc)
        raise
    finally:
        await sync_to_async(close_old_connections)()
    _finished(result, None)
    return value


def _backend_alias() -> str:
    """The ``TASKS`` alias to serve: ``BLITZQ_DJANGO_BACKEND``, else ``default`` when it is a
    blitzq backend, else the only blitzq backend."""
    wanted = os.environ.get("BLITZQ_DJANGO_BACKEND")
    if wanted:
        return wanted
    configured: dict[str, Any] = fw.framework.task_backends.settings
    aliases = [a for a, p in configured.items() if p.get("BACKEND") in BACKEND_PATHS]
    if "default" in aliases or not aliases:
        return "default"
    if len(aliases) > 1:
        raise ConfigurationError(
            f"TASKS has several blitzq backends ({', '.join(aliases)}): choose one with "
            "BLITZQ_DJANGO_BACKEND=<alias>"
        )
    return aliases[0]


def django_queue(queues_given: bool = False) -> tuple[Queue, list[str] | None, str]:
    """Set Django up and return the Queue a ``--django`` worker runs, the queues it consumes
    by default (the backend's ``QUEUES``), and the worker's id.

    Args:
        queues_given: the queues to consume are named on the command line (``-Q``).

    Raises:
        ConfigurationError: ``DJANGO_SETTINGS_MODULE`` is not set, Django fails to set up,
            the backend alias is not a blitzq backend, or its ``QUEUES`` is empty (any queue
            allowed) and no queue is named.
    """
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        raise ConfigurationError("--django needs DJANGO_SETTINGS_MODULE (your project's settings)")
    cwd = os.getcwd()
    if cwd not in sys.path:  # as manage.py: the project is importable from where it runs
        sys.path.insert(0, cwd)
    import django

    try:
        django.setup()
        alias = _backend_alias()
        backend = fw.framework.task_backends[alias]
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigurationError(f"--django: {type(exc).__name__}: {exc}") from None
    if not isinstance(backend, fw.BlitzqTaskBackend):
        raise ConfigurationError(
            f"TASKS[{alias!r}] is {type(backend).__name__}, not "
            "blitzq.integrations.django.BlitzqTaskBackend"
        )
    if not backend.queues and not queues_given:
        raise ConfigurationError(
            f"TASKS[{alias!r}] allows any queue (QUEUES is empty): name the queues with -Q"
        )
    worker_id = default_worker_id(new_instance())  # host:pid-slot under the supervisor
    queue: Queue = backend.queue
    queue.tasks = DjangoTasks(queue, worker_id)
    return queue, sorted(backend.queues) or None, worker_id


__all__ = ["DjangoTasks", "arun", "django_queue", "run"]
