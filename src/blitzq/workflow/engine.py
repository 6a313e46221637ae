"""Worker-driven orchestration: what happens when a workflow step ends.

Nothing coordinates a workflow from outside. Each step's message carries, in its ``flow``
field, what comes after it; when a step ends for good, a finisher (:func:`.steps.finish_step`,
registered on every task, calls :func:`advance`) turns that into completion effects
(:mod:`blitzq.broker.effects`) applied atomically *with the ack*:

- more steps in its chain: ``WorkflowStep`` publishes the next step's message (with the
  result prepended to its arguments unless it is immutable), unless the workflow has ended;
- last step of a chord member: ``ChordMember`` records the result under the member's index (at
  most once, so a redelivered member does not count twice) and, when every member is in and
  the chord has not fired yet, fires it: publishes the callback's message with the list of
  results spliced into its arguments, or, for a group that ends the workflow, stores the
  list as the workflow's result;
- last step of the workflow: ``WorkflowDone`` stores the result and wakes ``get()``;
- a failure for good (retries exhausted, dead-lettered, cancelled): ``WorkflowFail`` stores
  the step's error and wakes ``get()``; what would have come next is never published.

The flow of a step is plain data::

    {"w": workflow id, "n": [steps after this one], "j": join or None}
    join = {"i": join id, "x": member index, "k": members, "c": callback node or absent,
            "n": [steps after the join], "j": enclosing join or None}
    node = {"s": task, "i": id, "q": queue, "a": args, "k": kwargs, "m": immutable, "t": timeout}
         | {"l": [nodes]}                     (a chain)
         | {"g": [nodes], "i": join id, "c": callback node}   ("c" absent: a plain group)

A plain group whose list feeds something other than a signature, or a chord member, goes
through one internal step (:data:`COLLECT`) that returns the list it is given.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from ..broker import Completion
from ..broker.effects import (
    ChordMember,
    Op,
    WorkflowDone,
    WorkflowFail,
    WorkflowStart,
    WorkflowStep,
)
from ..context import NO_RESULT
from ..envelope_checks import value_size
from ..exceptions import (
    ConfigurationError,
    ResultTooLarge,
    SerializationError,
    describe_error,
    unknown_outcome,
)
from ..extensions.middleware import OutgoingWorkflow
from ..extensions.signals import Signal, SignalEvent
from ..limits import CHUNK_ITEMS, DEFAULT_MAX_RESULT_SIZE
from ..routing import new_task_id, physical_queue, route
from ..serialization import Envelope, dumps, encode_envelope, loads, plain_args, to_plain
from .callback import array_header, marker, split
from .canvas import Chain, Chord, Group, Node, Signature
from .handle import WorkflowHandle
from .steps import COLLECT

if TYPE_CHECKING:
    from ..client.context import QueueContext
    from ..extensions.registry import Extensions
    from ..seams import QueueSettings
    from ..worker.execution import Job

logger = logging.getLogger("blitzq.workflow")

#: Seconds the state of a running workflow (and its chord joins) is kept at least.
RUNNING_TTL = 7 * 86400

_NONE: Any = object()  # no previous result


def _is_sig(node: Any) -> bool:
    return isinstance(node, dict) and "s" in node


class _Messages:
    """Builds the messages of a workflow's steps.

    Args:
        workflow_id: the workflow's id (also every step's correlation id).
        now: Unix time stamped on the messages.
        max_size: largest message in bytes.
        result_ttl: seconds a finished workflow's state is kept.
        max_result_size: largest result in bytes stored as a workflow's result (a chord's
            joined results included).
        headers: headers of every message built, or ``None``.

    Attributes:
        built: the envelope of every message built, in order.
    """

    def __init__(
        self,
        workflow_id: str,
        now: float,
        max_size: int,
        result_ttl: int = 86400,
        max_result_size: int = DEFAULT_MAX_RESULT_SIZE,
        headers: dict[str, Any] | None = None,
    ) -> None:
        self.workflow_id = workflow_id
        self.now = now
        self.max_size = max_size
        self.result_ttl = result_ttl
        self.max_result_size = max_result_size
        self.headers = headers or None
        self.built: list[Envelope] = []

    def start(
        self, node: dict[str, Any], prev: Any, rest: list[Any], join: Any
    ) -> list[tuple[str, bytes]]:
        """``(queue, message)`` of every step that starts when ``node`` starts.

        Args:
            node: the node to start.
            prev: the previous step's result, or ``_NONE``.
            rest: nodes that follow ``node`` in its chain.
            join: the join ``node``'s chain reports to at its end, or ``None``.
        """
        if "s" in node:
            return [self.message(node, prev, rest, join)]
        if "l" in node:
            steps = node["l"]
            return self.start(steps[0], prev, [*steps[1:], *rest], join)
        members = node["g"]
        base = {"i": node["i"], "k": len(members), "n": rest, "j": join}
        if "c" in node:
            base["c"] = node["c"]
        out: list[tuple[str, bytes]] = []
        for index, member in enumerate(members):
            out += self.start(member, prev, [], {**base, "x": index})
        return out

    def message(
        self,
        node: dict[str, Any],
        prev: Any,
        rest: list[Any],
        join: Any,
        queue: str | None = None,
    ) -> tuple[str, bytes]:
        """``(queue, message)`` of one signature node."""
        args = node["a"] if node.get("m") or prev is _NONE else [prev, *node["a"]]
        target = queue or node["q"]
        env = Envelope(
            id=node["i"],
            task=node["s"],
            queue=target,
            args=plain_args(args),
            kwargs=to_plain(node.get("k") or {}),
            created_at=self.now,
            enqueued_at=self.now,
            correlation_id=self.workflow_id,
            headers=dict(self.headers) if self.headers else None,
            timeout=node.get("t"),
            flow=to_plain({"w": self.workflow_id, "n": rest, "j": join}),
        )
        self.built.append(env)
        return target, encode_envelope(env, self.max_size)

    def chord_op(
        self, join: dict[str, Any], result: bytes, member_queue: str, ttl: int
    ) -> ChordMember:
        """The ``ChordMember`` effect of one member's result (see the module docstring)."""
        size = int(join["k"])
        callback, rest, parent = join.get("c"), list(join.get("n") or ()), join.get("j")
        if callback is None:
            if not rest and parent is None:  # the group ends the workflow: its list is the result
                return self._chord(join, result, size, ttl, "", array_header(size), b"", 1)
            if rest and _is_sig(rest[0]):  # group | signature: the signature is the callback
                callback, rest = rest[0], rest[1:]
            else:
                callback = {"s": COLLECT, "i": f"{join['i']}c", "q": "", "a": [], "k": {}}
        while "l" in callback:
            rest = [*callback["l"][1:], *rest]
            callback = callback["l"][0]
        queue = member_queue if callback["s"] == COLLECT else None
        if callback.get("m"):
            target, data = self.message(callback, _NONE, rest, parent, queue)
            return self._chord(join, result, size, ttl, target, data, b"", 0)
        placeholder = marker()
        target, data = self.message(callback, placeholder, rest, parent, queue)
        head, tail = split(data, placeholder, size)
        return self._chord(join, result, size, ttl, target, head, tail, 1)

    def _chord(
        self,
        join: dict[str, Any],
        result: bytes,
        size: int,
        ttl: int,
        queue: str,
        head: bytes,
        tail: bytes,
        splice: int,
    ) -> ChordMember:
        return ChordMember(
            self.workflow_id,
            str(join["i"]),
            str(join["x"]),
            size,
            result,
            ttl,
            "",
            queue,
            head,
            tail,
            self.now,
            splice,
            self.result_ttl,
            self.max_size if queue else self.max_result_size,
        )


