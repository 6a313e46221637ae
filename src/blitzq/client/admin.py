"""The operator side of a :class:`~blitzq.Queue`: dead letters (list, count, replay, purge),
purging a queue, and stats.

An :class:`Admin` belongs to one Queue and uses its broker of the running event loop.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from .._checks import integer
from ..dead_letters import DeadLetter
from ..envelope_checks import envelope_fault, options_fault
from ..exceptions import (
    BrokerError,
    ConfigurationError,
    MessageTooLarge,
    SerializationError,
    UnknownQueue,
    unknown_outcome,
)
from ..extensions.unique import DEFAULT_UNIQUE_TTL, broker_key
from ..ratelimit import RateLimit
from ..routing import base_queue, check_name, check_task_id, levels
from ..serialization import decode_envelope, encode_envelope, loads, lookup_key
from ..task import TaskHandle
from . import testmode
from .dead_letter_query import DeadLetterFilter, Pacer, ReplayOutcome, scan, summarize

if TYPE_CHECKING:
    from ..broker import Broker
    from .context import QueueContext


def worker_document(worker_id: str, raw: bytes) -> dict[str, Any]:
    """A worker's registration (what :meth:`Broker.workers` maps its key to) as a dict with
    its ``id`` (the one it registered: ``host:pid-slot`` for a supervised worker, stable across
    restarts) and ``key`` (unique per live process: ``worker_id``); registration bytes that do
    not decode give just the key as both."""
    try:
        info = loads(raw)
    except SerializationError:
        info = None
    doc: dict[str, Any] = dict(info) if isinstance(info, dict) else {}
    if not isinstance(doc.get("id"), str):
        doc["id"] = worker_id
    doc["key"] = worker_id
    return doc


async def is_live_worker(broker: Broker, ident: str) -> bool:
    """Whether a live (registered) worker has the id or key ``ident``: what ``blitzq worker
    shutdown`` and the dashboard's shutdown and resize actions ask before they push.

    Raises:
        BrokerError: the broker could not be reached.
    """
    workers = await broker.workers()
    return any(ident in (doc["id"], doc["key"]) for doc in map(_document, workers.items()))


def _document(item: tuple[str, bytes]) -> dict[str, Any]:
    return worker_document(*item)


class Admin:
    """Dead letters, purges and stats of one Queue.

    Args:
        queue: the Queue whose broker and settings it uses.
    """

    def __init__(self, queue: QueueContext) -> None:
        self.queue = queue

    # ----------------------------------------------------------- dead letters
    async def dead_letters(
        self,
        limit: int = 100,
        offset: int = 0,
        *,
        task: str | None = None,
        queue: str | None = None,
        reason: str | None = None,
        error_type: str | None = None,
        older_than: float | None = None,
        newer_than: float | None = None,
    ) -> list[DeadLetter]:
        """Dead letters, newest first, those matching every criterion given.

        Args:
            limit: most entries to return.
            offset: matching entries to skip.
            task, queue, reason, error_type: what they must be (see
                :class:`~blitzq.client.dead_letter_query.DeadLetterFilter`: a base queue
                name matches its priority levels, an error type its dotted name's last part).
            older_than, newer_than: their age bounds, in seconds.

        A call with a criterion reads every stored dead letter (page by page) to find the
        matches.

        Raises:
            ConfigurationError: a criterion of the wrong type, or a negative, NaN or infinite
                age.
            BrokerError: the broker could not be reached.
        """
        flt = DeadLetterFilter(task, queue, reason, error_type, older_than, newer_than)
        if flt.empty:
            rows = await self.queue.broker.dead_letters(offset, limit)
            return [
                DeadLetter.from_fields(
                    task_id, f.message, f.reason, f.error, f.task, f.queue, f.failed_at, f.kind
                )
                for task_id, f in rows
            ]
        out: list[DeadLetter] = []
        async for dl in scan(self.queue.broker, flt):
            if offset > 0:
                offset -= 1
                continue
            if len(out) >= limit:
                break
            out.append(dl)
        return out

    async def dead_letter_summary(
        self,
        *,
        task: str | None = None,
        queue: str | None = None,
        reason: str | None = None,
        error_type: str | None = None,
        older_than: float | None = None,
        newer_than: float | None = None,
    ) -> dict[str, Any]:
        """Counts of the dead letters matching the criteria (those of :meth:`dead_letters`),
        grouped: ``{"total": n, "by_task": {name: n}, "by_reason": {...}, "by_error_type":
        {...}, "by_queue": {...}}``, each group largest first.

        Raises:
            ConfigurationError: an invalid criterion (see :meth:`dead_letters`).
            BrokerError: the broker could not be reached.
        """
        flt = DeadLetterFilter(task, queue, reason, error_type, older_than, newer_than)
        return summarize([dl async for dl in scan(self.queue.broker, flt)])

    async def retry_dead_letters(
        self,
        *,
        task: str | None = None,
        queue: str | None = None,
        reason: str | None = None,
        error_type: str | None = None,
        older_than: float | None = None,
        newer_than: float | None = None,
        rate: float | str | None = None,
        limit: int | None = None,
        dry_run: bool = False,
    ) -> list[ReplayOutcome]:
        """Replay every dead letter matching the criteria (those of :meth:`dead_letters`),
        oldest first, each as :meth:`retry` does.

        Args:
            rate: most replays per second (a number, or a rate like ``"10/s"``, ``"100/m"``):
                each starts ``1 / rate`` s after the one before at least, with no burst to
                catch up after a slow one; ``None``: as fast as the broker answers.
            limit: most dead letters to replay (``None``: all that match).
            dry_run: replay nothing; report each match as ``"dry run"``.

        Returns:
            One :class:`~blitzq.client.dead_letter_query.ReplayOutcome` per match. Once all
            are replayed, each replayed id is looked up again: one that is a dead letter again
            already (a worker refused or failed it at once) is ``"dead-lettered again"``, with
            its new reason; ``"replayed"`` means published again, not run (a task failing
            after the batch ended is listed by :meth:`dead_letters` later).

        Raises:
            ConfigurationError: an invalid criterion, rate or limit.
            BrokerError: the broker could not be reached (those replayed so far stay so).
        """
        flt = DeadLetterFilter(task, queue, reason, error_type, older_than, newer_than)
        per_second = _rate(rate)
        if limit is not None:
            integer("limit", limit, minimum=0)
        matches = [dl async for dl in scan(self.queue.broker, flt)]
        matches.reverse()  # oldest first: the order they failed in
        if limit is not None:
            matches = matches[:limit]
        out: list[ReplayOutcome] = []
        pace = Pacer(per_second) if per_second is not None else None
        for dl in matches:
            if dry_run:
                out.append(ReplayOutcome(dl.id, dl.task, dl.queue, "dry run"))
                continue
            if pace is not None:  # each replay starts 1/rate s after the one before, at least
                await pace.wait()
            out.append(await self._replay_one(dl))
        return [await self._again(o) for o in out]

    async def _again(self, o: ReplayOutcome) -> ReplayOutcome:
        """``o``, or, when it was replayed and its id is a dead letter again (the replay
        deleted the old one: this one is new), ``"dead-lettered again"`` with its reason."""
        if o.outcome != "replayed":
            return o
        fields = await self.queue.broker.get_dead_letter(o.id)
        if fields is None:
            return o
        detail = f"{fields.reason}: {fields.error}" if fields.error else fields.reason
        return ReplayOutcome(o.id, o.task, o.queue, "dead-lettered again", detail)

    async def _replay_one(self, dl: DeadLetter) -> ReplayOutcome:
        try:  # only the dead letter the scan matched: not a newer one of the same id
            handle = await self._take(dl.id, dl.failed_at)
        except (SerializationError, MessageTooLarge) as exc:
            return ReplayOutcome(dl.id, dl.task, dl.queue, "refused", str(exc))
        if handle is None:
            return ReplayOutcome(dl.id, dl.task, dl.queue, "gone")
        if handle.duplicate:
            return ReplayOutcome(dl.id, dl.task, handle.queue, "held", handle.id)
        return ReplayOutcome(dl.id, dl.task, handle.queue, "replayed")

    async def dead_letter_count(self) -> int:
        """Number of stored dead letters."""
        return await self.queue.broker.dead_letter_count()

    async def retry(self, task_id: str) -> TaskHandle[Any] | None:
        """Replay a dead letter: atomically remove it and publish it again with fresh attempts.

        The message goes back where it came from: the same queue, in the mode it was
        dead-lettered in (a fast-mode list or a reliable-mode stream), whatever this Queue's
        mode; a dead letter stored before blitzq recorded its mode goes to this Queue's mode.
        A unique task claims its unique key again, for the task's ``unique_ttl`` (the default
        one when the task is not registered here); while another task holds the key, nothing
        is replayed and the dead letter stays.

        Returns:
            A handle to the replayed task; a handle with ``duplicate=True`` naming the task
            that holds the unique key (nothing replayed); or ``None`` when no such dead
            letter exists (or a concurrent replay took it first: the dead letter read here
            is replayed only while it is still stored, not a newer one of the same id that
            another caller's replay left after the task failed again).

        Raises:
            SerializationError: the dead letter's message is malformed and cannot be replayed,
                or holds a field a worker would dead-letter it for again at once
                (:func:`~blitzq.envelope_checks.envelope_fault`: a bad ``timeout``,
                ``max_age``, id, …; the times and attempts a replay resets aside); the dead
                letter stays.
            MessageTooLarge: the message is over this Queue's ``max_message_size`` (bytes);
                the dead letter stays.
            SerializationError, ConfigurationError: ``task_id`` breaks the rule of task ids
                (:func:`~blitzq.routing.check_task_id`).
            OutcomeUnknown: the replay was sent and its reply lost, or (``unreplicated``) the
                primary applied it and its replicas did not confirm it in time
                (``redis+sentinel://``, a Redis Cluster with replicas): it may stand or not.
            BrokerError: the broker could not be reached.
        """
        return await self._take(check_task_id("task id", task_id), None)

    async def _take(self, task_id: str, failed_at: float | None) -> TaskHandle[Any] | None:
        """:meth:`retry` of the dead letter of ``task_id`` that failed at ``failed_at`` (Unix
        seconds, as listed), or of whichever is stored (``None``); ``None`` when that one is
        gone. The replay script compares the failure time it reads here (compare-and-delete),
        so one dead letter is replayed once however many callers race for it."""
        owner = self.queue
        broker = owner.broker
        fields = await broker.get_dead_letter(task_id)
        if fields is None:
            return None
        # A planted entry's failure time may be no finite number: it then matches any.
        stamp = fields.failed_at if math.isfinite(fields.failed_at) else None
        if stamp is not None and failed_at is not None and stamp != failed_at:
            return None
        if fields.reason == "unreadable entry" and not fields.message:  # its key is no hash
            raise SerializationError(f"dead letter {task_id} is unreadable: {fields.error}")
        env = decode_envelope(fields.message)
        queue = fields.queue or env.queue
        now = time.time()
        # Every field is kept (unique key, max_age, workflow metadata, …) but the attempts,
        # which start over, and the age: a replay would otherwise expire again at once.
        replayed = msgspec.structs.replace(
            env, queue=queue, attempt=1, created_at=now, enqueued_at=now, reserved=False
        )
        fault = envelope_fault(replayed, now)  # a worker would dead-letter it at once
        task = owner.tasks.get(env.task)
        if fault is None and env.options is not None and task is not None:
            fault = options_fault(env.options, task.call_controls)
        if fault is not None:
            raise SerializationError(
                f"malformed message: {fault} (a worker would dead-letter it again at once)"
            )
        data = encode_envelope(replayed, owner.max_message_size)
        unique = None
        if env.unique_key is not None:
            ttl = task.controls.unique_ttl if task is not None else DEFAULT_UNIQUE_TTL
            unique = (broker_key(env), ttl)
        with unknown_outcome("replay", (env.id,)):  # a reply lost, or not on the replicas
            outcome = await broker.replay_dead_letter(
                task_id, queue, data, fields.kind, unique, stamp
            )
        if outcome is False:
            return None
        if testmode.after_enqueue is not None:  # no middleware hook sees a replay
            await testmode.after_enqueue(owner)
        if isinstance(outcome, str):
            return TaskHandle(owner, outcome, queue, env.task, duplicate=True, sent=True)
        return TaskHandle(owner, env.id, queue, env.task, sent=True)

    async def purge_dead_letters(
        self,
        *,
        task: str | None = None,
        queue: str | None = None,
        reason: str | None = None,
        error_type: str | None = None,
        older_than: float | None = None,
        newer_than: float | None = None,
    ) -> int:
        """Delete the dead letters matching the criteria (those of :meth:`dead_letters`;
        none given: every dead letter); return how many were deleted.

        Raises:
            ConfigurationError: an invalid criterion (see :meth:`dead_letters`).
            BrokerError: the broker could not be reached.
        """
        flt = DeadLetterFilter(task, queue, reason, error_type, older_than, newer_than)
        broker = self.queue.broker
        if flt.empty:
            return await broker.purge_dead_letters()
        ids = [dl.id async for dl in scan(broker, flt)]
        return await broker.delete_dead_letters(ids) if ids else 0

    # ----------------------------------------------------------------- queues
    async def purge_queue(self, queue: str | None = None, *, delayed: bool = False) -> int:
        """Delete the messages waiting in ``queue`` (default: this Queue's ``name``).

        Messages already taken by a worker are not touched. Tasks of the queue waiting on the
        schedule (a ``delay`` or ``eta`` not reached yet, a retry's backoff) are not waiting
        in the queue: they stay, and are published to it when due, unless ``delayed``
        (:meth:`delayed_count` counts them).

        Args:
            queue: a physical queue (``"emails"``, or a priority level ``"emails:high"``).
            delayed: also take the queue's tasks off the schedule (their unique keys freed;
                this reads the whole schedule, page by page).

        Returns:
            How many were deleted (with ``delayed``: waiting and delayed together).

        Raises:
            ConfigurationError: not a usable queue name (see :func:`~blitzq.routing.check_name`).
            SerializationError: a name that is not valid Unicode text (a lone surrogate).
            BrokerError: the broker could not be reached.
        """
        name = self._queue_name(queue)
        purged = await self.queue.broker.purge_queue(name)
        if delayed:
            purged += await self.queue.broker.scheduled_for([name], purge=True)
        return purged

    async def delayed_count(self, queue: str | None = None) -> int:
        """How many tasks wait on the schedule to be published to physical ``queue``
        (default: this Queue's ``name``): delays, ETAs and retry backoffs not due yet, what
        :meth:`purge_queue` leaves unless ``delayed=True``. Reads the whole schedule, page
        by page.

        Raises:
            ConfigurationError, SerializationError: not a usable queue name (see
                :meth:`purge_queue`).
            BrokerError: the broker could not be reached.
        """
        return await self.queue.broker.scheduled_for([self._queue_name(queue)])

    def _queue_name(self, queue: str | None) -> str:
        return lookup_key("queue name", check_name("queue name", queue or self.queue.name))

    async def stats(self, queues: Iterable[str] | None = None) -> dict[str, Any]:
        """Queue depths, schedule size, dead letters and live workers.

        Returns:
            ``{"queues": {name: {"waiting": n, "in_flight": n}}, "scheduled": n,
            "dead_letters": n, "workers": n, "stale_completions": n}``; the last counts the
            completions ever refused by fencing in this namespace (a worker that lost its
            lease, see docs/guarantees.md). When a key blitzq reads holds another type (set by
            hand; every command on it fails with ``WRONGTYPE``), ``"wrong_type_keys": {key:
            "holds a string, not a stream"}`` names it, and what it would have counted is 0.

        Raises:
            ConfigurationError: ``queues`` is a ``str`` (one name: pass ``[name]``) or holds
                something else than ``str`` names.
            SerializationError: a name that is not valid Unicode text (a lone surrogate).
            BrokerError: the broker could not be reached.
        """
        broker = self.queue.broker
        if isinstance(queues, str):
            raise ConfigurationError(f"queues must be a list of queue names, got {queues!r}")
        if queues is not None:
            queues = [lookup_key("queue name", q) for q in queues]
        names = sorted(set(queues) if queues is not None else set(await broker.known_queues()))
        wrong = await broker.wrong_type_keys(names)
        per_queue = await broker.queue_stats(names) if names else {}
        if queues is None:  # empty priority levels are noise in an overview
            per_queue = {
                q: counts
                for q, counts in per_queue.items()
                if any(counts.values()) or not q.endswith((":high", ":low"))
            }
        stats: dict[str, Any] = {
            "queues": per_queue,
            "scheduled": await _unless_wrong_type(broker.scheduled_count()),
            "dead_letters": await _unless_wrong_type(broker.dead_letter_count()),
            "workers": len(await broker.workers()),
            "stale_completions": (await broker.counters()).get("stale_completions", 0),
        }
        if wrong:
            stats["wrong_type_keys"] = wrong
        return stats


async def check_known_queue(
    broker: Broker, namespace: str, name: str, declared: Iterable[str] = ()
) -> None:
    """Refuse an operator's action on a queue nothing has used (``blitzq queue pause|resume|
    purge``, the dashboard's buttons): a typo would otherwise pause a queue no worker serves,
    saying it changed something, or purge nothing and say so.

    ``name`` (a queue, or one of its levels ``<queue>:high`` / ``<queue>:low``) is known when
    the application declares it (``declared``), when any level of its queue is in the registry
    of known queues (a producer sent to it, a worker or scheduler served it), when the queue
    is paused, or when a level holds a message (waiting or in flight: the registry may have
    been lost). Read-only: it writes nothing.

    Args:
        broker: the broker of the namespace.
        namespace: its name, for the error.
        name: the queue name given.
        declared: queues the application declares (the dashboard's Queue: its name, its
            tasks' and periodic entries' queues), known before their first task.

    Raises:
        UnknownQueue: ``name`` is none of those.
        BrokerError: the broker could not be reached.
    """
    base = base_queue(name)
    if base in {base_queue(q) for q in declared}:
        return
    lanes = levels(base)
    if set(lanes) & set(await broker.known_queues()) or base in await broker.paused_queues():
        return
    stats = await broker.queue_stats(lanes)
    if any(n for lane in stats.values() for n in lane.values()):
        return
    raise UnknownQueue(name, namespace)


async def _unless_wrong_type(count: Awaitable[int]) -> int:
    """``count``'s answer, or 0 when its key holds another type (``wrong_type_keys`` names
    it)."""
    try:
        return await count
    except BrokerError as exc:
        if "WRONGTYPE" not in str(exc):
            raise
        return 0


def _rate(rate: float | str | None) -> float | None:
    """Replays per second from a number or a rate text (``"10/s"``), or ``None``."""
    if rate is None:
        return None
    if isinstance(rate, str):
        return RateLimit.parse(rate).rate
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < 1e9:
        raise ConfigurationError(f"rate must be a positive number per second, got {rate!r}")
    return float(rate)


__all__ = ["Admin", "check_known_queue"]
