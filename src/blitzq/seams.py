"""The narrow view of a :class:`~blitzq.Queue` that the layers below it are given.

A task (``task.owner``), a built-in middleware, an enqueue filter and the workflow engine see
their Queue as a :class:`QueueSettings`: its settings and the broker of the running event loop,
nothing else. The clients (:mod:`blitzq.client`) see a little more, the task registry and the
enqueue hooks (:class:`blitzq.client.context.QueueContext`). Both are protocols: the Queue is
what is passed, but no module below ``blitzq.queue`` names the Queue class, so the import graph
(type-only imports included) has no circle through it (tests/unit/test_layout.py).

This module imports nothing of blitzq at run time; it is a leaf of the import graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .broker import Broker
    from .ratelimit import RateLimit
    from .routing import Routes


class QueueSettings(Protocol):
    """What a task, a middleware and an enqueue filter read of their Queue (see
    :class:`blitzq.Queue` for each setting; sizes in bytes, times in seconds).

    Attributes:
        name: the default queue name.
        namespace: the key prefix.
        mode: ``"reliable"`` or ``"fast"``.
        visibility_timeout: seconds a delivery may go without a lease renewal.
        max_deliveries: deliveries of one message before it is dead-lettered.
        store_results: the default for storing return values.
        result_ttl: seconds a record is kept.
        max_message_size: largest encoded message.
        max_result_size: largest encoded record.
        track_state: whether records follow each step of a task's life.
        routes: the queue routes of tasks whose decorator names no queue.
        queue_rate_limits: rate limit per queue name.
        enqueue_filters: coroutines that see each batch before it is published (typed in
            :class:`blitzq.client.context.QueueContext`).
    """

    name: str
    namespace: str
    mode: Any
    visibility_timeout: float
    max_deliveries: int
    store_results: bool
    result_ttl: int
    max_message_size: int
    max_result_size: int
    track_state: bool
    routes: Routes | None
    queue_rate_limits: dict[str, RateLimit]
    enqueue_filters: list[Any]

    @property
    def broker(self) -> Broker:
        """The broker of the running event loop (made on first use in each loop)."""
        ...


__all__ = ["QueueSettings"]
