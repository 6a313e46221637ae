"""A Queue's own registration points, as built-in middleware: :class:`QueueHooks` (the
worker-lifecycle sugar) and :class:`EnqueueLists` (the enqueue filter and observer lists).

``@queue.on_startup`` / ``@queue.on_shutdown`` (:class:`Hooks`) and ``@queue.lifespan``
(:class:`~blitzq.dependencies.Lifespans`) are kept as the Queue's public lists; what runs them
is this middleware's :meth:`~blitzq.Middleware.on_worker_start` and
:meth:`~blitzq.Middleware.on_worker_stop`, which every worker (and the eager test mode) calls
through the Queue's registry (:meth:`blitzq.extensions.registry.Extensions.worker_started`),
before those of the registered middleware at start and after them at stop.

Order: at start the startup hooks, in order, then the lifespans are entered (a hook or a
lifespan raising fails the start); at stop the shutdown hooks, in order, then the lifespans are
closed (each error logged, the stop goes on).

``queue.enqueue_filters`` / ``queue.enqueue_observers`` (coroutines ``f(queue, batch)``) are
kept as the Queue's public lists too; :class:`EnqueueLists` runs them from its
:meth:`~blitzq.Middleware.before_publish` and :meth:`~blitzq.Middleware.after_publish`,
after the registered middleware's enqueue hooks
(:meth:`blitzq.extensions.registry.Extensions.before_publish`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .middleware import Middleware

if TYPE_CHECKING:
    from ..dependencies import Lifespans
    from ..seams import QueueSettings
    from .middleware import EnqueueFilter, EnqueueObserver, Outgoing, RunningWorker

logger = logging.getLogger("blitzq.worker")

Hook = Callable[[], Awaitable[None]]


class Hooks(list[Hook]):
    """Async callables a Worker awaits at start (``on_startup``) or after stopping
    (``on_shutdown``), in order. Use as a decorator (``@queue.on_startup``) or append.
    """

    def __call__(self, hook: Hook) -> Hook:
        """Register ``hook`` and return it unchanged (decorator form)."""
        self.append(hook)
        return hook


class QueueHooks(Middleware):
    """Runs a Queue's ``on_startup`` / ``on_shutdown`` hooks and enters and closes its
    lifespans, as worker-lifecycle hooks (see the module docstring).

    Args:
        on_startup: the Queue's startup hooks (read at each start: later appends count).
        on_shutdown: its shutdown hooks (same).
        lifespans: its lifespans (``queue.lifespan``).
    """

    def __init__(self, on_startup: Hooks, on_shutdown: Hooks, lifespans: Lifespans) -> None:
        self.on_startup = on_startup
        self.on_shutdown = on_shutdown
        self.lifespans = lifespans

    async def on_worker_start(self, worker: RunningWorker) -> None:
        """Await each startup hook, then enter the lifespans into ``worker.resources``.

        Raises:
            Exception: what a startup hook or a lifespan raised (the worker does not start).
        """
        for hook in self.on_startup:
            await hook()
        await worker.resources.open(self.lifespans)

    async def on_worker_stop(self, worker: RunningWorker) -> None:
        """Await each shutdown hook, then close the lifespans; errors are logged."""
        for hook in self.on_shutdown:
            try:
                await hook()
            except Exception:
                logger.exception("shutdown hook failed")
        try:
            await worker.resources.close()
        except Exception:
            logger.exception("a lifespan failed while closing")


class EnqueueLists(Middleware):
    """Runs a Queue's ``enqueue_filters`` before each batch is published and its
    ``enqueue_observers`` after (see the module docstring); both lists are read at each
    batch, so later appends count.

    Args:
        filters: the Queue's enqueue filters.
        observers: its enqueue observers.
    """

    def __init__(self, filters: list[EnqueueFilter], observers: list[EnqueueObserver]) -> None:
        self.filters = filters
        self.observers = observers

    async def before_publish(self, queue: QueueSettings, batch: list[Outgoing]) -> None:
        """Await each filter with the batch, in order.

        Raises:
            Exception: what a filter raised (the batch is refused).
        """
        for check in self.filters:
            await check(queue, batch)

    async def after_publish(self, queue: QueueSettings, batch: list[Outgoing]) -> None:
        """Await each observer with the published batch, in order."""
        for observer in self.observers:
            await observer(queue, batch)


__all__ = ["EnqueueLists", "Hook", "Hooks", "QueueHooks"]
