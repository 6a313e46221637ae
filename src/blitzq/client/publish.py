"""The producer side of a :class:`~blitzq.Queue`: envelopes, filters, publishing, ``send``.

A :class:`Producer` belongs to one Queue and reads its configuration (default queue, routes,
limits, filters and observers) from it, so changes to the Queue's settings apply at once. A
single ``enqueue`` of a known queue with no filters is one broker round-trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence, Sized
from os import urandom
from typing import TYPE_CHECKING, Any

from .. import records
from ..broker import Completion, Scheduled
from ..broker.state import UniqueSend
from ..context import current_task
from ..exceptions import (
    BrokerError,
    ConfigurationError,
    SerializationError,
    itemized,
    unknown_outcome,
)
from ..extensions.middleware import Outgoing
from ..limits import CHUNK_WRITES
from ..options import Option, call_options
from ..routing import ID_BLOCK, ID_CHARS, ID_LENGTH, new_task_ids, physical_queue, route
from ..serialization import Envelope, encode_wire_envelope, plain_args, plain_kwargs, to_plain
from ..task import _NO_OPTIONS, CallOptions, Task, TaskHandle
from . import testmode
from .named import named_options, send_many

if TYPE_CHECKING:
    from ..extensions.registry import Extensions
    from .context import QueueContext
    from .sync import Portal


logger = logging.getLogger("blitzq.broker")

#: :attr:`Producer._task_ids` before the broker was asked.
_UNKNOWN: Any = object()


def item_options(
    options: CallOptions, extra: Mapping[str, Any], declared: Mapping[str, Option] | None = None
) -> CallOptions:
    """The options of one ``enqueue_many`` item: ``options`` with ``extra`` applied.

    Args:
        options: the options bound to the task (``task.options(...)``).
        extra: per-item options, any field of :class:`~blitzq.task.CallOptions` (``delay``,
            ``eta``, ``task_id``, ``headers``, ``timeout``, ``queue``, ``correlation_id``,
            ``priority``), or a per-call option ``declared`` by the task's middleware.
        declared: the task's per-call options (``task.call_controls``).

    Raises:
        ConfigurationError: an unknown option name or an invalid value.
    """
    if not isinstance(extra, Mapping):
        raise ConfigurationError(f"per-item options must be a dict, got {extra!r}")
    return call_options(extra, options, declared)


def queued_record(env: Envelope, due: float | None) -> bytes:
    """The ``queued`` record of ``env`` (``track_state``), ``due`` its due time or ``None``."""
    return records.queued(
        env.id, env.task, env.queue, env.created_at, due is not None, (env.args, env.kwargs)
    )


class Producer:
    """Builds and publishes the messages of one Queue.

    Args:
        queue: the Queue whose configuration and broker it uses.
        portal: the Queue's sync-API loop (what the ``*_sync`` twins of tasks run on).
        extensions: the Queue's middleware registry, whose enqueue hooks see every batch.

    Attributes:
        queue: that Queue.
        portal: that loop.
        known_queues: physical queues already registered with the broker by this process
            (a publish to one of them skips the registration).
    """

    def __init__(self, queue: QueueContext, portal: Portal, extensions: Extensions) -> None:
        self.queue = queue
        self.portal = portal
        self.extensions = extensions
        self.known_queues: set[str] = set()
        self._task_ids: Any = _UNKNOWN

    def _id_maker(self) -> Any:
        """The broker's maker of task ids (``Broker.task_ids``; ``None``:
        :func:`~blitzq.routing.new_task_id`'s form), kept once read: every broker of a Queue
        has the same URL, hence the same layout. Without a running loop there is no broker to
        ask: ``None`` this time, asked again next time."""
        try:
            ids = self.queue.broker.task_ids
        except RuntimeError:  # no running loop
            return None
        self._task_ids = ids
        return ids

    def fresh_ids(self, count: int) -> list[str] | None:
        """``count`` generated task ids for a batch's items without a ``task_id``
        (:func:`~blitzq.routing.new_task_ids`: one ``os.urandom`` call for all), or ``None``
        when the broker makes its own (``Broker.task_ids``): :meth:`envelope` then makes each.
        A batch that uses them up takes more from ``new_task_ids``.

        Args:
            count: how many, >= 0 (a batch's items, at most
                :data:`~blitzq.routing.ID_BLOCK`).
        """
        ids = self._task_ids
        if ids is _UNKNOWN:
            ids = self._id_maker()
        return None if ids is not None else new_task_ids(count)

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
        """The envelope of one call of ``task`` to the physical ``queue``, made at Unix time
        ``now`` (seconds); inside a running task it carries that task's correlation id and
        headers. Its id: ``opts.task_id``, else ``fresh_id`` (one of :meth:`fresh_ids`), else
        one made now.

        Raises:
            SerializationError: an argument or header is not plain data.
        """
        headers: Mapping[str, Any] | None = opts.headers
        correlation_id = opts.correlation_id
        parent = current_task()
        if parent is not None:  # enqueued from inside a task: carry its context along
            correlation_id = correlation_id or parent.correlation_id or parent.id
            if parent.headers:
                headers = {**parent.headers, **(headers or {})}
        task_id = opts.task_id or fresh_id
        if not task_id:
            ids = self._task_ids
            if ids is _UNKNOWN:
                ids = self._id_maker()
            # routing.new_task_id() inlined: 120 random bits as 24 characters a-z2-7, a
            # MessagePack fixstr. The spread layout makes its own (the queue's home in it).
            task_id = urandom(ID_LENGTH).translate(ID_CHARS).decode() if ids is None else ids(queue)
        return Envelope(
            task_id,
            task,
            queue,
            plain_args(args),
            plain_kwargs(kwargs) if kwargs else {},
            1,
            now,
            now,
            correlation_id,
            to_plain(dict(headers)) if headers else None,
            opts.timeout,
            unique_key=opts.unique_key,
            options=to_plain(dict(opts.extensions)) if opts.extensions else None,
            # An explicit id: this enqueue's mark, the owner of the id's record once sent.
            nonce=urandom(8).hex() if opts.task_id else None,
        )

    def stores_result(self, task: Task[Any, Any] | None) -> bool | None:
        """Whether ``task`` stores its return value (``None``: unknown task)."""
        if task is None:
            return None
        return self.queue.store_results if task.store_result is None else task.store_result

    async def publish(
        self, outgoing: list[Outgoing], explicit: frozenset[str] = frozenset()
    ) -> None:
        """Publish a batch: the middleware's enqueue hooks, fresh starts, state records,
        registry of queues, then the messages (a unique task's together with the claim of
        its key, in one broker step: ``Broker.enqueue_unique``; a duplicate is not
        published), then the middleware's after-publish hooks.

        ``explicit``: ids the caller chose (``task_id=``). A task published under one starts
        afresh: what an earlier task of that id left (record, cancel mark, progress) is
        forgotten first, so its handle never answers with the old outcome.

        Raises:
            EnqueueRefused: a middleware (or an enqueue filter) refused the batch; nothing is
                published.
            OutcomeUnknown: the broker stopped answering after the messages were sent
                (``.task_ids``: the batch's ids); they may have been published. Or
                (``.unreplicated``) the primary has them but its replicas did not confirm
                them within ``wait_timeout`` (``redis+sentinel://``, a Redis Cluster with
                replicas): a failover may lose them.
            BrokerError: the broker could not be reached, or failed before the messages were
                sent (nothing was published).
        """
        await self._publish(outgoing, explicit)
        await self.extensions.after_publish(
            self.queue, [o for o in outgoing if o.existing_id is None]
        )

    async def _publish(self, outgoing: list[Outgoing], explicit: frozenset[str]) -> None:
        """:meth:`publish` up to its after-publish hooks."""
        owner, extensions = self.queue, self.extensions
        await extensions.before_publish(owner, outgoing)
        batch = [o for o in outgoing if o.existing_id is None]
        items = [(o.envelope, o.data, o.due) for o in batch]
        broker = owner.broker
        # A unique task under an explicit id starts afresh in the claim's own step, only
        # when it claims its key (enqueue_unique): a retry that finds the key held by its own
        # id leaves the live task's record, cancel mark and progress alone.
        claims = (
            {o.envelope.id for o in batch if o.unique is not None and o.envelope.id in explicit}
            if explicit
            else set()
        )
        if explicit:
            fresh = [o.envelope for o in batch if o.envelope.id in explicit]
            fresh = [env for env in fresh if env.id not in claims]
            if fresh:
                await broker.reset_tasks(
                    [env.id for env in fresh],
                    {env.id: env.nonce for env in fresh if env.nonce},
                    owner.result_ttl,
                )
        if owner.track_state:  # written before publishing, so a fast worker cannot overtake it
            writes = [
                Completion(
                    env.queue,
                    None,
                    env.id,
                    queued_record(env, due),
                    owner.result_ttl,
                )
                for env, _, due in items
                if env.id not in claims
            ]
            if explicit:  # its fresh start made this enqueue the owner of the id's record
                nonces = {env.id: env.nonce for env, _, _ in items if env.id in explicit}
                for write in writes:
                    write.nonce = nonces.get(write.task_id)
            for start in range(0, len(writes), CHUNK_WRITES):  # each call stays short
                await broker.complete(writes[start : start + CHUNK_WRITES])
        # Per physical queue and path: a task declared mode="fast" goes on the fast lane.
        now_items: dict[tuple[str, bool], list[bytes]] = {}
        later: list[Scheduled] = []
        unique: list[tuple[Outgoing, tuple[str, float]]] = []
        for o in batch:
            env = o.envelope
            if o.unique is not None:  # claimed and written in one step (enqueue_unique)
                unique.append((o, o.unique))
            elif o.due is None:
                fast = o.task is not None and o.task.fast
                now_items.setdefault((env.queue, fast), []).append(o.data)
            elif o.delay is not None:  # counted on the broker's clock, not this one
                later.append(Scheduled(env.id, env.queue, o.data, delay=o.delay))
            else:
                later.append(Scheduled(env.id, env.queue, o.data, eta=o.due))
        new = [q for q, _ in now_items if q not in self.known_queues]
        if later:
            new += [s.queue for s in later if s.queue not in self.known_queues]
        if unique:
            known = self.known_queues
            new += [o.envelope.queue for o, _ in unique if o.envelope.queue not in known]
        if new:
            await broker.remember_queues(sorted(set(new)))
            self.known_queues.update(new)
        # Only the sends themselves can leave a message published without a reply: a write
        # before them that fails (a reset, a record) stops the batch before anything is sent.
        with unknown_outcome("enqueue", (o.envelope.id for o in batch)):
            for (queue, fast), messages in now_items.items():
                await (broker.publish_fast if fast else broker.publish)(queue, messages)
            if later:
                await broker.schedule(later)
            if unique:
                await self._enqueue_unique(unique, claims)

    async def _enqueue_unique(
        self, unique: list[tuple[Outgoing, tuple[str, float]]], claims: set[str]
    ) -> None:
        """Claim the keys of ``unique`` (each message with its key and the key's seconds,
        ``Outgoing.unique``) and write the messages claimed, in one broker step
        per chunk (``Broker.enqueue_unique``); mark the duplicates (``existing_id``) and
        forget the records written for them (``track_state``: they never run). ``claims``:
        the ids given explicitly, which start afresh in the claim's step (only when they
        claim their key).

        Raises:
            BrokerError: the broker failed (within :meth:`_publish`'s ``unknown_outcome``).
        """
        owner = self.queue
        broker = owner.broker
        lane = broker.fast_lane is not None
        sends = []
        for o, (key, ttl) in unique:
            env = o.envelope
            fast = lane and o.task is not None and o.task.fast
            send = UniqueSend(key, env.id, ttl, env.queue, o.data, fast)
            if o.due is not None:
                send = (
                    send._replace(delay=o.delay)
                    if o.delay is not None
                    else send._replace(eta=o.due)
                )
            if env.id in claims:  # started afresh with the claim (see _publish)
                record = queued_record(env, o.due) if owner.track_state else None
                send = send._replace(
                    nonce=env.nonce or "", record=record, record_ttl=owner.result_ttl
                )
            sends.append(send)
        holders = await broker.enqueue_unique(sends)
        duplicates = []
        for (o, _), holder in zip(unique, holders, strict=True):
            if holder is not None:
                o.existing_id = holder
                if o.envelope.id not in claims:  # an explicit id wrote nothing before it
                    duplicates.append(o.envelope.id)
        if duplicates and self.queue.track_state:
            try:  # written before the claim (so a fast worker cannot overtake it): unused
                await broker.reset_tasks(duplicates)
            except BrokerError as exc:  # they expire after result_ttl
                logger.warning("records of %d duplicate(s) left: %s", len(duplicates), exc)

    async def enqueue(
        self,
        task: Task[Any, Any] | str,
        args: Any,
        kwargs: Any,
        opts: CallOptions,
    ) -> TaskHandle[Any]:
        """Publish one call of ``task`` (a registered task, or a task name) with ``opts``.

        Raises:
            SerializationError: an argument is not plain data.
            MessageTooLarge: the encoded message is over the Queue's ``max_message_size``.
            EnqueueRefused: a filter refused it.
            OutcomeUnknown: the broker stopped answering after the message was sent
                (``.task_id``); it may have been published. Or (``.unreplicated``) the
                primary has it but its replicas did not confirm it in time: a failover may
                lose it (see :meth:`publish`).
            BrokerError: the broker could not be reached (nothing was published).
        """
        owner = self.queue
        now = time.time()
        if isinstance(task, str):
            name = task
            queue = physical_queue(
                opts.queue or route(owner.routes, name) or owner.name, opts.priority or "normal"
            )
        else:
            name = task.name
            queue = physical_queue(opts.queue or task.queue, opts.priority or task.priority)
            if task.prepared_call:
                args, kwargs = task.call_arguments(args, kwargs)
        env = self.envelope(name, queue, args, kwargs, opts, now)
        data = encode_wire_envelope(env, owner.max_message_size)
        due = opts.due_time(now) if opts is not _NO_OPTIONS else None
        registered = task if isinstance(task, Task) else owner.tasks.get(name)
        stores = self.stores_result(registered)
        if (
            due is None
            and queue in self.known_queues
            and not owner.track_state
            # No middleware would see it: none registered with enqueue hooks, and the
            # built-in ones idle (the enqueue lists empty, the test mode off).
            and not self.extensions.enqueue_hooked
            and not owner.enqueue_filters
            and not owner.enqueue_observers
            and testmode.after_enqueue is None
            and opts.task_id is None
        ):
            broker = owner.broker
            since = broker.result_token()  # before the send: see RecordsState.result_token
            fast = registered is not None and registered.fast
            with unknown_outcome("enqueue", (env.id,)):
                await (broker.publish_fast if fast else broker.publish)(queue, (data,))
            handle: TaskHandle[Any] = TaskHandle(
                owner, env.id, queue, name, stores_result=stores, sent=True
            )
            handle._since = since
            return handle
        out = Outgoing(env, data, due, registered, delay=opts.relative_delay())
        explicit = frozenset((env.id,)) if opts.task_id is not None else frozenset()
        await self.publish([out], explicit)
        if out.existing_id is not None:
            return TaskHandle(
                owner,
                out.existing_id,
                queue,
                name,
                duplicate=True,
                stores_result=stores,
                sent=True,
            )
        return TaskHandle(owner, env.id, queue, name, stores_result=stores, sent=True)

    async def enqueue_many(
        self,
        task: Task[Any, Any],
        calls: Iterable[tuple[Any, ...] | tuple[tuple[Any, ...], dict[str, Any]]],
        opts: CallOptions,
    ) -> list[TaskHandle[Any]]:
        """Publish many calls of ``task`` in one batch; see :meth:`blitzq.Task.enqueue_many`.

        Raises:
            ConfigurationError: a bad item or per-item option, a bound ``task_id``, or the
                same ``task_id`` given to several items.
            SerializationError, MessageTooLarge: before anything is published.
            EnqueueRefused, BrokerError: as for :meth:`enqueue`.
        """
        if opts.task_id is not None:
            raise ConfigurationError("task_id cannot be bound for enqueue_many")
        now = time.time()
        due = opts.due_time(now) if opts is not _NO_OPTIONS else None
        queue = physical_queue(opts.queue or task.queue, opts.priority or task.priority)
        items = []
        explicit: dict[str, int] = {}  # an item's given task_id -> its index
        limit = self.queue.max_message_size
        delay = opts.relative_delay()
        block = min(len(calls), ID_BLOCK) if isinstance(calls, Sized) else 64
        fresh = self.fresh_ids(block) if block else None  # None: the broker makes each
        for index, call in enumerate(calls):
            if not isinstance(call, tuple):
                raise ConfigurationError(f"enqueue_many takes tuples of arguments, got {call!r}")
            item_opts, item_due, item_queue, item_delay = opts, due, queue, delay
            if len(call) == 3 and isinstance(call[0], tuple) and isinstance(call[2], Mapping):
                args, kwargs, extra = call  # per-item options (see item_options)
                try:
                    item_opts = item_options(opts, extra, task.call_controls)
                except ConfigurationError as exc:
                    raise itemized(exc, f"enqueue_many item {index}") from None
                item_due = item_opts.due_time(now)
                item_queue = physical_queue(
                    item_opts.queue or task.queue, item_opts.priority or task.priority
                )
                item_delay = item_opts.relative_delay()
            elif len(call) == 2 and isinstance(call[0], tuple) and isinstance(call[1], dict):
                args, kwargs = call
            else:
                args, kwargs = call, {}
            if task.prepared_call:
                args, kwargs = task.call_arguments(args, kwargs or {})
            fresh_id = None
            if fresh is not None and item_opts.task_id is None:
                if not fresh:
                    fresh = new_task_ids(block)
                fresh_id = fresh.pop()
            env = self.envelope(task.name, item_queue, args, kwargs or {}, item_opts, now, fresh_id)
            if item_opts.task_id is not None:
                first = explicit.setdefault(env.id, index)
                if first != index:  # generated ids (120 random bits) never repeat
                    raise ConfigurationError(
                        f"enqueue_many items {first} and {index}: the same task_id {env.id!r}"
                    )
            try:
                data = encode_wire_envelope(env, limit)
            except SerializationError as exc:  # MessageTooLarge among them
                raise itemized(exc, f"enqueue_many item {index}") from None
            items.append(Outgoing(env, data, item_due, task, delay=item_delay))
        if items:
            await self.publish(items, frozenset(explicit))
        stores = self.stores_result(task)
        return [
            TaskHandle(
                self.queue,
                o.existing_id or o.envelope.id,
                o.envelope.queue,
                task.name,
                duplicate=o.existing_id is not None,
                stores_result=stores,
                sent=True,
            )
            for o in items
        ]

    async def send(
        self,
        name: str,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> TaskHandle[Any]:
        """Enqueue a task by name, for producers that do not import the task's code.

        Args:
            name: the registered task name (e.g. ``"tasks.add"``).
            args, kwargs: the call's arguments (plain data).
            options: any of :class:`~blitzq.task.CallOptions` (delay, eta, task_id, headers,
                timeout, queue, correlation_id), or a per-call option a middleware declares
                (``Middleware.call_options``, such as ``max_age``).

        Raises:
            ConfigurationError: an unknown option or an invalid value, ``args`` that are not
                a tuple or list, ``kwargs`` that are not a mapping.
            SerializationError, MessageTooLarge, BrokerError: as for ``Task.enqueue``.
        """
        opts = named_options(self, "send", name, args, kwargs, options)
        return await self.enqueue(name, tuple(args), dict(kwargs or {}), opts)

    async def send_many(self, items: Iterable[Sequence[Any]]) -> list[TaskHandle[Any]]:
        """Enqueue many tasks by name in one batch, mixing tasks, queues and options.

        Each item is ``(name, args, kwargs)`` or ``(name, args, kwargs, options)``: a
        registered task name, a tuple or list of positional arguments, a dict of keyword
        arguments (or ``None``) and a dict of :class:`~blitzq.task.CallOptions` fields
        (``delay``, ``eta``, ``task_id``, ``queue``, ``priority``, ...). The batch is checked
        and encoded whole before anything is published, then published as one
        :meth:`publish` (one write per physical queue, one for the scheduled ones), as
        :meth:`enqueue_many` does for one task.

        Args:
            items: the calls, in order; an empty iterable publishes nothing.

        Returns:
            One handle per item, in the items' order.

        Raises:
            ConfigurationError: an item that is not such a tuple, an unknown option or an
                invalid value, or the same ``task_id`` given to several items (nothing is
                published).
            SerializationError, MessageTooLarge: an argument that is not plain data or a
                message over ``max_message_size`` (nothing is published).
            EnqueueRefused, BrokerError: as for :meth:`enqueue`.
        """
        return await send_many(self, items)


__all__ = ["Producer", "item_options"]
