"""Dishka: tasks take dependencies from a Dishka container through ``FromDishka[T]``.

The app makes its container as with any other Dishka integration and hands it, with its
Queue, to :func:`setup_dishka`; a task then marks the parameters the worker fills with
Dishka's own marker::

    from dishka import Provider, Scope, make_async_container, provide
    from blitzq.integrations.dishka import BlitzqProvider, FromDishka, setup_dishka

    class AppProvider(Provider):
        pool = provide(create_pool, scope=Scope.APP)           # once per worker
        repo = provide(OrderRepository, scope=Scope.REQUEST)   # once per task run

    container = make_async_container(AppProvider(), BlitzqProvider())
    setup_dishka(container, queue)

    @queue.task
    async def charge(order_id: str, repo: FromDishka[OrderRepository]) -> None:
        await repo.mark_paid(order_id)

No ``@inject`` decorator is needed: every task of the Queue is looked at once, when it is
registered (or at ``setup_dishka`` for those registered before), and its ``FromDishka``
parameters become parameters the worker fills (:func:`blitzq.dependencies.provide`).

Per run, a before-execute middleware hook opens a child container of the next scope
(``REQUEST``), with the run's :class:`~blitzq.TaskContext` in its context (provided by
:class:`BlitzqProvider`), and resolves the parameters from it on the worker's event loop --
so ``thread`` tasks get them too. The after-hooks close it when the run ends, however it
ends (success, failure, timeout, cancellation, being put back on the queue at shutdown):
its generator providers are finalized then. Objects of the ``APP`` scope live as long as
the worker: the middleware's ``on_worker_stop`` closes the container when the worker stops
(the last one, when several workers of one process share it). Everything is the one
middleware: its ``setup_task`` (which hands the parameters to the worker through
:func:`blitzq.dependencies.provide`), its execution hooks and its worker-lifecycle hooks.
A task of the Queue without ``FromDishka`` parameters opens no container.

Refused early (:class:`~blitzq.ConfigurationError`): a ``FromDishka`` parameter on a
``process`` task (at registration, or at ``setup_dishka`` for a task registered before), a
value given for one at enqueue, a second ``setup_dishka`` on one Queue. A dependency Dishka
cannot build fails the attempt (the retry policy applies), as a before-execute hook that
raises does.

Follows the pattern of Dishka's own integrations (``setup_dishka(container, app)``, a
request scope per unit of work, dependencies marked with ``FromDishka``). Needs the
``dishka`` extra.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

try:
    from dishka import AsyncContainer, FromDishka, Provider, Scope, from_context
    from dishka.integrations.base import default_parse_dependency
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        "blitzq.integrations.dishka needs dishka: pip install dishka (or install blitzq from "
        "its checkout with the extra: pip install -e '.[dishka]')"
    ) from exc

from ..context import TaskContext
from ..dependencies import Provided, provide
from ..exceptions import ConfigurationError
from ..extensions.middleware import Middleware, RunningWorker
from ..options import TaskOptions
from ..queue import Queue
from ..task import Task


class BlitzqProvider(Provider):
    """A Dishka provider of the current run's :class:`~blitzq.TaskContext` (``REQUEST``
    scope): add it to ``make_async_container(...)`` to let providers depend on the run (its
    id, attempt, headers)."""

    context = from_context(provides=TaskContext, scope=Scope.REQUEST)


def dishka_parameters(fn: Any) -> dict[str, Any]:
    """The parameters of ``fn`` marked ``FromDishka[T]``: name → Dishka dependency key (its
    type and component).

    Raises:
        ConfigurationError: ``fn``'s annotations cannot be resolved while one of them names
            ``FromDishka``.
    """
    signature = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        if "FromDishka" not in repr(signature):
            return {}
        raise ConfigurationError(
            f"{getattr(fn, '__qualname__', fn)!r}: the annotations of its FromDishka "
            f"parameters cannot be resolved: {exc}"
        ) from exc
    out = {}
    for name, param in signature.parameters.items():
        key = default_parse_dependency(param, hints.get(name, Any))
        if key is not None:
            out[name] = key
    return out


class _FromRun(Provided):
    """The value of one ``FromDishka`` parameter: what the middleware resolved for the run."""

    __slots__ = ("runs",)

    def __init__(self, runs: dict[int, tuple[AsyncContainer, dict[str, Any]]]) -> None:
        self.runs = runs

    def value(self, name: str, context: TaskContext | None) -> Any:
        run = self.runs.get(id(context))
        if run is None:
            raise ConfigurationError(
                f"FromDishka parameter {name!r} has no value: the run's Dishka scope is not "
                "open (only a worker of the Queue given to setup_dishka fills it)"
            )
        return run[1][name]


class DishkaMiddleware(Middleware):
    """Opens a Dishka request scope around each run of a task with ``FromDishka``
    parameters, resolves them, and closes it when the run ends (module docstring).

    Made and registered by :func:`setup_dishka`.

    Args:
        container: the app's root container (``make_async_container(...)``).
    """

    def __init__(self, container: AsyncContainer) -> None:
        self.container = container
        #: task name → its FromDishka parameters (name → dependency key).
        self.parameters: dict[str, dict[str, Any]] = {}
        #: id of a running task's TaskContext → its request container and resolved values.
        self.runs: dict[int, tuple[AsyncContainer, dict[str, Any]]] = {}
        self._source = _FromRun(self.runs)
        self._workers = 0

    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        """Make ``task``'s ``FromDishka`` parameters parameters the worker fills.

        Raises:
            ConfigurationError: a ``process`` task with such parameters.
        """
        keys = dishka_parameters(task.fn)
        if keys:
            provide(task, dict.fromkeys(keys, self._source))
            self.parameters[task.name] = keys

    async def before_execute(self, context: TaskContext) -> None:
        """Open the run's request scope and resolve its parameters (a dependency that
        cannot be built fails the attempt; the scope is closed again first)."""
        keys = self.parameters.get(context.task)
        if not keys:
            return
        request = await self.container(context={TaskContext: context}).__aenter__()
        try:
            values = {
                name: await request.get(key.type_hint, component=key.component)
                for name, key in keys.items()
            }
        except BaseException as exc:
            await request.close(exc if isinstance(exc, Exception) else None)
            raise
        self.runs[id(context)] = (request, values)

    async def after_execute(self, context: TaskContext, result: Any) -> None:
        """Close the run's request scope."""
        await self._close(context, None)

    async def on_error(self, context: TaskContext, exc: BaseException) -> None:
        """Close the run's request scope (its generator providers see ``exc``)."""
        await self._close(context, exc if isinstance(exc, Exception) else None)

    async def _close(self, context: TaskContext, exc: Exception | None) -> None:
        run = self.runs.pop(id(context), None)
        if run is not None:
            await run[0].close(exc)

    async def on_worker_start(self, worker: RunningWorker) -> None:
        """Count the worker, and offer the container to its ``Depends()`` parameters of
        type ``AsyncContainer``."""
        self._workers += 1
        worker.resources.values.append(self.container)

    async def on_worker_stop(self, worker: RunningWorker) -> None:
        """When the last worker of the process stops, close the request scopes still open
        and then the container (finalizing its ``APP`` objects)."""
        self._workers -= 1
        if self._workers == 0:
            while self.runs:
                _, (request, _values) = self.runs.popitem()
                await request.close()
            await self.container.close()