def _running_ttl(queue: QueueSettings) -> int:
    return max(queue.result_ttl, RUNNING_TTL)


def advance(
    job: Job,
    completion: Completion,
    error: BaseException | None,
    flow: dict[str, Any],
    workflow_id: str,
) -> Completion:
    """Add the ops that advance (or fail) workflow ``workflow_id`` to ``completion``: the end
    for good of a step whose message's ``flow`` is ``flow`` (:func:`.steps.finish_step`
    calls it; a failure to plan the follow-ups fails the workflow, never the ack).

    Args:
        job: the step's job.
        completion: its completion (its ``ops`` are extended).
        error: the step's error (``None`` if it succeeded).
        flow: the step's ``flow`` field (see this module's docstring).
        workflow_id: ``flow["w"]``.
    """
    queue = job.task.owner
    now = time.time()
    try:
        ops = _follow_ups(job, completion, error, flow, queue, now)
    except Exception as exc:  # never lose the ack: the workflow fails with the reason
        step = job.envelope.id
        logger.exception("workflow %s: could not advance after step %s", workflow_id, step)
        error_type, message = describe_error(exc)
        ops = (_fail(workflow_id, "failed", error_type, message, step, queue, now),)
    completion.ops = (*completion.ops, *ops)
    return completion


def _fail(
    workflow_id: str,
    state: str,
    error_type: str,
    error: str,
    step: str,
    queue: QueueSettings,
    now: float,
) -> WorkflowFail:
    return WorkflowFail(workflow_id, state, error_type, error, step, queue.result_ttl, now)


