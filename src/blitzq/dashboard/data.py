"""What the dashboard shows, as JSON-ready dicts: queues (with rates), dead letters (filtered),
workers and periodic entries (one task: :mod:`blitzq.dashboard.tasks`).

Every function here takes the :class:`~blitzq.Queue` and reads through its public client
methods (``stats``, ``inspect``, ``get_progress``, ``dead_letters``, ``periodic_status``) or
the broker's read-only inspection (``workers``, ``get_dead_letter``). Times are Unix seconds
(``float``) unless a field's name ends in ``_local`` (an ISO 8601 date with its offset).
Nothing here depends on the web framework, so the CLI may reuse it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from ..client.admin import worker_document
from ..client.dead_letter_query import DeadLetterFilter as Criteria
from ..dead_letters import DeadLetter
from ..routing import base_queue
from ..runtime_schedules import RuntimeEntries, all_periodic_status
from ..serialization import jsonable

if TYPE_CHECKING:
    from ..queue import Queue

__all__ = [
    "DEAD_LETTER_SCAN",
    "DeadLetterFilter",
    "RateSampler",
    "dead_letters_page",
    "jsonable",
    "periodic_doc",
    "workers_doc",
]

#: Most dead letters (newest first) a filtered listing reads to find its matches.
DEAD_LETTER_SCAN = 5000
_CHUNK = 500


# ------------------------------------------------------------------ queues and rates
@dataclass
class _Sample:
    at: float
    totals: tuple[int, int]  # the namespace's (processed, failed) runs
    waiting: dict[str, int]


@dataclass
class RateSampler:
    """Rates from successive overview reads: tasks finished and failed per second (from the
    namespace's counters) and each queue's change of depth per second.

    The rates compare the newest sample with the oldest one kept; a sample older than
    ``window`` seconds is dropped, so after a pause in polling the rates are ``None`` until
    two samples at least one second apart exist inside the window again. The counts are the
    namespace's totals (``{ns}:stats`` ``processed`` / ``failed``), to which every worker
    adds what it counted with each registration write and as it unregisters
    (:meth:`~blitzq.broker.Broker.register_worker`): they only grow and hold every
    worker's runs once, so the difference between two samples is exact whenever they are
    taken, also for workers that started and stopped between them (recycled by
    ``--max-tasks-per-child``). A total that went down (the counters deleted by hand)
    counts from its new value.

    Args:
        window: seconds of samples kept.
    """

    window: float = 30.0
    _samples: deque[_Sample] = field(default_factory=deque)

    def add(
        self, totals: tuple[int, int], waiting: Mapping[str, int], now: float
    ) -> dict[str, Any]:
        """Record a sample taken at ``now`` (monotonic seconds) and return the rates:
        ``{"window": s, "completed": n, "failed": n, "completed_per_s": x, "failed_per_s": x,
        "depth_per_s": {queue: x}}`` (``completed`` / ``failed``: tasks in the window).

        Args:
            totals: the namespace's ``(processed, failed)`` runs (:meth:`counters`).
            waiting: messages waiting per queue.
            now: monotonic seconds.
        """
        self._samples.append(_Sample(now, (int(totals[0]), int(totals[1])), dict(waiting)))
        while now - self._samples[0].at > self.window:
            self._samples.popleft()
        while len(self._samples) > 256:
            self._samples.popleft()
        first = self._samples[0]
        span = now - first.at
        if span < 1.0:
            return {
                "window": None,
                "completed": None,
                "failed": None,
                "completed_per_s": None,
                "failed_per_s": None,
                "depth_per_s": {},
            }
        done = failed = 0
        before = first.totals
        for cur in islice(self._samples, 1, None):
            (processed, failures), (p0, f0) = cur.totals, before
            done += processed - p0 if processed >= p0 else processed
            failed += failures - f0 if failures >= f0 else failures
            before = cur.totals
        depth = {
            q: round((n - first.waiting[q]) / span, 3)
            for q, n in waiting.items()
            if q in first.waiting
        }
        return {
            "window": round(span, 1),
            "completed": done,
            "failed": failed,
            "completed_per_s": round(done / span, 3),
            "failed_per_s": round(failed / span, 3),
            "depth_per_s": depth,
        }


async def workers_doc(queue: Queue) -> list[dict[str, Any]]:
    """The live workers, sorted by id: ``id``, ``host``, ``pid``, ``queues``,
    ``concurrency``, ``running``, ``processed``, ``failed``, ``started_at``,
    ``heartbeat_at`` (Unix seconds; ``None`` from a worker too old to report it), ``mode``.

    Raises:
        BrokerError: the broker could not be reached.
    """
    raw = await queue.broker.workers()
    docs = [worker_document(wid, info) for wid, info in raw.items()]
    for d in docs:
        for key in (
            "host",
            "pid",
            "queues",
            "concurrency",
            "running",
            "processed",
            "failed",
            "started_at",
            "heartbeat_at",
            "mode",
        ):
            d.setdefault(key, None)
    return sorted(docs, key=lambda d: str(d["id"]))


async def queues_doc(queue: Queue, sampler: RateSampler) -> dict[str, Any]:
    """The start page: every queue's ``waiting`` and ``in_flight`` (running) messages,
    whether it is ``paused`` (``blitzq queue pause``) and its depth change per second, the
    namespace's ``scheduled`` tasks, dead letters, workers, and the tasks finished and failed
    per second (see :class:`RateSampler`).

    Raises:
        BrokerError: the broker could not be reached.
    """
    stats = await queue.stats()
    workers = await workers_doc(queue)
    counters = await queue.broker.counters()
    totals = (counters.get("processed", 0), counters.get("failed", 0))
    waiting = {q: int(c.get("waiting", 0)) for q, c in stats["queues"].items()}
    rates = sampler.add(totals, waiting, time.monotonic())
    paused = await queue.broker.paused_queues()
    rows = [
        {
            "name": name,
            "paused": name in paused or base_queue(name) in paused,
            "waiting": int(c.get("waiting", 0)),
            "in_flight": int(c.get("in_flight", 0)),
            "depth_per_s": rates["depth_per_s"].get(name),
        }
        for name, c in sorted(stats["queues"].items())
    ]
    return {
        "namespace": queue.namespace,
        "mode": queue.mode,
        "queues": rows,
        "scheduled": stats["scheduled"],
        "dead_letters": stats["dead_letters"],
        "workers": len(workers),
        "running": sum(int(w["running"] or 0) for w in workers),
        "stale_completions": stats["stale_completions"],
        "rates": {k: v for k, v in rates.items() if k != "depth_per_s"},
    }


# ------------------------------------------------------------------------ dead letters
@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a listing keeps (every given field must match): the criteria of
    ``queue.dead_letters(...)`` and ``blitzq dead-letter list``
    (:class:`~blitzq.client.dead_letter_query.DeadLetterFilter`), plus a text search.

    Attributes:
        task: exact task name.
        queue: the queue it came from: a physical name matches exactly, a base name all
            its priority levels.
        reason: exact reason, one of :data:`~blitzq.dead_letters.DEAD_LETTER_REASONS`.
        text: case-insensitive substring of the id, task name or error.
        error_type: exception type of a failed task (full name, or its last part).
        older_than: dead-lettered at least this many seconds ago.
        newer_than: dead-lettered at most this many seconds ago.

    Raises:
        ConfigurationError: ``reason`` is not a dead-letter reason, or an age is not a
            finite number of seconds >= 0 (the API answers 400).
    """

    task: str | None = None
    queue: str | None = None
    reason: str | None = None
    text: str | None = None
    error_type: str | None = None
    older_than: float | None = None
    newer_than: float | None = None

    def __post_init__(self) -> None:
        _ = self.criteria  # validates them

    @property
    def criteria(self) -> Criteria:
        """The criteria shared with the client and the CLI (all but ``text``)."""
        return Criteria(
            self.task, self.queue, self.reason, self.error_type, self.older_than, self.newer_than
        )

    @property
    def active(self) -> bool:
        """Whether any field is set."""
        return bool(self.text) or not self.criteria.empty

    def matches(self, d: DeadLetter, now: float | None = None) -> bool:
        """Whether dead letter ``d`` passes every set field, ages measured from ``now``
        (Unix seconds; default ``time.time()``)."""
        if not self.criteria.matches(d, time.time() if now is None else now):
            return False
        if self.text:
            needle = self.text.lower()
            return any(needle in s.lower() for s in (d.id, d.task, d.error))
        return True


def _letter_doc(d: DeadLetter) -> dict[str, Any]:
    return d.to_summary()  # a bounded preview of the arguments: the page re-polls the list


async def dead_letters_page(
    queue: Queue, flt: DeadLetterFilter, limit: int, offset: int
) -> dict[str, Any]:
    """A page of dead letters, newest first, filtered.

    Without a filter this is one read of ``limit`` entries from ``offset``. With one, the
    newest :data:`DEAD_LETTER_SCAN` dead letters are read in chunks and filtered;
    ``truncated`` says that older ones exist and were not looked at.

    Returns:
        ``{"total": stored, "matched": n, "truncated": bool, "items": [...]}``, each item a
        :meth:`DeadLetter.to_summary` (the arguments' preview).

    Raises:
        BrokerError: the broker could not be reached.
    """
    total = await queue.dead_letter_count()
    if not flt.active:
        items = await queue.dead_letters(limit, offset)
        return {
            "total": total,
            "matched": total,
            "truncated": False,
            "items": [_letter_doc(d) for d in items],
        }
    matched: list[DeadLetter] = []
    scanned = 0
    now = time.time()
    while scanned < min(total, DEAD_LETTER_SCAN):
        chunk = await queue.dead_letters(_CHUNK, scanned)
        if not chunk:
            break
        scanned += len(chunk)
        matched.extend(d for d in chunk if flt.matches(d, now))
    return {
        "total": total,
        "matched": len(matched),
        "truncated": scanned < total,
        "items": [_letter_doc(d) for d in matched[offset : offset + limit]],
    }


# ---------------------------------------------------------------------------- periodic
def _local(ts: float | None, zone: str) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, ZoneInfo(zone)).isoformat(timespec="seconds")


async def periodic_doc(queue: Queue, runtime: RuntimeEntries | None = None) -> list[dict[str, Any]]:
    """Each periodic entry a scheduler of ``queue`` dispatches, code-defined and run-time
    (``blitzq schedule add``): the rows of
    :func:`~blitzq.runtime_schedules.all_periodic_status` (``source`` ``"code"`` or
    ``"runtime"``) plus ``tz`` (the schedule's IANA zone: a cron's own, UTC for an interval)
    and ``next_run_local`` / ``last_run_local`` (ISO 8601 in that zone), and ``paused``
    (the dashboard paused it: its occurrences are skipped).

    Args:
        queue: the dashboard's Queue.
        runtime: the run-time entries reader to refresh (one per app: see
            :func:`~blitzq.runtime_schedules.all_periodic_status`).

    Raises:
        BrokerError: the broker could not be reached.
    """
    out = []
    paused = await queue.broker.state.browse.paused_periodic()
    for row in await all_periodic_status(queue, runtime):
        zone = row["zone"] or "UTC"
        out.append(
            row
            | {
                "tz": zone,
                "next_run_local": _local(row["next_run"], zone),
                "last_run_local": _local(row["last_run"], zone),
                "paused": row["name"] in paused,
            }
        )
    return out