def setup_dishka(container: AsyncContainer, queue: Queue) -> DishkaMiddleware:
    """Let ``queue``'s tasks take ``FromDishka[T]`` parameters from ``container`` (module
    docstring): registers a :class:`DishkaMiddleware`, which also closes the container at
    worker shutdown. Call it once, where the Queue is made (producers import
    it too: they refuse values given for such parameters).

    Args:
        container: the app's root ``AsyncContainer`` (``make_async_container(...)``).
        queue: the Queue.

    Returns:
        The registered middleware.

    Raises:
        TypeError: ``container`` is not a Dishka ``AsyncContainer``.
        ConfigurationError: a ``process`` task already registered has ``FromDishka``
            parameters, or ``queue`` was already set up.
    """
    if not isinstance(container, AsyncContainer):
        raise TypeError(
            f"setup_dishka needs the AsyncContainer of make_async_container(...), got {container!r}"
        )
    if any(isinstance(m, DishkaMiddleware) for m in queue.middleware):
        raise ConfigurationError("setup_dishka was already called for this Queue")
    for task in queue.tasks.values():  # refused before anything is registered on the Queue
        if task.executor in ("process", "cpu") and dishka_parameters(task.fn):
            raise ConfigurationError(
                f"task {task.name}: a {task.executor} task cannot take its FromDishka parameters "
                "(filled by the worker in its own process); use an async or thread task"
            )
    middleware = DishkaMiddleware(container)
    queue.add_middleware(middleware)
    return middleware


__all__ = ["BlitzqProvider", "DishkaMiddleware", "FromDishka", "dishka_parameters", "setup_dishka"]