def _follow_ups(
    job: Job,
    completion: Completion,
    error: BaseException | None,
    flow: dict[str, Any],
    queue: QueueSettings,
    now: float,
) -> tuple[Op, ...]:
    workflow_id = str(flow["w"])
    step = job.envelope.id
    if error is None and job.result is not NO_RESULT:
        try:
            result = dumps(job.result)
            if value_size(result) > queue.max_result_size:
                raise ResultTooLarge(value_size(result), queue.max_result_size)
        except SerializationError as exc:
            return (_fail(workflow_id, "failed", *describe_error(exc), step, queue, now),)
        build = _Messages(
            workflow_id, now, queue.max_message_size, queue.result_ttl, queue.max_result_size
        )
        rest, join = list(flow.get("n") or ()), flow.get("j")
        if rest:
            return tuple(
                WorkflowStep(workflow_id, target, data)
                for target, data in build.start(rest[0], job.result, rest[1:], join)
            )
        if join:
            return (build.chord_op(join, result, job.delivery.queue, _running_ttl(queue)),)
        return (WorkflowDone(workflow_id, result, queue.result_ttl, now),)
    state, error_type, message = "failed", "", ""
    if completion.record is not None:
        try:
            record = loads(completion.record)
        except SerializationError:
            record = {}
        if isinstance(record, dict):
            state = "cancelled" if record.get("state") == "cancelled" else "failed"
            error_type = str(record.get("error_type") or "")
            message = str(record.get("error") or "")
    if not error_type and error is not None:
        error_type, message = describe_error(error)
    if not error_type:
        error_type, message = "WorkflowStepFailed", f"step {step} ended without a result"
    return (_fail(workflow_id, state, error_type, message, step, queue, now),)


