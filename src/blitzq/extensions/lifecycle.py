"""The worker-lifecycle sugar of a Queue, as a built-in middleware: :class:`QueueHooks`.

``@queue.on_startup`` / ``@queue.on_shutdown`` (:class:`Hooks`) and ``@queue.lifespan``
(:class:`~blitzq.dependencies.Lifespans`) are kept as the Queue's public lists; what runs them
is this middleware's :meth:`~blitzq.Middleware.on_worker_start` and
:meth:`~blitzq.Middleware.on_worker_stop`, which every worker (and the eager test mode) calls
through the Queue's registry (:meth:`blitzq.extensions.registry.Extensions.worker_started`),
before those of the registered middleware at start and after them at stop.

Order: at start the startup hooks, in order, then the lifespans are entered (a hook or a
lifespan raising fails the start); at stop the shutdown hooks, in order, then the lifespans are
closed (each error logged, the stop goes on).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from .middleware import Middleware

if TYPE_CHECKING:
    from ..dependencies import Lifespans
    from .middleware import RunningWorker

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


__all__ = ["Hook", "Hooks", "QueueHooks"]
