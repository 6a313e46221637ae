"""Completion effects: typed values a :class:`~blitzq.broker.state.Completion` carries.

Each effect is applied by the state store in the same atomic step as the completion that
carries it (see :meth:`~blitzq.broker.state.StateStore.complete`). Producers (workflows,
unique tasks, locks, progress) build these values; :func:`encode_op` is the one place that
turns them into the wire tuple a store applies: ``(name, item, ...)`` with items of type
str, int, float or bytes, read by ``redis/lua/complete.lua`` (its ``OPS`` table, by the
names in :data:`COMPLETION_OPS`).

Adding an effect: a frozen Struct here, its case in :func:`encode_op` and its name in
:data:`COMPLETION_OPS`, its handler in ``complete.lua``, a test in ``tests/contract/``.
"""

from __future__ import annotations

from typing import TypeAlias, assert_never

import msgspec

from ..exceptions import BrokerError

#: One item of an encoded effect.
WireItem: TypeAlias = str | int | float | bytes


class Publish(msgspec.Struct, frozen=True):
    """Publish a message to a queue together with the completion.

    Attributes:
        queue: physical queue name.
        message: the encoded message.
        kind: ``"s"`` (a stream) or ``"l"`` (a list) to publish to, or ``""`` for the
            broker's own mode.
    """

    queue: str
    message: bytes
    kind: str = ""


class WorkflowStart(msgspec.Struct, frozen=True):
    """Create a running workflow's state.

    Attributes:
        workflow_id: the workflow's id.
        steps: the encoded step table (MessagePack), stored as is.
        ttl: seconds the state lives while the workflow runs.
        now: creation time, Unix seconds (stored as ``created_at``).
    """

    workflow_id: str
    steps: bytes
    ttl: int
    now: float


class WorkflowStep(msgspec.Struct, frozen=True):
    """Publish a workflow step's message unless the workflow has ended.

    Attributes:
        workflow_id: the workflow's id.
        queue: physical queue of the step.
        message: the step's encoded message.
        kind: ``"s"``, ``"l"`` or ``""`` (the broker's own mode), as for :class:`Publish`.
    """

    workflow_id: str
    queue: str
    message: bytes
    kind: str = ""


class WorkflowDone(msgspec.Struct, frozen=True):
    """A running workflow succeeded: store its result and notify waiters.

    Attributes:
        workflow_id: the workflow's id.
        result: the encoded result.
        ttl: seconds the finished state lives.
        now: finishing time, Unix seconds.
    """

    workflow_id: str
    result: bytes
    ttl: int
    now: float


class WorkflowFail(msgspec.Struct, frozen=True):
    """End a running workflow failed or cancelled and notify waiters.

    Attributes:
        workflow_id: the workflow's id.
        state: ``"failed"`` or ``"cancelled"``.
        error_type: qualified name of the error's type (``""`` when none).
        error: human-readable detail.
        step: id of the step that ended it.
        ttl: seconds the finished state lives.
        now: finishing time, Unix seconds.
    """

    workflow_id: str
    state: str
    error_type: str
    error: str
    step: str
    ttl: int
    now: float


class ChordMember(msgspec.Struct, frozen=True):
    """Record a chord member's result once; the last member fires the callback once.

    The callback's body is ``head`` + the members' results (spliced in as an array when
    ``splice`` is 1) + ``tail``. With ``queue`` ``""`` the results become the workflow's
    result instead; a body over ``max_bytes`` fails the workflow with ``ResultTooLarge``.

    Attributes:
        workflow_id: the workflow's id.
        join: the chord's join id within the workflow.
        index: this member's position in the group, as decimal text (a hash field).
        size: number of members.
        result: this member's encoded result.
        ttl: seconds the join state lives while it waits.
        kind: ``"s"``, ``"l"`` or ``""`` (the broker's own mode) for the callback's queue.
        queue: physical queue of the callback, or ``""`` (see above).
        head: bytes of the callback's message before the results.
        tail: bytes of the callback's message after the results.
        now: Unix seconds (marks the join fired; a finishing time).
        splice: 1 to splice the results between ``head`` and ``tail``, 0 to send ``head`` +
            ``tail`` as they are.
        result_ttl: seconds a fired join (and a finished workflow) is kept.
        max_bytes: largest body allowed, in bytes (0: no bound).
    """

    workflow_id: str
    join: str
    index: str
    size: int
    result: bytes
    ttl: int
    kind: str
    queue: str
    head: bytes
    tail: bytes
    now: float
    splice: int
    result_ttl: int
    max_bytes: int = 0