# ----------------------------------------------------------------------------- applying
class _Planner:
    """Turns a canvas into plan nodes with fresh step ids and resolved queues (a step's id
    made by the broker's ``task_ids`` when it has one: on a Redis Cluster's spread layout a
    step's record then lives in its queue's slot)."""

    def __init__(self, queue: QueueContext) -> None:
        self.queue = queue
        self.ids = queue.broker.task_ids
        #: ``[id, task, queue]`` of every step the user wrote, in order.
        self.steps: list[list[str]] = []

    def node(self, item: Node) -> dict[str, Any]:
        if isinstance(item, Signature):
            return self.signature(item)
        if isinstance(item, Chain):
            return {"l": [self.node(step) for step in item.steps]}
        if isinstance(item, Group):
            return {"g": [self.node(m) for m in item.members], "i": uuid.uuid4().hex[:16]}
        node = self.node(item.group)
        node["c"] = self.node(item.callback)
        return node

    def signature(self, sig: Signature) -> dict[str, Any]:
        queue = self.queue
        task = queue.tasks.get(sig.name)
        base = sig.queue or (task.queue if task else None)
        base = base or route(queue.routes, sig.name) or queue.name
        target = physical_queue(base, sig.priority or (task.priority if task else "normal"))
        step_id = new_task_id() if self.ids is None else self.ids(target)
        self.steps.append([step_id, sig.name, target])
        node: dict[str, Any] = {"s": sig.name, "i": step_id, "q": target, "a": sig.args}
        if sig.kwargs:
            node["k"] = sig.kwargs
        if sig.immutable:
            node["m"] = 1
        if sig.timeout is not None:
            node["t"] = sig.timeout
        return node


async def apply_workflow(
    queue: QueueContext, workflow: Node, extensions: Extensions, known: set[str]
) -> WorkflowHandle:
    """Start ``workflow`` on ``queue``'s broker; see :meth:`blitzq.Queue.apply`.

    The workflow's state and its first steps are written in one atomic broker call (the
    steps past the first :data:`~blitzq.limits.CHUNK_ITEMS` in further calls).

    Raises:
        ConfigurationError: ``workflow`` is not a signature, chain, group or chord.
        SerializationError, MessageTooLarge: a step's message cannot be built.
        OutcomeUnknown: the broker stopped answering after the start was sent (``.task_id``:
            the workflow id); the workflow may have started.
        BrokerError: the broker could not be reached.
    """
    if not isinstance(workflow, Signature | Chain | Group | Chord):
        raise ConfigurationError(
            f"apply() takes a signature, chain, group or chord, got {workflow!r}"
        )
    workflow_id = new_task_id()  # in every step's message (correlation id and flow)
    planner = _Planner(queue)
    root = planner.node(workflow)
    now = time.time()
    build = _Messages(workflow_id, now, queue.max_message_size)
    messages = build.start(root, _NONE, [], None)
    outgoing: OutgoingWorkflow | None = None
    if extensions.has_apply_hooks:
        outgoing = OutgoingWorkflow(workflow_id, queue.name, tuple(build.built))
        await extensions.before_apply(outgoing)
        if outgoing.headers:
            build = _Messages(workflow_id, now, queue.max_message_size, headers=outgoing.headers)
            messages = build.start(root, _NONE, [], None)
    ops: list[Op] = [WorkflowStart(workflow_id, dumps(planner.steps), _running_ttl(queue), now)]
    ops += [WorkflowStep(workflow_id, target, data) for target, data in messages]
    broker = queue.broker
    new = sorted({target for _, _, target in planner.steps} - known)
    if new:
        await broker.remember_queues(new)
        known.update(new)
    # The state and the first steps go in one atomic call; a workflow starting more than
    # CHUNK_ITEMS steps at once (a big group) publishes the rest in further calls of that
    # size, so no call holds the server long.
    with unknown_outcome("workflow start", (workflow_id,)):
        for start in range(0, len(ops), CHUNK_ITEMS):
            chunk = tuple(ops[start : start + CHUNK_ITEMS])
            await broker.complete([Completion(queue.name, None, workflow_id, ops=chunk)])
    if outgoing is not None:
        await extensions.after_apply(outgoing)
    signals = extensions.signals
    if signals.has(Signal.WORKFLOW_STARTED):
        first = [env.id for env in build.built]
        extra = {"workflow_id": workflow_id, "steps": len(planner.steps), "first_steps": first}
        event = SignalEvent(Signal.WORKFLOW_STARTED, queue=queue.name, extra=extra)
        await signals.emit(Signal.WORKFLOW_STARTED, event)
    return WorkflowHandle(queue, workflow_id, planner.steps)
