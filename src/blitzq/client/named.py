"""Enqueue by name: the options of a by-name call and ``queue.send_many``, a batch mixing
tasks by name (see :class:`~blitzq.client.publish.Producer`, whose ``send`` and ``send_many``
use them).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ..exceptions import ConfigurationError, SerializationError, itemized
from ..extensions import builtin_middleware
from ..extensions.middleware import Outgoing
from ..options import call_options, declared_call_options
from ..routing import ID_BLOCK, check_task_name, new_task_ids, physical_queue, route
from ..serialization import encode_wire_envelope
from ..task import CallOptions, Task, TaskHandle

if TYPE_CHECKING:
    from ..serialization import Envelope
    from .context import QueueContext


class Producer(Protocol):
    """What the by-name calls use of their :class:`~blitzq.client.publish.Producer` (which
    calls them; named here by this protocol, so the two modules import in one direction)."""

    @property
    def queue(self) -> QueueContext:
        """The Queue, as its clients see it."""
        ...

    def fresh_ids(self, count: int) -> list[str] | None:
        """Generated ids for a batch, or ``None`` (see the producer's)."""
        ...

    def envelope(
        self,
        task: str,
        queue: str,
        args: Any,
        kwargs: Any,
        opts: CallOptions,
        now: float,
        fresh_id: str | None = None,
    ) -> Envelope:
        """The envelope of one call (see the producer's)."""
        ...

    def stores_result(self, task: Task[Any, Any] | None) -> bool | None:
        """Whether ``task`` stores its return value (``None``: unknown task)."""
        ...

    async def publish(
        self, outgoing: list[Outgoing], explicit: frozenset[str] = frozenset()
    ) -> None:
        """Publish a batch (see the producer's)."""
        ...


def named_options(
    producer: Producer, what: str, name: Any, args: Any, kwargs: Any, options: Mapping[str, Any]
) -> CallOptions:
    """The options of one by-name call, the registered task's queue and priority filling in
    what ``options`` leaves out (``what``: the method named in errors).

    Raises:
        ConfigurationError: a name :func:`~blitzq.routing.check_task_name` refuses, args
            that are not a tuple or list, kwargs that are not a mapping, an unknown option or
            an invalid value.
    """
    try:
        check_task_name(name)  # the rule @queue.task(name=...) applies
    except ConfigurationError as exc:
        raise ConfigurationError(f"{what}: {exc}") from None
    if not isinstance(args, tuple | list):
        raise ConfigurationError(f"{what}: args must be a tuple or list, got {args!r}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"{what}: kwargs must be a dict, got {kwargs!r}")
    queue = producer.queue
    registered = queue.tasks.get(name)
    if registered is None:  # a task of another process: any middleware's option
        declared = declared_call_options((*builtin_middleware(), *queue.middleware))
        return call_options(options, None, declared)
    opts = call_options(options, None, registered.call_controls)
    return dataclasses.replace(
        opts,
        queue=opts.queue or registered.queue,
        priority=opts.priority or registered.priority,
    )


async def send_many(producer: Producer, items: Iterable[Sequence[Any]]) -> list[TaskHandle[Any]]:
    """:meth:`Producer.send_many <blitzq.client.publish.Producer.send_many>` (its docstring
    says what it takes, returns and raises)."""
    owner = producer.queue
    if isinstance(items, str | bytes | Mapping):
        raise ConfigurationError(f"send_many takes a list of items, got {items!r}")
    now = time.time()
    batch: list[Outgoing] = []
    explicit: dict[str, int] = {}  # an item's given task_id -> its index
    items = list(items)
    block = min(len(items), ID_BLOCK)
    fresh = producer.fresh_ids(block) if block else None  # None: the broker makes each
    for index, item in enumerate(items):
        what = f"send_many item {index}"
        if not isinstance(item, tuple | list) or len(item) not in (3, 4):
            raise ConfigurationError(
                f"{what}: expected (name, args, kwargs[, options]), got {item!r}"
            )
        name, args, kwargs = item[0], item[1], item[2]
        extra = item[3] if len(item) == 4 else {}
        if not isinstance(extra, Mapping):
            raise ConfigurationError(f"{what}: options must be a dict, got {extra!r}")
        try:
            opts = named_options(producer, what, name, args, kwargs, extra)
        except ConfigurationError as exc:
            raise itemized(exc, what) from None
        queue = physical_queue(
            opts.queue or route(owner.routes, name) or owner.name, opts.priority or "normal"
        )
        fresh_id = None
        if fresh is not None and opts.task_id is None:
            if not fresh:
                fresh = new_task_ids(block)
            fresh_id = fresh.pop()
        env = producer.envelope(name, queue, tuple(args), dict(kwargs or {}), opts, now, fresh_id)
        if opts.task_id is not None:
            first = explicit.setdefault(env.id, index)
            if first != index:
                raise ConfigurationError(
                    f"send_many items {first} and {index}: the same task_id {env.id!r}"
                )
        try:
            data = encode_wire_envelope(env, owner.max_message_size)
        except SerializationError as exc:  # MessageTooLarge among them
            raise itemized(exc, what) from None
        registered = owner.tasks.get(name)
        batch.append(
            Outgoing(env, data, opts.due_time(now), registered, delay=opts.relative_delay())
        )
    if batch:
        await producer.publish(batch, frozenset(explicit))
    return [
        TaskHandle(
            owner,
            o.existing_id or o.envelope.id,
            o.envelope.queue,
            o.envelope.task,
            duplicate=o.existing_id is not None,
            stores_result=producer.stores_result(o.task),
        )
        for o in batch
    ]


__all__ = ["named_options", "send_many"]