class UniqueRelease(msgspec.Struct, frozen=True):
    """Free a unique-task key while it still holds this task's id.

    Attributes:
        key: the unique key (namespace-relative).
        task_id: the id the key must hold to be freed.
    """

    key: str
    task_id: str


class LockRelease(msgspec.Struct, frozen=True):
    """Give back a holder's place of a task lock.

    Attributes:
        key: the lock's key (namespace-relative).
        holder: the place's holder name.
    """

    key: str
    holder: str


class Progress(msgspec.Struct, frozen=True):
    """Store a run's last progress update unless a newer one is stored; publish it.

    Attributes:
        task_id: the task's id.
        at: when the update was made, Unix seconds.
        data: the encoded update.
        ttl: seconds the update is kept.
    """

    task_id: str
    at: float
    data: bytes
    ttl: int


#: Every completion effect.
Op: TypeAlias = (
    Publish
    | WorkflowStart
    | WorkflowStep
    | WorkflowDone
    | WorkflowFail
    | ChordMember
    | UniqueRelease
    | LockRelease
    | Progress
)

#: The registry: wire name of each effect (the first item :func:`encode_op` writes).
COMPLETION_OPS: dict[type[Op], str] = {
    Publish: "publish",
    WorkflowStart: "workflow_start",
    WorkflowStep: "workflow_step",
    WorkflowDone: "workflow_done",
    WorkflowFail: "workflow_fail",
    ChordMember: "chord",
    UniqueRelease: "unique_release",
    LockRelease: "lock_release",
    Progress: "progress",
}


def encode_op(op: Op) -> tuple[WireItem, ...]:
    """The wire tuple of ``op``: its name (:data:`COMPLETION_OPS`), then its items in the
    order ``complete.lua`` reads them; times travel as ``repr`` of the float.

    Raises:
        BrokerError: (not transient) ``op`` is not a completion effect.
    """
    name = COMPLETION_OPS.get(type(op))
    if name is None:
        raise BrokerError(f"unknown completion op {op!r}", transient=False)
    match op:
        case Publish():
            return (name, op.kind, op.queue, op.message)
        case WorkflowStart():
            return (name, op.workflow_id, op.steps, op.ttl, repr(op.now))
        case WorkflowStep():
            return (name, op.workflow_id, op.kind, op.queue, op.message)
        case WorkflowDone():
            return (name, op.workflow_id, op.result, op.ttl, repr(op.now))
        case WorkflowFail():
            return (
                name,
                op.workflow_id,
                op.state,
                op.error_type,
                op.error,
                op.step,
                op.ttl,
                repr(op.now),
            )
        case ChordMember():
            return (
                name,
                op.workflow_id,
                op.join,
                op.index,
                op.size,
                op.result,
                op.ttl,
                op.kind,
                op.queue,
                op.head,
                op.tail,
                repr(op.now),
                op.splice,
                op.result_ttl,
                op.max_bytes,
            )
        case UniqueRelease():
            return (name, op.key, op.task_id)
        case LockRelease():
            return (name, op.key, op.holder)
        case Progress():
            return (name, op.task_id, repr(op.at), op.data, op.ttl)
        case _:  # pragma: no cover - every registered type has its case
            assert_never(op)


def op_size(op: Op) -> int:
    """Approximate bytes ``op`` sends to the store (str and bytes items by length, others 8).

    Raises:
        BrokerError: (not transient) ``op`` is not a completion effect.
    """
    return sum(len(item) if isinstance(item, bytes | str) else 8 for item in encode_op(op))
