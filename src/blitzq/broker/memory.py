"""In-process broker: messages live in this process's memory (for tests).

Mirrors the semantics of the Redis brokers (``broker/redis/``, notably its Lua scripts) without
a server. One instance may be used from several event loops in several threads at once: state
is guarded by a :class:`threading.Lock` (never held across an ``await``), and blocked
:meth:`MemoryBroker.fetch` / :meth:`MemoryBroker.wait_for_record` callers are woken with
``loop.call_soon_threadsafe`` on a future created in their own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TypeVar

from ..exceptions import BrokerError, SerializationError
from ..limits import DEAD_MESSAGE_SAMPLE, DEFAULT_DEAD_LETTER_MAX_BYTES, DEFAULT_DEAD_LETTER_TTL
from ..serialization import decode_envelope, dumps, loads
from . import Broker, Completion, DeadLetterFields, Delivery, Guarantee, Scheduled
from .memory_control import MemoryControl
from .memory_progress import MemoryProgress
from .memory_workflows import MemoryWorkflows
from .ops import encode_op

T = TypeVar("T")

#: Dead letters kept per broker before the oldest are dropped.
DEFAULT_DEAD_LETTER_CAP = 100_000

_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]

_registry: dict[str, MemoryBroker] = {}
_registry_lock = threading.Lock()


@dataclass(slots=True)
class _Lease:
    payload: bytes
    deliveries: int
    touched: float  # time.monotonic() of the fetch or last heartbeat


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _wake(waiters: list[_Waiter] | None) -> None:
    for loop, fut in waiters or ():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there any more
            loop.call_soon_threadsafe(_resolve, fut)


def _fit_dead_letter(fields: DeadLetterFields, max_bytes: int) -> DeadLetterFields:
    """``fields`` of a dead letter over ``max_bytes`` (message + error + 64), cut as the Redis
    brokers' ``dl_note`` does: the message to its first :data:`~blitzq.limits.DEAD_MESSAGE_SAMPLE`
    bytes (fewer when the bound is smaller), the error to as many characters plus a note."""
    message = fields.message
    error = (
        f"{fields.error[:DEAD_MESSAGE_SAMPLE]}; dead letter over dead_letter_max_bytes="
        f"{max_bytes}: only the first {DEAD_MESSAGE_SAMPLE} bytes of its {len(message)}-byte "
        "message are kept"
    )[: max(0, max_bytes - 64)]
    message = message[: min(DEAD_MESSAGE_SAMPLE, max(0, max_bytes - len(error) - 64))]
    return replace(fields, message=message, error=error)


class MemoryBroker(MemoryControl, MemoryProgress, MemoryWorkflows, Broker):
    """Ephemeral in-process broker for unit tests and users' own tests.

    Deliveries carry tokens and stay in flight until completed, so leases, :meth:`heartbeat`
    and :meth:`recover` work as in reliable Redis mode. Use :meth:`named` so that a producer
    and a worker built separately share one instance.

    Args:
        dead_letter_cap: dead letters kept before the oldest are dropped.
        dead_letter_ttl: seconds a dead letter is kept.
        dead_letter_max_bytes: total bytes of dead letters (message + error + 64 each, as
            the Redis brokers count) kept before the oldest are dropped.
    """

    guarantee = Guarantee.EPHEMERAL
    supports_recovery = True

    def __init__(
        self,
        *,
        dead_letter_cap: int = DEFAULT_DEAD_LETTER_CAP,
        dead_letter_ttl: float = DEFAULT_DEAD_LETTER_TTL,
        dead_letter_max_bytes: int = DEFAULT_DEAD_LETTER_MAX_BYTES,
    ) -> None:
        self.dead_letter_cap = dead_letter_cap
        self.dead_letter_ttl = dead_letter_ttl
        self.dead_letter_max_bytes = dead_letter_max_bytes
        #: When each dead letter expires (monotonic seconds), set when it is stored.
        self._dead_until: dict[str, float] = {}
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._waiting: dict[str, deque[tuple[bytes, int]]] = {}
        self._leases: dict[str, dict[bytes, _Lease]] = {}
        self._schedule: dict[str, tuple[float, str, bytes]] = {}
        self._records: dict[str, tuple[bytes, float]] = {}
        self._dead: dict[str, DeadLetterFields] = {}
        self._queues: set[str] = set()
        self._workers: dict[str, tuple[bytes, float]] = {}
        self._fetchers: dict[str, list[_Waiter]] = {}
        self._record_waiters: dict[str, list[_Waiter]] = {}
        self._periodic: dict[str, float] = {}
        self._buckets: dict[str, tuple[float, float]] = {}
        self._revoked: dict[str, float] = {}
        self._subscribers: list[
            tuple[asyncio.AbstractEventLoop, asyncio.Queue[tuple[str, str]]]
        ] = []
        self._progress: dict[str, tuple[bytes, float, float]] = {}
        self._progress_watchers: dict[str, list[Any]] = {}
        self._stale_completions = 0

    @classmethod
    def named(cls, name: str) -> MemoryBroker:
        """The process-wide broker called ``name``, created on first use."""
        with _registry_lock:
            broker = _registry.get(name)
            if broker is None:
                broker = _registry[name] = cls()
            return broker

    # ------------------------------------------------- helpers (lock held)
    def _push(self, queue: str, payload: bytes, deliveries: int, head: bool = False) -> None:
        waiting = self._waiting.setdefault(queue, deque())
        (waiting.appendleft if head else waiting.append)((payload, deliveries))
        _wake(self._fetchers.pop(queue, None))

    def _take(self, queue: str, count: int) -> list[Delivery] | None:
        waiting = self._waiting.get(queue)
        if not waiting or count <= 0:
            return None
        leases = self._leases.setdefault(queue, {})
        now = time.monotonic()
        out: list[Delivery] = []
        while waiting and len(out) < count:
            payload, deliveries = waiting.popleft()
            token = str(next(self._tokens)).encode()
            leases[token] = _Lease(payload, deliveries, now)
            out.append(Delivery(queue, token, payload, deliveries))
        return out

    def _store_record(self, task_id: str, record: bytes, ttl: float) -> None:
        self._records[task_id] = (record, time.monotonic() + ttl)
        _wake(self._record_waiters.pop(task_id, None))
        if self._progress_watchers:
            self._tell_watchers(task_id, "record", record)

    def _get_record(self, task_id: str) -> bytes | None:
        entry = self._records.get(task_id)
        if entry is not None and entry[1] > time.monotonic():
            return entry[0]
        self._records.pop(task_id, None)  # absent or expired
        return None

    def _newest_first(self) -> list[str]:
        dead = self._dead
        return sorted(dead, key=lambda tid: (dead[tid].failed_at, tid), reverse=True)

    def _trim_dead_letters(self) -> None:
        """Drop expired dead letters, then the oldest beyond the count and byte bounds."""
        dead, until = self._dead, self._dead_until
        now = time.monotonic()
        for task_id in dead:
            until.setdefault(task_id, now + self.dead_letter_ttl)  # stored since the last trim
        for task_id in [t for t in until if t not in dead]:
            del until[task_id]  # replayed or purged
        for task_id in [t for t, at in until.items() if at <= now]:
            del dead[task_id], until[task_id]
        bound = self.dead_letter_max_bytes
        for task_id, fields in dead.items():  # one dead letter never outgrows the bound
            if len(fields.message) + len(fields.error) + 64 > bound:
                dead[task_id] = _fit_dead_letter(fields, bound)
        newest = self._newest_first()
        total = sum(len(f.message) + len(f.error) + 64 for f in dead.values())
        while newest and (len(newest) > self.dead_letter_cap or total > self.dead_letter_max_bytes):
            oldest = newest.pop()
            fields = dead.pop(oldest)
            until.pop(oldest, None)
            total -= len(fields.message) + len(fields.error) + 64

    async def _block(
        self, table: dict[str, list[_Waiter]], key: str, wait: float, attempt: Callable[[], T]
    ) -> T:
        """Return ``attempt()`` once it is not ``None``, or its last value after ``wait`` s."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + wait
        while True:
            with self._lock:
                value = attempt()
                remaining = deadline - time.monotonic()
                if value is not None or remaining <= 0:
                    return value
                waiter: _Waiter = (loop, loop.create_future())
                table.setdefault(key, []).append(waiter)
            try:
                await asyncio.wait_for(waiter[1], remaining)
            except TimeoutError:
                pass
            finally:
                with self._lock:
                    waiters = table.get(key)
                    if waiters is not None and waiter in waiters:
                        waiters.remove(waiter)
                        if not waiters:
                            del table[key]

    # ---------------------------------------------------------------- queues
    async def publish(self, queue: str, messages: Sequence[bytes]) -> None:
        """Append messages to the tail of ``queue`` and wake blocked fetchers."""
        with self._lock:
            self._queues.add(queue)
            for message in messages:
                self._push(queue, message, 1)

    async def prepare_consumer(self, queues: Sequence[str], consumer: str) -> None:
        """Remember ``queues`` as known; nothing else needs creating."""
        await self.remember_queues(queues)

    async def fetch(self, queue: str, count: int, timeout: float) -> list[Delivery]:
        """Pop up to ``count`` from the head; when empty, block up to ``timeout`` seconds."""
        result = await self._block(self._fetchers, queue, timeout, lambda: self._take(queue, count))
        return result or []

    async def fetch_first(
        self, queues: Sequence[str], count: int, timeout: float
    ) -> list[Delivery]:
        """Take from ``queues`` in order; when all are empty, block on all up to ``timeout``."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                out: list[Delivery] = []
                for queue in queues:
                    out += self._take(queue, count - len(out)) or []
                remaining = deadline - time.monotonic()
                if out or remaining <= 0:
                    return out
                waiter: _Waiter = (loop, loop.create_future())
                for queue in queues:
                    self._fetchers.setdefault(queue, []).append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter[1], remaining)
            with self._lock:
                for queue in queues:
                    waiters = self._fetchers.get(queue)
                    if waiters is not None and waiter in waiters:
                        waiters.remove(waiter)
                        if not waiters:
                            del self._fetchers[queue]

    async def acquire_rate(self, buckets: Sequence[tuple[str, float, float]]) -> tuple[bool, float]:
        """Token buckets as in ``lua/rate_acquire.lua``, on this process's monotonic clock."""
        with self._lock:
            now = time.monotonic()
            levels = []
            for key, rate, capacity in buckets:
                tokens, stamp = self._buckets.get(key, (capacity, now))
                levels.append(min(capacity, tokens + max(0.0, now - stamp) * rate))
            wait = 0.0
            for (key, rate, _), tokens in zip(buckets, levels, strict=True):
                self._buckets[key] = (tokens - 1, now)
                if tokens - 1 < 0:
                    wait = max(wait, (1 - tokens) / rate)
            return True, wait

    async def complete(self, completions: Sequence[Completion]) -> list[Completion]:
        """Apply completions as ``complete.lua`` does, the whole batch atomically.

        Fencing as there: a completion whose delivery (``token``, else ``fence``) is no
        longer leased (recovered after its lease lapsed, or already completed) is stale,
        counted and returned, and applies nothing.
        """
        stale: list[Completion] = []
        with self._lock:
            dead_added = False
            for c in completions:
                held = c.token or c.fence
                if held and held not in self._leases.get(c.queue, {}):
                    stale.append(c)
                    continue
                if c.token:
                    self._leases[c.queue].pop(c.token)
                if c.record:
                    self._store_record(c.task_id, c.record, c.record_ttl)
                if c.reschedule:
                    due = time.time() + c.delay
                    self._schedule[c.task_id] = (due, c.queue, c.reschedule)
                    self._announce("schedule", repr(due))
                if c.dead_letter is not None:
                    self._dead[c.task_id] = c.dead_letter
                    self._dead_until.pop(c.task_id, None)  # a fresh TTL
                    dead_added = True
                if c.requeue:
                    self._push(c.queue, c.requeue, 1, head=True)
                for op in map(encode_op, c.ops):
                    handler = self._OPS.get(str(op[0]))
                    if handler is None:
                        raise BrokerError(f"unknown completion op {op[0]!r}", transient=False)
                    handler(self, op)
            if dead_added:
                self._trim_dead_letters()
            self._stale_completions += len(stale)
        return stale

    async def counters(self) -> dict[str, int]:
        """``{"stale_completions": n}`` (see :meth:`complete`)."""
        with self._lock:
            return {"stale_completions": self._stale_completions}

    def _op_publish(self, op: tuple[Any, ...]) -> None:
        """``("publish", kind, queue, message)`` (lock held)."""
        self._queues.add(op[2])
        self._push(op[2], op[3], 1)

    #: Completion op handlers by wire name (see :mod:`blitzq.broker.ops`).
    _OPS: ClassVar[dict[str, Callable[[MemoryBroker, tuple[Any, ...]], None]]] = {
        "publish": _op_publish,
        "unique_release": MemoryControl._op_unique_release,
        "lock_release": MemoryControl._op_lock_release,
        "progress": MemoryProgress._op_progress,
        "workflow_start": MemoryWorkflows._op_workflow_start,
        "workflow_step": MemoryWorkflows._op_workflow_step,
        "workflow_done": MemoryWorkflows._op_workflow_done,
        "workflow_fail": MemoryWorkflows._op_workflow_fail,
        "chord": MemoryWorkflows._op_chord,
    }

    async def heartbeat(self, queue: str, tokens: Sequence[bytes]) -> int:
        """Renew the leases of ``tokens`` still in flight on ``queue``; return how many."""
        now = time.monotonic()
        with self._lock:
            leases = self._leases.get(queue, {})
            renewed = [leases[token] for token in tokens if token in leases]
            for lease in renewed:
                lease.touched = now
        return len(renewed)

    async def recover(
        self, queue: str, min_idle: float, count: int, max_deliveries: int, record_ttl: int = 86400
    ) -> tuple[int, int]:
        """Requeue (tail, deliveries + 1) up to ``count`` deliveries idle over ``min_idle`` s.

        Those already delivered ``max_deliveries`` times are dead-lettered instead, with a
        ``dead_lettered`` record kept ``record_ttl`` seconds (as ``recover.lua`` does).
        """
        now, wall = time.monotonic(), time.time()
        requeued = dead = 0
        with self._lock:
            leases = self._leases.get(queue, {})
            idle = [t for t, lease in leases.items() if now - lease.touched > min_idle][:count]
            for token in idle:
                lease = leases.pop(token)
                if lease.deliveries < max_deliveries:
                    self._push(queue, lease.payload, lease.deliveries + 1)
                    requeued += 1
                    continue
                task_id, task = token.decode(), ""
                with contextlib.suppress(SerializationError):  # malformed: keyed by token
                    envelope = decode_envelope(lease.payload)
                    task_id, task = envelope.id, envelope.task
                error = (
                    f"delivered {lease.deliveries} times without completing (max_deliveries="
                    f"{max_deliveries}); the worker running it probably crashed"
                )
                self._dead_until.pop(task_id, None)
                self._dead[task_id] = DeadLetterFields(
                    lease.payload, "max deliveries exceeded", error, task, queue, wall
                )
                record = dumps(
                    {"id": task_id, "task": task, "queue": queue, "state": "dead_lettered"}
                    | {"attempts": lease.deliveries, "error_type": "MaxDeliveriesExceeded"}
                    | {"error": error, "finished_at": wall}
                )
                self._store_record(task_id, record, record_ttl)
                dead += 1
            if dead:
                self._trim_dead_letters()
        return requeued, dead

    # --------------------------------------------------------------- schedule
    async def schedule(self, items: Sequence[Scheduled]) -> None:
        """Put messages on the schedule (keyed by task_id), due on this process's clock."""
        now = time.time()
        with self._lock:
            for item in items:
                due = now + item.delay if item.eta is None else item.eta
                self._schedule[item.task_id] = (due, item.queue, item.message)
                self._announce("schedule", repr(due))

    async def promote_due(self, limit: int) -> tuple[int, float | None, float]:
        """Move up to ``limit`` messages due by this process's clock to their queues' tails."""
        now = time.time()
        with self._lock:
            sched = self._schedule
            due = sorted((eta, tid) for tid, (eta, _, _) in sched.items() if eta <= now)
            for _, task_id in due[: max(0, limit)]:
                _, queue, message = sched.pop(task_id)
                self._push(queue, message, 1)
            next_eta = min((eta for eta, _, _ in sched.values()), default=None)
            return min(len(due), max(0, limit)), next_eta, now

    # ----------------------------------------------------------- cancellation
    def _announce(self, kind: str, value: str) -> None:
        """Push an event to every :meth:`events` subscriber (lock held)."""
        for loop, inbox in self._subscribers:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(inbox.put_nowait, (kind, value))

    async def cancel(self, task_id: str, record: bytes, ttl: int) -> str:
        """Same answers as ``lua/cancel.lua``."""
        with self._lock:
            existing = self._get_record(task_id)
            state = None
            if existing is not None:
                with contextlib.suppress(SerializationError):
                    decoded = loads(existing)
                    state = decoded.get("state") if isinstance(decoded, dict) else None
            if state in ("succeeded", "failed", "dead_lettered", "cancelled", "expired"):
                return "finished"
            self._store_record(task_id, record, ttl)
            self._free_unique_of(task_id)
            if self._schedule.pop(task_id, None) is not None:
                return "scheduled"
            self._revoked[task_id] = time.time() + ttl
            self._announce("revoke", task_id)
        if state == "running":
            return "running"
        return "queued" if state else "pending"

    async def revoked(self) -> dict[str, float]:
        """Cancelled ids whose mark has not expired."""
        now = time.time()
        with self._lock:
            return {k: v for k, v in self._revoked.items() if v > now}

    async def events(self) -> AsyncIterator[tuple[str, str]]:
        """Events pushed by :meth:`cancel` and the schedule, for as long as the caller reads."""
        inbox: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        entry = (asyncio.get_running_loop(), inbox)
        with self._lock:
            self._subscribers.append(entry)
        try:
            while True:
                yield await inbox.get()
        finally:
            with self._lock:
                self._subscribers.remove(entry)

    async def scheduled_count(self) -> int:
        """Number of messages on the schedule."""
        with self._lock:
            return len(self._schedule)

    # --------------------------------------------------------------- periodic
    async def claim_periodic(
        self, name: str, occurrence: float, message: bytes, queue: str
    ) -> bool:
        """As ``lua/claim_periodic.lua``, on this process's clock, atomically."""
        now = time.time()
        with self._lock:
            last = self._periodic.get(name)
            if occurrence > now or (last is not None and now >= last >= occurrence):
                return False
            self._periodic[name] = float(occurrence)
            self._queues.add(queue)
            self._push(queue, message, 1)
            return True

    async def periodic_last(self, names: Sequence[str]) -> dict[str, float]:
        """Last dispatched occurrence of each name that has one."""
        with self._lock:
            return {n: self._periodic[n] for n in names if n in self._periodic}

    # ---------------------------------------------------------------- records
    async def get_record(self, task_id: str) -> bytes | None:
        """The stored, unexpired record of a task, or ``None``."""
        with self._lock:
            return self._get_record(task_id)

    async def set_record(self, task_id: str, record: bytes, ttl: int) -> None:
        """Store a record for ``ttl`` seconds and wake anyone waiting for it."""
        with self._lock:
            self._store_record(task_id, record, ttl)

    async def reset_tasks(self, task_ids: Sequence[str]) -> None:
        """Drop the records, progress and cancel marks of ``task_ids``."""
        with self._lock:
            for task_id in task_ids:
                self._records.pop(task_id, None)
                self._progress.pop(task_id, None)
                self._revoked.pop(task_id, None)

    async def wait_for_record(self, task_id: str, timeout: float) -> bytes | None:
        """Return the record once stored, or ``None`` after ``timeout`` seconds."""
        return await self._block(
            self._record_waiters, task_id, timeout, lambda: self._get_record(task_id)
        )

    # ----------------------------------------------------------- dead letters
    async def dead_letters(self, offset: int, limit: int) -> list[tuple[str, DeadLetterFields]]:
        """Dead letters, newest first, as ``(task_id, fields)``."""
        with self._lock:
            self._trim_dead_letters()
            ids = self._newest_first()[max(0, offset) : max(0, offset) + max(0, limit)]
            return [(tid, self._dead[tid]) for tid in ids]

    async def get_dead_letter(self, task_id: str) -> DeadLetterFields | None:
        """One dead letter, or ``None``."""
        with self._lock:
            return self._dead.get(task_id)

    async def dead_letter_count(self) -> int:
        """Number of stored dead letters (expired ones are dropped first)."""
        with self._lock:
            self._trim_dead_letters()
            return len(self._dead)

    async def replay_dead_letter(
        self,
        task_id: str,
        queue: str,
        message: bytes,
        kind: str = "",
        unique: tuple[str, float] | None = None,
    ) -> bool | str:
        """Atomically drop the dead letter and task record, publish; ``False`` if gone, the
        holder's id if another task holds the ``unique`` key (``kind`` is ignored: one kind
        of queue here)."""
        with self._lock:
            if task_id not in self._dead:
                return False
            if unique is not None:
                now = time.monotonic()
                keys, _ = self._control_state()
                held = keys.get(unique[0])
                if held is not None and held[1] > now and held[0] != task_id:
                    return held[0]
                keys[unique[0]] = (task_id, now + unique[1])
            del self._dead[task_id]
            self._records.pop(task_id, None)
            self._push(queue, message, 1)
            return True

    async def purge_dead_letters(self) -> int:
        """Delete all dead letters; return how many."""
        with self._lock:
            count, self._dead = len(self._dead), {}
            return count

    # ------------------------------------------------------------- inspection
    async def queue_stats(self, queues: Sequence[str]) -> dict[str, dict[str, int]]:
        """Per queue: waiting messages and in-flight (fetched, not completed) deliveries."""
        with self._lock:
            wait, fly = self._waiting, self._leases
            return {
                q: {"waiting": len(wait.get(q, ())), "in_flight": len(fly.get(q, ()))}
                for q in queues
            }

    async def known_queues(self) -> list[str]:
        """Queues ever published to, prepared or remembered, sorted."""
        with self._lock:
            return sorted(self._queues)

    async def remember_queues(self, queues: Sequence[str]) -> None:
        """Add queue names to the known queues."""
        with self._lock:
            self._queues.update(queues)

    async def register_worker(self, worker_id: str, info: bytes, ttl: float) -> None:
        """Record a live worker for ``ttl`` seconds."""
        with self._lock:
            self._workers[worker_id] = (info, time.monotonic() + ttl)

    async def unregister_worker(self, worker_id: str) -> None:
        """Remove a worker's registration."""
        with self._lock:
            self._workers.pop(worker_id, None)

    async def workers(self) -> dict[str, bytes]:
        """Live workers (expired registrations are dropped): id to registered info."""
        now = time.monotonic()
        with self._lock:
            for worker_id in [w for w, (_, exp) in self._workers.items() if exp <= now]:
                del self._workers[worker_id]
            return {w: info for w, (info, _) in self._workers.items()}

    async def purge_queue(self, queue: str) -> int:
        """Delete the waiting messages of ``queue`` (in-flight ones stay); return how many."""
        with self._lock:
            waiting = self._waiting.pop(queue, None)
            return len(waiting) if waiting else 0

    async def ping(self) -> None:
        """Always answers: there is no server."""

    async def close(self) -> None:
        """Nothing to release; the broker stays usable (and keeps its state)."""
