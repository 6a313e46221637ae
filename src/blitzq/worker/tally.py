"""The per-run counts behind a worker's Prometheus metrics, kept at the least cost per run.

:class:`RunTally` is the runner's run observer (``Runner.observer``; the base of
:class:`~blitzq.worker.metrics.RunMetrics`). The runner calls it twice per run, synchronously
in the event loop: :meth:`RunTally.started` when the run starts and :meth:`RunTally.committed`
when its completion is handed to the writer; :meth:`RunTally.ended` counts a delivery that
ends before it runs; the writer (:class:`~blitzq.worker.flusher.Flusher`) calls
:meth:`RunTally.written` with each batch the broker applied. A worker without metrics has
no observer, so a run pays one ``is None`` check at its start and one at its commit, nothing
else.

Per run the tally does only plain-Python arithmetic on preallocated objects, and never builds
a Prometheus object (that happens when Prometheus scrapes, from :meth:`RunTally.snapshot`):

- everything a completion adds lands in one :class:`Slot` per ``(queue, task)``, found with
  one dict lookup, holding the success count as a plain int field, other outcomes in a small
  dict, and the duration histogram as a list of per-bucket counts;
- a histogram sample is one :func:`bisect.bisect_left` on the precomputed :data:`BUCKETS`
  (floats), none for a run shorter than the first bucket;
- the queue latency reuses the run's own timestamps (``job.started_at`` minus the message's
  ``enqueued_at``): no clock read; the duration takes one ``time.time()``;
- a plain success is recognised in place; only the rare other outcomes call
  :func:`~blitzq.worker.ending.outcome_kind`.

A completion the broker may refuse as stale (fencing: it carries a delivery token) is not
counted when it is committed but marked (``Completion.counted``) and counted by
:meth:`RunTally.written` once the writer's batch was applied, skipping the stale ones: each
attempt is counted once, under the outcome actually written, and no count ever goes down
(a Prometheus counter that decreases reads as a restart of the worker).

Label values are bounded: task names are capped at :data:`MAX_TASK_NAMES` distinct values
per worker, later ones counted under :data:`OTHER_TASK`; exception type names (the
``exception`` label of the failures, counted only on the rare failing path) at
:data:`MAX_EXCEPTION_NAMES`, later ones under :data:`OTHER_EXCEPTION`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import TYPE_CHECKING

from .ending import outcome_kind

if TYPE_CHECKING:
    from ..broker import Completion
    from .execution import Job

#: Most distinct task names used as label values; later names count as ``_other``.
MAX_TASK_NAMES = 100
#: The label value of task names past :data:`MAX_TASK_NAMES` (and of unreadable messages).
OTHER_TASK = "_other"

#: Most distinct exception type names used as ``exception`` label values per worker; later
#: ones count as :data:`OTHER_EXCEPTION`.
MAX_EXCEPTION_NAMES = 50
#: The ``exception`` label value of exception types past :data:`MAX_EXCEPTION_NAMES`.
OTHER_EXCEPTION = "other"
#: The outcomes of an attempt that raised, counted in ``blitzq_task_failures_total``.
FAILURE_OUTCOMES = frozenset({"failed", "retried", "dead_lettered"})

#: Outcomes counted in ``blitzq_tasks_total`` (a run put back at shutdown is not counted).
OUTCOMES = ("succeeded", "failed", "retried", "dead_lettered", "cancelled", "expired", "rejected")

#: Upper bounds (seconds, inclusive) of the histogram buckets of task durations and queue
#: latency; a last bucket, +Inf, takes the rest. All floats: ``bisect`` compares a float
#: with a float faster than with an int.
BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
)
#: The first bucket's bound: a run shorter than this skips the ``bisect``.
_FIRST = BUCKETS[0]


class Histogram:
    """Plain counts of one histogram.

    Attributes:
        counts: observations per bucket (not cumulative): ``counts[i]`` for
            ``BUCKETS[i-1] < x <= BUCKETS[i]``, the last one for ``x > BUCKETS[-1]``
            (length ``len(BUCKETS) + 1``).
        total: sum of the observations, seconds (negative ones, from clock skew between
            hosts, count in the first bucket and add 0).
    """

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Add one observation of ``value`` seconds (the runner's paths inline this)."""
        self.counts[bisect_left(BUCKETS, value)] += 1
        if value > 0.0:
            self.total += value

    @property
    def count(self) -> int:
        """Number of observations."""
        return sum(self.counts)


