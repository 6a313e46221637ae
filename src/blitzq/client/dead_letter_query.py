"""Choosing dead letters by what they are: :class:`DeadLetterFilter`, the scan that applies
it, grouped counts, and the outcome of replaying one (:class:`ReplayOutcome`).

The filters of ``queue.dead_letters(task=..., queue=..., reason=..., error_type=...,
older_than=..., newer_than=...)``, ``dead_letter_summary``, ``retry_dead_letters`` and
``purge_dead_letters`` (:class:`~blitzq.client.admin.Admin`), and of ``blitzq dead-letter``.
A filtered call reads the dead letters page by page (:data:`PAGE` at a time, newest first)
and keeps those that match, so its cost grows with the number stored (at most
``dead_letter_cap``), not with the number that match.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from .._checks import seconds, text
from ..broker import Broker
from ..dead_letters import DeadLetter, check_reason
from ..routing import base_queue

__all__ = [
    "PAGE",
    "DeadLetterFilter",
    "Pacer",
    "ReplayOutcome",
    "replay_counts",
    "scan",
    "summarize",
]

#: Dead letters read per broker call while a filter is applied.
PAGE = 500


@dataclass(frozen=True, slots=True)
class DeadLetterFilter:
    """Which dead letters an operation applies to; every criterion given must hold.

    Args:
        task: the task name, exactly.
        queue: the queue it came from: a physical name (``emails:high``) matches exactly, a
            base name (``emails``) matches all its priority levels.
        reason: the reason, exactly: one of :data:`~blitzq.dead_letters.DEAD_LETTER_REASONS`
            (``"failed"``, ``"expired"``, ``"unknown task"``, ...).
        error_type: the exception type of a failed task (:attr:`DeadLetter.error_type`): the
            full dotted name, or its last part (``Gone`` matches ``myapp.errors.Gone``).
        older_than: dead-lettered at least this many seconds ago.
        newer_than: dead-lettered at most this many seconds ago.

    Raises:
        ConfigurationError: a criterion that is not a string, a reason not in
            :data:`~blitzq.dead_letters.DEAD_LETTER_REASONS`, or an age that is not a
            finite number of seconds >= 0.
    """

    task: str | None = None
    queue: str | None = None
    reason: str | None = None
    error_type: str | None = None
    older_than: float | None = None
    newer_than: float | None = None

    def __post_init__(self) -> None:
        criteria = (
            ("task", self.task),
            ("queue", self.queue),
            ("reason", self.reason),
            ("error_type", self.error_type),
        )
        for name, given in criteria:
            text(name, given)
        check_reason(self.reason)
        for name, value in (("older_than", self.older_than), ("newer_than", self.newer_than)):
            if value is not None:
                object.__setattr__(self, name, seconds(name, value, strict=False))

    @property
    def empty(self) -> bool:
        """Whether no criterion is given (every dead letter matches)."""
        return all(
            v is None
            for v in (
                self.task,
                self.queue,
                self.reason,
                self.error_type,
                self.older_than,
                self.newer_than,
            )
        )

    def matches(self, dl: DeadLetter, now: float) -> bool:
        """Whether ``dl`` meets every criterion at ``now`` (Unix seconds)."""
        if self.task is not None and dl.task != self.task:
            return False
        if self.queue is not None and self.queue not in (dl.queue, base_queue(dl.queue)):
            return False
        if self.reason is not None and dl.reason != self.reason:
            return False
        if self.error_type is not None:
            kind = dl.error_type
            if not kind or (kind != self.error_type and not kind.endswith("." + self.error_type)):
                return False
        if self.older_than is not None and dl.failed_at > now - self.older_than:
            return False
        return self.newer_than is None or dl.failed_at >= now - self.newer_than


async def scan(
    broker: Broker, flt: DeadLetterFilter, now: float | None = None
) -> AsyncIterator[DeadLetter]:
    """The dead letters that match ``flt``, newest first, read :data:`PAGE` at a time.

    Args:
        broker: the broker to read.
        flt: the criteria.
        now: the time ages are measured from (Unix seconds; default ``time.time()``, the
            clock ``failed_at`` is stamped with).

    Raises:
        BrokerError: the broker could not be reached.
    """
    now = time.time() if now is None else now
    offset = 0
    while True:
        rows = await broker.dead_letters(offset, PAGE)
        for task_id, f in rows:
            dl = DeadLetter.from_fields(
                task_id, f.message, f.reason, f.error, f.task, f.queue, f.failed_at, f.kind
            )
            if flt.matches(dl, now):
                yield dl
        if len(rows) < PAGE:
            return
        offset += len(rows)


def summarize(letters: Iterable[DeadLetter]) -> dict[str, Any]:
    """Counts of ``letters``: ``{"total": n, "by_task": {...}, "by_reason": {...},
    "by_error_type": {...}, "by_queue": {...}}``, each group largest first (an empty task
    name or error type is counted under ``""``)."""
    groups: dict[str, Counter[str]] = {
        key: Counter() for key in ("task", "reason", "error_type", "queue")
    }
    total = 0
    for dl in letters:
        total += 1
        groups["task"][dl.task] += 1
        groups["reason"][dl.reason] += 1
        groups["error_type"][dl.error_type] += 1
        groups["queue"][dl.queue] += 1
    out: dict[str, Any] = {"total": total}
    for key, counts in groups.items():
        out[f"by_{key}"] = dict(counts.most_common())
    return out


@dataclass(frozen=True, slots=True)
class ReplayOutcome:
    """What replaying one dead letter did (``retry_dead_letters``).

    Attributes:
        id: the dead letter's task id.
        task: its task name.
        queue: the queue it goes back to.
        outcome: ``"replayed"`` (published again: waiting for a worker, or already run);
            ``"dead-lettered again"`` (published again, and a dead letter again by the time
            the batch ended: a worker refused or failed it at once); ``"dry run"`` (nothing
            done); ``"gone"`` (replayed or purged meanwhile); ``"held"`` (another task holds
            its unique key: kept); ``"refused"`` (kept, not published: its message is
            malformed or too large, or has a field a worker would dead-letter it for at
            once, as ``malformed message``).
        detail: the holder's id for ``"held"``, the error for ``"refused"``, the new dead
            letter's ``"<reason>: <error>"`` for ``"dead-lettered again"``, else ``""``.
    """

    id: str
    task: str
    queue: str
    outcome: Literal["replayed", "dead-lettered again", "dry run", "gone", "held", "refused"]
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form (for ``--json`` output)."""
        return {
            "id": self.id,
            "task": self.task,
            "queue": self.queue,
            "outcome": self.outcome,
            "detail": self.detail,
        }


