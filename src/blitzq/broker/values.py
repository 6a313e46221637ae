"""The values that cross the state seam: what a completion does, what a schedule entry and a
dead letter hold (:class:`Completion`, :class:`Scheduled`, :class:`DeadLetterFields`), a
unique task's enqueue (:class:`UniqueSend`), and a batch of completions applied in part
(:class:`HeldBack`).

Re-exported by :mod:`blitzq.broker.state` and :mod:`blitzq.broker`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from ..exceptions import BrokerError
from .effects import Op

__all__ = [
    "DEAD_LETTER_REASONS",
    "Completion",
    "DeadLetterFields",
    "HeldBack",
    "Scheduled",
    "UniqueSend",
]

#: Every ``reason`` a dead letter can have, as the writers store it: the worker (``failed``,
#: ``expired`` (past ``max_age``), ``unknown task``, ``malformed message``, ``message too
#: large``), the Redis scripts and the AMQP custody (``max deliveries exceeded``, ``malformed
#: message``; ``malformed scheduled entry``: a schedule entry the promoter cannot read, moved
#: aside so that it never blocks the others), and a listing that meets a key of another type
#: (``unreadable entry``). The filters of ``blitzq dead-letter``, ``queue.dead_letters()``
#: and the dashboard accept these only; tests/unit/test_dead_letter_reasons.py checks the
#: writers and the docs against it.
DEAD_LETTER_REASONS: tuple[str, ...] = (
    "failed",
    "expired",
    "unknown task",
    "malformed message",
    "message too large",
    "max deliveries exceeded",
    "malformed scheduled entry",
    "unreadable entry",
)


class Scheduled(NamedTuple):
    """A message to put on the schedule (see :meth:`~blitzq.broker.state.ScheduleState.schedule`).

    Attributes:
        task_id: the task's id (keys the schedule entry).
        queue: physical queue it goes to when due.
        message: the encoded message.
        delay: seconds from when the broker stores it until it is due (a ``delay=``, a
            backoff), counted on the broker's clock; ignored when ``eta`` is set.
        eta: absolute due time (Unix seconds, an ``eta=``), compared with the broker's
            clock, or ``None`` for ``delay``.
    """

    task_id: str
    queue: str
    message: bytes
    delay: float = 0.0
    eta: float | None = None


class UniqueSend(NamedTuple):
    """A message of a unique task and the key it claims (see
    :meth:`~blitzq.broker.state.ControlState.enqueue_unique`).

    Attributes:
        key: the unique key, ``<task>:<unique key>``.
        task_id: the task's id (what the key holds while claimed).
        ttl: seconds the key is held at most.
        queue: physical queue of the message.
        message: the encoded message.
        fast: written to the queue's list (the fast lane of a reliable Redis broker) rather
            than where the store writes messages.
        delay: seconds from when the broker stores it until it is due (counted on the
            broker's clock), or ``None``: due now, unless ``eta`` is set.
        eta: absolute due time (Unix seconds, compared with the broker's clock), or ``None``.
        nonce: the enqueue's mark when ``task_id`` is explicit (``Envelope.nonce``), else
            ``None``. Only when the key is claimed, in the same step, the id starts afresh
            (as :meth:`~blitzq.broker.state.RecordsState.reset_tasks` with this mark), and
            ``record`` is stored: a retry that finds the key held by its own id changes
            nothing of the live task.
        record: the ``queued`` record to store with a claim under an explicit id
            (``track_state``), or ``None``.
        record_ttl: seconds the owner mark and ``record`` live (with ``nonce``).
    """

    key: str
    task_id: str
    ttl: float
    queue: str
    message: bytes
    fast: bool = False
    delay: float | None = None
    eta: float | None = None
    nonce: str | None = None
    record: bytes | None = None
    record_ttl: int = 0


@dataclass(slots=True)
class Completion:
    """Everything that must happen, atomically, when a worker is done with one delivery.

    The delivery is acknowledged (and removed) together with whatever else is set:

    Attributes:
        queue: physical queue the delivery came from.
        token: the delivery's token (``None`` for brokers that need no ack).
        task_id: the task's id (keys the record and dead letter).
        record: encoded task record to store, or ``None``.
        record_ttl: seconds the record lives.
        reschedule: encoded message to put on the schedule (a retry), or ``None``.
        delay: seconds until the rescheduled message becomes due, counted on the broker's
            clock from when the completion is applied (never a worker's wall clock).
        dead_letter: fields of a dead letter to store, or ``None``.
        requeue: encoded message to put back at the head of ``queue`` now, or ``None``.
        ops: further effects applied in the same atomic step (typed values of
            :mod:`blitzq.broker.effects`), in order.
        fence: the token of the delivery these writes belong to when ``token`` is ``None``
            (a ``running`` record, a unique key freed at start): checked like ``token``
            (see *Fencing* in :meth:`~blitzq.broker.state.StateStore.complete`) but not
            acknowledged.
        counted: the worker's metrics' mark of the outcome to count once this completion
            is applied (an opaque ``(slot, outcome)``, set only with metrics on; a stale
            completion is never counted); never sent to the broker.
        ended: the entry of the task's end in its queue's index of ended tasks (the
            dashboard's list), ``(member, cap, ttl)``: ``"<state>\\n<task>\\n<task_id>"``,
            the newest entries kept and the index's TTL in seconds; ``None`` notes nothing.
        guard: what makes a retried write of this completion apply at most once, set by
            the store on its first try of an unfenced completion with effects (see
            *Idempotence* below): ``(batch, index, size)``, the id of the batch of that first
            try, this completion's place among the guarded ones in it and their number;
            ``None`` until then. A producer never sets it.
        nonce: the mark of the enqueue this completion's run belongs to, for a task
            enqueued under an explicit id (``Envelope.nonce``), else ``None``. The
            ``record`` is stored only while the id's owner mark (``tn:<id>``, written by the
            newest enqueue of the id) is absent or equal to it: a run of an older enqueue of
            the id writes no record over the newer one's (the rest of the completion
            applies). ``None`` (generated ids) checks nothing.
        tally: the run this completion ends, for the namespace's ``processed`` /
            ``failed`` counters: ``1`` a run that succeeded, ``2`` one that failed (an
            attempt that raised, retried or not, or a message rejected before it ran), ``0``
            none (a ``running`` record, a requeue, a cancel). Set by the worker only when
            :meth:`~blitzq.broker.state.StateStore.counts` says the store adds it to those
            counters in the same atomic step as the completion's writes (so a stale
            completion, whose writes are refused, counts nothing); never set by a producer.
        run: the same run (``1``, ``2``, ``0``) as the worker counts it in its own
            ``processed`` / ``failed``, set at every commit: a completion refused as stale
            is taken back from those counts; never sent to the broker.

    Fencing: a completion whose ``token`` (or ``fence``) names a delivery this consumer no
    longer holds (its lease lapsed and the message was recovered) is *stale*; the broker
    applies none of its writes. That holds where the state store acks the transport's
    deliveries itself (:meth:`~blitzq.broker.state.StateStore.acks`, the Redis pairings).
    With a separate ack (RabbitMQ), ``token`` is the transport's delivery tag, acked by the
    facade after the store applied the completion; RabbitMQ's pairing hands it to the
    store as ``fence``, refused once another delivery took the message again (the takes of
    redeliveries, see :meth:`~blitzq.broker.state.StateStore.complete`).

    Idempotence: a write that failed with a timeout or a dropped connection may still have
    been applied (the server read it; e.g. it was paused, and ran the buffered script when it
    resumed), and the worker writes the completion again. A fenced completion's second write
    is stale. An unfenced one (fast mode's lists, the outbox) with effects beyond its record
    (a requeue, a reschedule, a dead letter, ops: a workflow's next step, a chord's body)
    carries a :attr:`guard` that the store marks applied in the same atomic step, and a write
    that finds it marked applies nothing: each try of it may reach the server, in any order,
    and it applies once.
    """

    queue: str
    token: bytes | None
    task_id: str
    record: bytes | None = None
    record_ttl: int = 0
    reschedule: bytes | None = None
    delay: float = 0.0
    dead_letter: DeadLetterFields | None = None
    requeue: bytes | None = None
    ops: tuple[Op, ...] = ()
    fence: bytes | None = None
    counted: tuple[Any, str] | None = None
    ended: tuple[str, int, int] | None = None
    guard: tuple[str, int, int] | None = None
    nonce: str | None = None
    tally: int = 0
    run: int = 0


@dataclass(slots=True, frozen=True)
class DeadLetterFields:
    """What a broker stores for one dead letter.

    Attributes:
        message: the original encoded message (may be malformed bytes).
        reason: short machine-readable cause, one of :data:`DEAD_LETTER_REASONS`.
        error: human-readable detail.
        task: task name, or "" when the message could not be decoded.
        queue: physical queue it came from.
        failed_at: Unix time (seconds).
        kind: where the message came from in that queue: ``"s"`` (a reliable-mode stream) or
            ``"l"`` (a fast-mode list); ``""`` when unknown (a dead letter written before
            blitzq recorded it). A store paired with another transport (RabbitMQ, the spread
            layout: at-least-once) records ``"s"``. A replay goes there (a store paired with
            another transport publishes to its outbox whatever the kind).
    """

    message: bytes
    reason: str
    error: str
    task: str
    queue: str
    failed_at: float
    kind: str = ""


class HeldBack(BrokerError):
    """A batch of completions applied in part: the rest waits on a part of the broker that
    says "not now" (a Redis Cluster slot being migrated, or a node failing over), while the
    other parts took theirs (the spread layout applies each queue's completions in that
    queue's slot: ``broker/redis/spread.py``). Transient and ``unavailable``: the held
    completions are applied, unchanged, once that part is back; the worker keeps them and
    retries them per queue, applying the other queues' meanwhile (``worker/flusher.py``).

    Args:
        message: the cause (the first held part's error).
        applied: the completions applied (stale ones among them: see ``stale``).
        stale: those of ``applied`` refused as stale (fencing): nothing of them was written.
        held: the completions not applied (no part of them, or an idempotent part only:
            applying them again is safe), in the batch's order.
    """

    def __init__(
        self,
        message: str,
        applied: list[Completion],
        stale: list[Completion],
        held: list[Completion],
    ) -> None:
        super().__init__(message, unavailable=True)
        self.applied = applied
        self.stale = stale
        self.held = held