class Slot:
    """The counts of one ``(queue, task)`` label pair.

    Attributes:
        succeeded: runs whose outcome was ``succeeded``.
        outcomes: counts of the other outcomes (:data:`OUTCOMES`), present once non-zero.
        durations: run durations (start to commit), seconds.
    """

    __slots__ = ("durations", "outcomes", "succeeded")

    def __init__(self) -> None:
        self.succeeded = 0
        self.outcomes: dict[str, int] = {}
        self.durations = Histogram()


class RunTally:
    """Per-run counts of one worker; the runner's observer (see the module docstring).

    Attributes:
        slots: the counts by ``(queue, task label)``.
        latencies: queue latency (the message's latest enqueue to the start of its run) by
            queue.
        exception_counts: attempts that raised and failed, were retried or dead-lettered, by
            ``(queue, task label, exception label)`` (see :func:`exception_name`).
    """

    def __init__(self) -> None:
        self.slots: dict[tuple[str, str], Slot] = {}
        self.latencies: dict[str, Histogram] = {}
        self.exception_counts: dict[tuple[str, str, str], int] = {}
        self._names: set[str] = set()  # task names that have a label of their own
        self._exceptions: set[str] = set()  # exception names that have a label of their own

    def slot(self, queue: str, task: str) -> Slot:
        """The slot of ``(queue, task)``, made on first use; ``task`` past the cap (or
        ``""``) gives the queue's :data:`OTHER_TASK` slot."""
        slot = self.slots.get((queue, task))
        if slot is None:
            if task in self._names or (task and len(self._names) < MAX_TASK_NAMES):
                self._names.add(task)
            else:
                task = OTHER_TASK
            slot = self.slots.get((queue, task))
            if slot is None:
                slot = self.slots[(queue, task)] = Slot()
        return slot

    def started(self, job: Job) -> None:
        """A run of ``job`` started (``job.started_at`` set): observe its queue latency."""
        enqueued = job.envelope.enqueued_at
        if enqueued:
            latency = job.started_at - enqueued
            h = self.latencies.get(job.delivery.queue)
            if h is None:
                h = self.latencies[job.delivery.queue] = Histogram()
            h.counts[bisect_left(BUCKETS, latency)] += 1
            if latency > 0.0:
                h.total += latency

    def committed(
        self, job: Job, completion: Completion | None, error: BaseException | None, cancelled: bool
    ) -> None:
        """``job``'s completion was handed to the writer: observe its duration (when it
        started) and count its outcome, the kind the middleware get
        (:func:`~blitzq.worker.ending.outcome_kind` of the same arguments; a run put back,
        ``requeued``, or a reschedule that did not start it is not counted)."""
        slot = self.slots.get((job.delivery.queue, job.envelope.task))
        if slot is None:
            slot = self.slot(job.delivery.queue, job.envelope.task)
        started = job.started_at
        if started:
            duration = time.time() - started
            h = slot.durations
            if duration <= _FIRST:  # the common short run: no bisect
                h.counts[0] += 1
            else:
                h.counts[bisect_left(BUCKETS, duration)] += 1
            if duration > 0.0:
                h.total += duration
        # The plain success, as outcome_kind's own first test; the rest asks outcome_kind.
        if (
            error is None
            and not cancelled
            and job.encode_error is None
            and (
                completion is None
                or (
                    completion.requeue is None
                    and completion.reschedule is None
                    and completion.dead_letter is None
                )
            )
        ):
            if completion is not None and (
                completion.token is not None or completion.fence is not None
            ):  # may prove stale: counted once the broker applied it (written)
                completion.counted = (slot, "succeeded")
            else:
                slot.succeeded += 1
            return
        kind = outcome_kind(job, completion, error, cancelled)
        if kind is not None and kind != "requeued":
            self._count(slot, kind, completion)
            if error is not None and kind in FAILURE_OUTCOMES:
                self.failed(job.delivery.queue, job.envelope.task, error)

    def failed(self, queue: str, task: str, error: BaseException) -> None:
        """Count an attempt of ``task`` from physical ``queue`` that raised ``error`` (and
        failed, was retried or dead-lettered) under the exception's label: its
        :func:`exception_name`, or :data:`OTHER_EXCEPTION` past :data:`MAX_EXCEPTION_NAMES`
        distinct names. Counted when the completion is committed (a completion the broker
        then refuses as stale included: the run did raise)."""
        name = exception_name(type(error))
        if name not in self._exceptions:
            if len(self._exceptions) < MAX_EXCEPTION_NAMES:
                self._exceptions.add(name)
            else:
                name = OTHER_EXCEPTION
        label = task if task in self._names else OTHER_TASK
        key = (queue, label, name)
        self.exception_counts[key] = self.exception_counts.get(key, 0) + 1

    @staticmethod
    def _count(slot: Slot, kind: str, completion: Completion | None) -> None:
        """Count ``kind`` in ``slot`` now, or mark ``completion`` to be counted once written
        when it is fenced (it has a ``token`` or a ``fence``: the broker may refuse it)."""
        if completion is not None and (
            completion.token is not None or completion.fence is not None
        ):
            completion.counted = (slot, kind)
        elif kind == "succeeded":
            slot.succeeded += 1
        else:
            slot.outcomes[kind] = slot.outcomes.get(kind, 0) + 1

    def written(self, completions: list[Completion], stale: list[Completion]) -> None:
        """The broker applied ``completions`` except ``stale`` (refused by fencing: another
        worker recovered the delivery, and its run's completion is the one counted): count
        the outcome each applied one was marked with (``Completion.counted``), once.

        Nothing is ever taken back: a count only grows, as a Prometheus counter must.
        """
        refused = {id(c) for c in stale} if stale else None
        for c in completions:
            counted = c.counted
            if counted is None:
                continue
            c.counted = None  # counted once, whatever happens to this object next
            if refused is not None and id(c) in refused:
                continue
            slot, kind = counted
            if kind == "succeeded":
                slot.succeeded += 1
            else:
                slot.outcomes[kind] = slot.outcomes.get(kind, 0) + 1

    def ended(
        self, queue: str, task: str, outcome: str, completion: Completion | None = None
    ) -> None:
        """A delivery from physical ``queue`` ended before it ran: ``"expired"`` or
        ``"rejected"`` (``task`` may be ``""`` for a message that could not be read), with
        ``completion`` written for it: counted once the broker applied it (a stale one, whose
        delivery another worker recovered, is not counted here), or now when there is none
        or it cannot be refused."""
        self._count(self.slot(queue, task), outcome, completion)

    def snapshot(
        self,
    ) -> tuple[
        dict[tuple[str, str, str], int],
        dict[tuple[str, str], tuple[list[int], float]],
        dict[str, tuple[list[int], float]],
    ]:
        """Copies of the counts, for a scrape in another thread (the event loop is the one
        writer; each copy is one C call under the GIL, so values are from a few microseconds
        apart at worst).

        Returns:
            ``(counts, durations, latencies)``: attempts by ``(queue, task, outcome)``
            (non-zero ones); per ``(queue, task)`` that has durations, and per queue, the
            per-bucket counts (:attr:`Histogram.counts`) and the sum in seconds.
        """
        counts: dict[tuple[str, str, str], int] = {}
        durations: dict[tuple[str, str], tuple[list[int], float]] = {}
        for (queue, task), slot in list(self.slots.items()):
            succeeded = slot.succeeded
            if succeeded:
                counts[(queue, task, "succeeded")] = succeeded
            for outcome, count in list(slot.outcomes.items()):
                counts[(queue, task, outcome)] = count
            h = slot.durations
            buckets, total = list(h.counts), h.total
            if any(buckets):
                durations[(queue, task)] = (buckets, total)
        latencies = {queue: (list(h.counts), h.total) for queue, h in list(self.latencies.items())}
        return counts, durations, latencies


def exception_name(kind: type[BaseException]) -> str:
    """The qualified name of an exception type: ``ValueError`` for a builtin,
    ``module.Class`` (``blitzq.exceptions.TaskTimeout``) otherwise."""
    module = kind.__module__
    if module == "builtins":
        return kind.__qualname__
    return f"{module}.{kind.__qualname__}"


__all__ = [
    "BUCKETS",
    "MAX_EXCEPTION_NAMES",
    "MAX_TASK_NAMES",
    "OTHER_EXCEPTION",
    "OTHER_TASK",
    "OUTCOMES",
    "Histogram",
    "RunTally",
    "Slot",
    "exception_name",
]
