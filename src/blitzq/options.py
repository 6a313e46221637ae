"""Per-task options: one typed value (:class:`TaskOptions`, ``task.controls``), checked once.

``@queue.task(...)`` passes its keywords to :func:`build_options` in one place. The options
of the core (retries, timeouts, executor, …) are fields of :class:`TaskOptions`; every other
option belongs to the middleware that declares it (:attr:`Middleware.task_options
<blitzq.extensions.middleware.Middleware.task_options>`: name → :class:`Option`), which
checks its value here and then plugs itself into the task (:meth:`Middleware.setup_task
<blitzq.extensions.middleware.Middleware.setup_task>`). An option nobody declares is
rejected here, with :class:`~blitzq.ConfigurationError`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .exceptions import ConfigurationError
from .limits import MAX_SECONDS

if TYPE_CHECKING:
    from .extensions.middleware import Middleware
    from .retries import RetryPolicy


def positive_seconds(label: str, value: Any) -> float | None:
    """``value`` as float seconds (``None`` stays ``None``).

    Args:
        label: how the error names the option (``"task t: max_age"``).
        value: seconds, > 0 and at most :data:`~blitzq.limits.MAX_SECONDS`.

    Raises:
        ConfigurationError: not a finite number in that range (a bool included).
    """
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
        or value > MAX_SECONDS
    ):
        raise ConfigurationError(f"{label} must be > 0 and <= {MAX_SECONDS} seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class Option:
    """One per-task option a middleware declares.

    Attributes:
        default: the value when the option is not given.
        check: ``check(label, value) -> value``: returns the value to keep (converted if need
            be) or raises :class:`~blitzq.ConfigurationError`; ``label`` names the option in
            the error (``"task t: max_age"``). ``None``: any value is kept.
    """

    default: Any = None
    check: Callable[[str, Any], Any] | None = None


@dataclass(frozen=True, slots=True)
class TaskOptions:
    """The options of one task as ``@queue.task(...)`` gave them (``task.controls``).

    Attributes:
        name, queue, retries, retry_policy, timeout, executor, store_result, dead_letter,
        priority: the core options, as given (see
            :meth:`blitzq.Queue.task`; the task holds their resolved values).
        soft_timeout: seconds before SoftTimeoutError is raised in the task, or ``None``.
        hard_timeout: seconds after which the run is stopped (alias of ``timeout``), or
            ``None``.
        extensions: the options middleware declare, checked, by name (every declared option
            is there, with its default when not given). Read one with :meth:`get` or as an
            attribute (``options.max_age``).
    """

    name: str | None = None
    queue: str | None = None
    retries: int = 3
    retry_policy: RetryPolicy | None = None
    timeout: float | None = None
    executor: str | None = None
    store_result: bool | None = None
    dead_letter: bool = True
    priority: str = "normal"
    soft_timeout: float | None = None
    hard_timeout: float | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Any:
        """The checked value of the middleware-declared option ``name``.

        Raises:
            KeyError: no middleware declares ``name``.
        """
        return self.extensions[name]

    def __getattr__(self, name: str) -> Any:
        """``options.max_age``: a middleware-declared option read as an attribute."""
        try:
            return self.extensions[name]
        except KeyError:
            raise AttributeError(name) from None


#: The core options: fields of :class:`TaskOptions` (``extensions`` aside).
CORE_OPTIONS: frozenset[str] = frozenset(
    f.name for f in dataclasses.fields(TaskOptions) if f.name != "extensions"
)


def declared_options(middleware: tuple[Middleware, ...]) -> dict[str, Option]:
    """Every option ``middleware`` declare, by name.

    Raises:
        ConfigurationError: two middleware declare the same option, or one declares a core
            option.
    """
    declared: dict[str, Option] = {}
    for m in middleware:
        for name, option in m.task_options.items():
            if name in declared or name in CORE_OPTIONS:
                raise ConfigurationError(f"per-task option {name!r} is declared twice")
            declared[name] = option
    return declared


def build_options(
    task_name: str, given: Mapping[str, Any], middleware: tuple[Middleware, ...]
) -> TaskOptions:
    """Check the options of one task, once: the middleware-declared ones with their
    middleware's check, and reject those nobody declares.

    Args:
        task_name: the task's name (for error messages).
        given: option name → value, as ``@queue.task`` received them.
        middleware: the middleware whose declared options are understood (the built-in
            ones, :func:`blitzq.extensions.builtin_middleware`).

    Raises:
        ConfigurationError: an unknown option, or a value its middleware's check refuses.
    """
    declared = declared_options(middleware)
    unknown = set(given) - CORE_OPTIONS - set(declared)
    if unknown:
        raise ConfigurationError(f"task {task_name}: unknown options {sorted(unknown)}")
    extensions: dict[str, Any] = {}
    for name, option in declared.items():
        value = given.get(name, option.default)
        if option.check is not None:
            value = option.check(f"task {task_name}: {name}", value)
        extensions[name] = value
    core = {k: v for k, v in given.items() if k in CORE_OPTIONS}
    for name in ("soft_timeout", "hard_timeout"):
        core[name] = positive_seconds(f"task {task_name}: {name}", core.get(name))
    return TaskOptions(**core, extensions=extensions)


__all__ = [
    "CORE_OPTIONS",
    "Option",
    "TaskOptions",
    "build_options",
    "declared_options",
    "positive_seconds",
]