def replay_counts(outcomes: Iterable[ReplayOutcome]) -> dict[str, int]:
    """The tally of a bulk replay, every key present: ``replayed`` (published again, those
    dead-lettered again included), ``dead_lettered_again`` (of those, the ones that were a
    dead letter again when the batch ended), ``refused``, ``held``, ``gone`` and ``dry_run``;
    what ``blitzq dead-letter replay --all`` and the dashboard print."""
    counts = dict.fromkeys(
        ("replayed", "dead_lettered_again", "refused", "held", "gone", "dry_run"), 0
    )
    for o in outcomes:
        if o.outcome == "dead-lettered again":
            counts["replayed"] += 1
            counts["dead_lettered_again"] += 1
        else:
            counts[o.outcome.replace(" ", "_")] += 1
    return counts


class Pacer:
    """Spaces the starts of successive calls at least ``1 / rate`` seconds apart: the cap of
    ``retry_dead_letters(rate=...)``. A call that started late (a slow broker, a busy
    machine) does not let the next ones catch up in a burst: each waits its interval from
    the start of the one before.

    Args:
        rate: most starts per second (> 0).
        clock: monotonic seconds (``time.monotonic``; a test passes its own).
        sleep: awaited with the seconds to wait (``asyncio.sleep``).
    """

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._interval = 1.0 / rate
        self._clock = clock
        self._sleep = sleep
        self._next: float | None = None

    async def wait(self) -> None:
        """Return when the next call may start (at once for the first)."""
        if self._next is not None:
            delay = self._next - self._clock()
            if delay > 0:
                await self._sleep(delay)
        self._next = self._clock() + self._interval
