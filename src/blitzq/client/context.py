"""What a client of a :class:`~blitzq.Queue` is given: :class:`QueueContext`.

The clients (:mod:`blitzq.client.publish`, ``results``, ``admin``, ``workflows``) and the
handles they make read the Queue through this protocol: its settings and the broker of the
running event loop (:class:`~blitzq.seams.QueueSettings`), its task registry, its enqueue
hooks, its sync-API loop and its results client. The Queue is what is passed, but no client
names the Queue class (no import circle, type-only imports included: tests/unit/test_layout.py),
and a client reaches nothing of it beyond these members (mypy checks every access).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from ..seams import QueueSettings

if TYPE_CHECKING:
    from ..extensions.middleware import EnqueueFilter, EnqueueObserver, Middleware
    from ..extensions.signals import Signals
    from ..handle import ResultReader
    from ..task import Task
    from .sync import Portal


class QueueContext(QueueSettings, Protocol):
    """A Queue as its clients see it (see :class:`~blitzq.seams.QueueSettings` for the
    settings).

    Attributes:
        tasks: the registered tasks, by name.
        enqueue_filters: coroutines that see each batch before it is published.
        enqueue_observers: coroutines called with what was published.
        _portal: the sync-API loop (what every ``*_sync`` twin runs on).
    """

    tasks: dict[str, Task[Any, Any]]
    enqueue_filters: list[EnqueueFilter]
    enqueue_observers: list[EnqueueObserver]
    _portal: Portal

    @property
    def url(self) -> str:
        """The broker URL in use (:attr:`blitzq.Queue.url`)."""
        ...

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """The middleware registered on the Queue, in registration order."""
        ...

    @property
    def signals(self) -> Signals:
        """Where the Queue's signals are emitted: the observers of each, its middleware's
        ``on_signal`` hooks then its ``queue.on`` handlers (:mod:`blitzq.extensions.signals`)."""
        ...

    @property
    def _results(self) -> ResultReader:
        """The results client (what a :class:`~blitzq.TaskHandle` reads through)."""
        ...


__all__ = ["QueueContext"]
