"""Signatures: a task call described now and made later, as a step of a workflow.

``add.s(1, 2)`` describes ``add(1, 2)``; in a chain the previous step's result is *prepended*
to its arguments when it runs (``add(prev, 1, 2)``). ``add.si(1, 2)`` is immutable: it ignores
the previous result. ``queue.sig("tasks.add", 1, 2)`` names a task this process did not import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._checks import seconds
from ..exceptions import ConfigurationError
from ..routing import check_priority, check_queue_name
from ..serialization import plain_args, plain_kwargs

if TYPE_CHECKING:
    from .canvas import Chain, Node


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
        from .canvas import Chain

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
