"""Signatures and composing them: chains, groups and chords (flat DAGs), with limits checked
on build.

- ``add.s(1, 2)`` describes ``add(1, 2)`` (a :class:`Signature`); in a chain the previous step's
  result is *prepended* to its arguments when it runs (``add(prev, 1, 2)``). ``add.si(1, 2)`` is
  immutable: it ignores the previous result. ``queue.sig("tasks.add", 1, 2)`` names a task this
  process did not import.

- ``chain(a, b, c)`` or ``a | b | c``: run one after another; each step gets the previous
  step's result prepended to its arguments (unless it is immutable, ``si``).
- ``group([a, b, c])``: run in parallel; its result is the list of the members' results, in
  member order.
- ``chord(group, callback)`` or ``group | callback``: run the group, then ``callback`` with the
  list of results as its first argument.

They nest: a chain may contain groups and chords, a group or chord may have chains (or
groups, chords) as members. Limits (:class:`WorkflowLimits`) are checked when a workflow is
built, so a too-deep or too-wide workflow fails in the code that builds it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from .._checks import seconds
from ..exceptions import ConfigurationError
from ..routing import check_priority, check_queue_name
from ..serialization import plain_args, plain_kwargs


class Signature:
    """One task call of a workflow: task name, arguments and a few options.

    Made by :meth:`Task.s <blitzq.Task.s>`, :meth:`Task.si <blitzq.Task.si>` or
    :meth:`Queue.sig <blitzq.Queue.sig>`; combine with ``|`` (a chain) or put in a
    :func:`~blitzq.workflow.group` / :func:`~blitzq.workflow.chord`.

    Args:
        name: the registered task name.
        args: positional arguments (plain data).
        kwargs: keyword arguments (plain data, ``str`` keys).
        immutable: ignore the previous step's result instead of prepending it.
        queue: queue to publish to (default: the task's, or the Queue's routes / name).
        priority: ``"high"``, ``"normal"`` or ``"low"`` (default: the task's).
        timeout: seconds the step may run, overriding the task's.

    Raises:
        ConfigurationError: an empty name, a bad queue, priority or timeout.
        SerializationError: an argument is not plain data.
    """

    __slots__ = ("args", "immutable", "kwargs", "name", "priority", "queue", "timeout")

    def __init__(
        self,
        name: str,
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        immutable: bool = False,
        queue: str | None = None,
        priority: str | None = None,
        timeout: float | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a signature needs a task name, got {name!r}")
        if queue is not None:
            check_queue_name("queue", queue)
        if priority is not None:
            check_priority(priority)
        if timeout is not None:  # not bool, NaN, inf or over 10 years
            timeout = seconds("timeout", timeout)
        self.name = name
        self.args: list[Any] = plain_args(tuple(args))
        self.kwargs: dict[str, Any] = plain_kwargs(dict(kwargs)) if kwargs else {}
        self.immutable = bool(immutable)
        self.queue = queue
        self.priority = priority
        self.timeout = float(timeout) if timeout is not None else None

    @property
    def depth(self) -> int:
        """Nesting depth: 1 for a signature (each enclosing chain, group or chord adds 1)."""
        return 1

    def set(
        self,
        *,
        queue: str | None = None,
        priority: str | None = None,
        timeout: float | None = None,
        immutable: bool | None = None,
    ) -> Signature:
        """A copy with some options changed (``None`` keeps the current value).

        Raises:
            ConfigurationError: a bad queue, priority or timeout.
        """
        return Signature(
            self.name,
            self.args,
            self.kwargs,
            immutable=self.immutable if immutable is None else immutable,
            queue=queue or self.queue,
            priority=priority or self.priority,
            timeout=timeout if timeout is not None else self.timeout,
        )

    def __or__(self, other: Node) -> Chain:
        """``a | b``: a chain running ``a`` then ``b`` (``b`` gets ``a``'s result)."""
        return Chain(self, other)

    def __repr__(self) -> str:
        parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
        mark = "si" if self.immutable else "s"
        return f"{self.name}.{mark}({', '.join(parts)})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Signature):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class WorkflowLimits:
    """Bounds on the shape of a workflow, checked when it is built.

    Attributes:
        max_depth: deepest nesting (a signature is 1; each enclosing chain, group or chord
            adds 1); ``BLITZQ_MAX_WORKFLOW_DEPTH`` overrides the default 10.
        max_group_size: most members of one group or chord; ``BLITZQ_MAX_GROUP_SIZE``
            overrides the default 1000.
    """

    max_depth: int = 10
    max_group_size: int = 1000


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name} must be an integer, got {raw!r}") from None
    if value < 1:
        raise ConfigurationError(f"{name} must be >= 1, got {value}")
    return value


_limits = WorkflowLimits(
    _env_int("BLITZQ_MAX_WORKFLOW_DEPTH", 10), _env_int("BLITZQ_MAX_GROUP_SIZE", 1000)
)


def workflow_limits() -> WorkflowLimits:
    """The limits in force for workflows built from now on."""
    return _limits


def set_workflow_limits(
    max_depth: int | None = None, max_group_size: int | None = None
) -> WorkflowLimits:
    """Change the limits for workflows built from now on (process-wide); ``None`` keeps one.

    Returns:
        The previous limits (to restore them later).

    Raises:
        ConfigurationError: a bound below 1.
    """
    global _limits
    previous = _limits
    depth = previous.max_depth if max_depth is None else max_depth
    size = previous.max_group_size if max_group_size is None else max_group_size
    if depth < 1 or size < 1:
        raise ConfigurationError("workflow limits must be >= 1")
    _limits = WorkflowLimits(depth, size)
    return previous


def _check_node(item: Any, where: str) -> Node:
    if not isinstance(item, Signature | Chain | Group | Chord):
        raise ConfigurationError(
            f"{where} takes signatures (task.s(...)), chains, groups or chords, got {item!r}"
        )
    return item


def _check_depth(depth: int, what: str) -> int:
    limit = _limits.max_depth
    if depth > limit:
        raise ConfigurationError(
            f"{what} is nested {depth} levels deep, over the limit of {limit} "
            "(set_workflow_limits(max_depth=...) or BLITZQ_MAX_WORKFLOW_DEPTH raises it)"
        )
    return depth


class Chain:
    """Steps run one after another; see :func:`chain`.

    Attributes:
        steps: the steps (nested chains are flattened into this one).
    """

    __slots__ = ("depth", "steps")

    def __init__(self, *steps: Node) -> None:
        flat: list[Node] = []
        for step in steps:
            _check_node(step, "chain()")
            if isinstance(step, Chain):
                flat.extend(step.steps)
            else:
                flat.append(step)
        if not flat:
            raise ConfigurationError("a chain needs at least one step")
        self.steps: tuple[Node, ...] = tuple(flat)
        self.depth: int = _check_depth(1 + max(s.depth for s in flat), "this chain")

    def __or__(self, other: Node) -> Chain:
        """``chain | step``: one more step at the end."""
        return Chain(*self.steps, other)

    def __repr__(self) -> str:
        return " | ".join(repr(s) for s in self.steps)


class Group:
    """Members run in parallel; see :func:`group`.

    Attributes:
        members: the members, in the order of the result list.
    """

    __slots__ = ("depth", "members")

    def __init__(self, members: Iterable[Node]) -> None:
        items = [_check_node(m, "group()") for m in members]
        if not items:
            raise ConfigurationError("a group needs at least one member")
        limit = _limits.max_group_size
        if len(items) > limit:
            raise ConfigurationError(
                f"this group has {len(items)} members, over the limit of {limit} "
                "(set_workflow_limits(max_group_size=...) or BLITZQ_MAX_GROUP_SIZE raises it)"
            )
        self.members: tuple[Node, ...] = tuple(items)
        self.depth: int = _check_depth(1 + max(m.depth for m in items), "this group")

    def __or__(self, other: Node) -> Chord | Chain:
        """``group | callback``: a chord when ``callback`` is a signature or a chain that
        starts with one; otherwise a chain of the group and ``other``."""
        if isinstance(other, Signature) or (
            isinstance(other, Chain) and isinstance(other.steps[0], Signature)
        ):
            return Chord(self, other)
        return Chain(self, other)

    def __repr__(self) -> str:
        return f"group([{', '.join(repr(m) for m in self.members)}])"


class Chord:
    """A group, then a callback given the list of the members' results; see :func:`chord`.

    Attributes:
        group: the header group.
        callback: a signature, or a chain whose first step is a signature.
    """

    __slots__ = ("callback", "depth", "group")

    def __init__(self, header: Group | Iterable[Node], callback: Signature | Chain) -> None:
        self.group = header if isinstance(header, Group) else Group(header)
        if not (
            isinstance(callback, Signature)
            or (isinstance(callback, Chain) and isinstance(callback.steps[0], Signature))
        ):
            raise ConfigurationError(
                "a chord's callback must be a signature (task.s(...)) or a chain starting "
                f"with one, got {callback!r}"
            )
        self.callback = callback
        self.depth: int = _check_depth(1 + max(self.group.depth - 1, callback.depth), "this chord")

    def __or__(self, other: Node) -> Chain:
        """``chord | step``: a chain of the chord and ``step`` (it gets the callback's result)."""
        return Chain(self, other)

    def __repr__(self) -> str:
        return f"chord({self.group!r}, {self.callback!r})"


#: Anything that can be applied as a workflow or be a part of one.
Node: TypeAlias = Signature | Chain | Group | Chord


def chain(*steps: Node) -> Chain:
    """Steps run one after another, each given the previous result as first argument.

    Args:
        steps: signatures, groups, chords or chains (flattened).

    Raises:
        ConfigurationError: no steps, something that is not a step, or too deep.
    """
    return Chain(*steps)


def group(*members: Node | Iterable[Node]) -> Group:
    """Members run in parallel; the result is the list of their results, in member order.

    Args:
        members: the members, as arguments or as one iterable (``group(t.s(x) for x in xs)``).

    Raises:
        ConfigurationError: no members, more than ``max_group_size``, or too deep.
    """
    if len(members) == 1 and not isinstance(members[0], Signature | Chain | Group | Chord):
        return Group(members[0])
    return Group(members)  # type: ignore[arg-type]


def chord(header: Group | Iterable[Node], callback: Signature | Chain) -> Chord:
    """Run ``header`` (a group, or its members), then ``callback`` with the list of results.

    The callback runs exactly once, after every member succeeded; if a member fails for
    good, the workflow fails and the callback never runs.

    Raises:
        ConfigurationError: an empty header, a callback that is not a signature (or a chain
            starting with one), or a limit exceeded.
    """
    return Chord(header, callback)
