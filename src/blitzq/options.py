"""Per-task options: one typed value (:class:`TaskOptions`, ``task.controls``), checked once.

``@queue.task(...)`` passes its keywords to :func:`build_options` in one place. The options
of the core (retries, timeouts, executor, …) are fields of :class:`TaskOptions`; every other
option belongs to the middleware that declares it (:attr:`Middleware.task_options
<blitzq.extensions.middleware.Middleware.task_options>`: name → :class:`Option`), which
checks its value here and then plugs itself into the task (:meth:`Middleware.setup_task
<blitzq.extensions.middleware.Middleware.setup_task>`). An option nobody declares is
rejected here, with :class:`~blitzq.ConfigurationError`.

The options of one enqueue (``task.options(delay=..., ...)``) are :class:`CallOptions`, checked
when they are made.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ._checks import integer, seconds, text
from .exceptions import ConfigurationError
from .limits import MAX_ATTEMPT, MAX_SECONDS
from .routing import check_priority, check_queue_name, check_task_id

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .retries import RetryPolicy


def positive_seconds(label: str, value: Any) -> float | None:
    """``value`` as float seconds (``None`` stays ``None``).

    Args:
        label: how the error names the option (``"task t: max_age"``).
        value: seconds (or a ``timedelta``), > 0 and at most :data:`~blitzq.limits.MAX_SECONDS`.

    Raises:
        ConfigurationError: not a finite number in that range (a bool included); a
            timedelta out of range gets the same error, naming its seconds.
    """
    if value is None:
        return None
    given = repr(value)
    if isinstance(value, _dt.timedelta):
        value = value.total_seconds()
        given = f"a timedelta of {value:g} s"
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
        or value > MAX_SECONDS
    ):
        raise ConfigurationError(f"{label} must be > 0 and <= {MAX_SECONDS} seconds, got {given}")
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
        mode: ``"fast"``: the task's messages travel the at-most-once path (Redis lists)
            while its Queue is reliable; ``None``: the Queue's ``mode``.
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
    mode: str | None = None
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


class DeclaresOptions(Protocol):
    """What the option checks read of a middleware: the per-task options it declares
    (:attr:`blitzq.Middleware.task_options`)."""

    @property
    def task_options(self) -> Mapping[str, Option]:
        """Option name → its :class:`Option` (default and check)."""
        ...

    @property
    def call_options(self) -> Mapping[str, Option]:
        """Per-call option name → its :class:`Option` (the check; the default is unused)."""
        ...


def declared_options(middleware: Sequence[DeclaresOptions]) -> dict[str, Option]:
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


def declared_call_options(middleware: Sequence[DeclaresOptions]) -> dict[str, Option]:
    """Every per-call option ``middleware`` declare (:attr:`blitzq.Middleware.call_options`),
    by name.

    Raises:
        ConfigurationError: two middleware declare the same one, or one declares a core call
            option (a field of :class:`CallOptions`).
    """
    declared: dict[str, Option] = {}
    for m in middleware:
        for name, option in m.call_options.items():
            if name in declared or name in CORE_CALL_OPTIONS:
                raise ConfigurationError(f"per-call option {name!r} is declared twice")
            declared[name] = option
    return declared


def build_options(
    task_name: str, given: Mapping[str, Any], middleware: Sequence[DeclaresOptions]
) -> TaskOptions:
    """Check the options of one task, once: the middleware-declared ones with their
    middleware's check, and reject those nobody declares.

    Args:
        task_name: the task's name (for error messages).
        given: option name → value, as ``@queue.task`` received them.
        middleware: the middleware whose declared options are understood (the built-in
            ones, :func:`blitzq.extensions.builtin_middleware`, then the Queue's:
            :func:`blitzq.registration.task_middleware`).

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
    if core.get("mode") not in (None, "fast"):
        raise ConfigurationError(
            f"task {task_name}: mode must be 'fast' (at-most-once, Redis lists) or None (the "
            f"Queue's mode), got {core['mode']!r}; a task cannot ask for a stronger guarantee "
            "than its Queue's: make the Queue reliable instead"
        )
    return TaskOptions(**core, extensions=extensions)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


#: What an ``eta`` before Unix time 0 is told, in either form (a number or a datetime).
_BEFORE_1970 = (
    "eta must not be before 1970-01-01 00:00 UTC (Unix time 0; a later time in the past "
    "runs at once)"
)


def _check_eta(eta: object) -> None:
    """Refuse an ``eta`` that is not a finite Unix time >= 0: a bool, NaN, an infinity, a
    negative number, a naive datetime (whose zone only the caller knows), or an aware
    datetime before 1970. A number and a datetime agree: Unix time 0 and
    ``1970-01-01T00:00Z`` are both taken (and run at once, being past), ``-1`` and
    ``1969-12-31T23:59:59Z`` both refused, with the same words."""
    if isinstance(eta, _dt.datetime):
        if eta.tzinfo is None:
            raise ConfigurationError(f"eta must be a timezone-aware datetime, got {eta!r}")
        if eta.timestamp() < 0:
            raise ConfigurationError(f"{_BEFORE_1970}, got {eta!r}")
        return
    if isinstance(eta, _dt.timedelta):
        raise ConfigurationError(
            f"eta is a point in time (an aware datetime or a Unix time), got a timedelta "
            f"of {eta.total_seconds():g} s: a time from now is delay="
        )
    if isinstance(eta, int | float) and not isinstance(eta, bool) and -math.inf < eta < 0:
        raise ConfigurationError(f"{_BEFORE_1970}, got {eta!r}")
    if isinstance(eta, bool) or not isinstance(eta, int | float) or not 0 <= eta < math.inf:
        raise ConfigurationError(
            f"eta must be an aware datetime or a finite Unix time >= 0, got {eta!r}"
        )


def _text(name: str, value: Any) -> str | None:
    return text(name, value)


def _counter(name: str, value: Any) -> int:
    """An int from 1 to :data:`~blitzq.limits.MAX_ATTEMPT` (``attempt``, ``deferrals``)."""
    if integer(name, value, minimum=1) > MAX_ATTEMPT:
        raise ConfigurationError(f"{name} must be an int from 1 to {MAX_ATTEMPT}, got {value!r}")
    return int(value)


#: The rule of each field of one call, by its name in the message
#: (:class:`~blitzq.serialization.Envelope`): ``rule(label, value) -> value`` raises
#: :class:`~blitzq.ConfigurationError` naming ``label``. The one definition of each field's
#: rule: :class:`CallOptions` applies it when a call is made (``task_id`` is the message's
#: ``id``), :func:`blitzq.envelope_checks.envelope_fault` when a worker decodes the message
#: (a message breaking one is dead-lettered, whoever wrote it). Per-call options middleware
#: declare have the rule of their :class:`Option` (:func:`blitzq.envelope_checks.options_fault`).
FIELD_RULES: Mapping[str, Callable[[str, Any], Any]] = {
    "id": check_task_id,
    "timeout": seconds,
    "correlation_id": _text,
    "unique_key": _text,
    "max_age": positive_seconds,
    "attempt": _counter,
    "deferrals": _counter,
}


@dataclass(frozen=True, slots=True)
class CallOptions:
    """Options of one enqueue, bound with :meth:`Task.options <blitzq.Task.options>`.

    Every option is checked when the options are made (ConfigurationError): numbers must be
    real numbers (not ``bool``), finite, and durations at most ``MAX_SECONDS`` (10 years);
    strings must be non-empty ``str``.

    Attributes:
        delay: seconds from now before the task may start (``countdown`` in Celery),
            0 to 10 years; a ``timedelta`` is kept as its seconds (a negative one is
            refused as a negative number is).
        eta: absolute start time (aware datetime, or Unix seconds >= 0: a negative, NaN or
            infinite number, or a datetime before 1970, is refused), at most 10 years ahead
            (checked at enqueue). A past eta, in either form (``0``, a Unix time or a
            datetime before now), runs at once: it goes through the schedule like any eta,
            due by the server's clock, and the next promotion moves it to its queue.
        task_id: id to use instead of a random one.
        headers: plain-data metadata carried with the message.
        timeout: seconds the task may run, overriding the task's ``timeout`` (or a
            ``timedelta``, kept as its seconds).
        queue: queue to publish to, overriding the task's.
        correlation_id: id shared by related tasks, a non-empty ``str`` (default: inherited
            from the task that enqueues, if any).
        priority: ``"high"``, ``"normal"`` or ``"low"``, overriding the task's.
        unique_key: key of a ``unique=True`` task's call instead of the hash of its arguments.
        extensions: the per-call options middleware declare (``max_age``, see
            :mod:`blitzq.extensions.expiry`), checked, by name; they travel in the message's
            ``options`` field, read by their middleware (``job.envelope.options``).
    """

    delay: float | None = None
    eta: _dt.datetime | float | None = None
    task_id: str | None = None
    headers: Mapping[str, Any] | None = None
    timeout: float | None = None
    queue: str | None = None
    correlation_id: str | None = None
    priority: str | None = None
    unique_key: str | None = None
    extensions: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        # Every option is checked here, where it enters (not in a worker's loop later):
        # numbers are real (not bool), finite and within MAX_SECONDS; strings are str.
        # A timedelta delay or timeout is kept as its seconds (``_checks.seconds``).
        if self.delay is not None:
            object.__setattr__(self, "delay", seconds("delay", self.delay, strict=False))
        if self.eta is not None:
            _check_eta(self.eta)
            if self.delay is not None:
                raise ConfigurationError("give delay= or eta=, not both")
        if self.timeout is not None:
            object.__setattr__(self, "timeout", FIELD_RULES["timeout"]("timeout", self.timeout))
        if self.task_id is not None:
            FIELD_RULES["id"]("task_id", self.task_id)
        if self.queue is not None:
            check_queue_name("queue", self.queue)
        if self.priority is not None:
            check_priority(self.priority)
        for name in ("unique_key", "correlation_id"):
            FIELD_RULES[name](name, getattr(self, name))
        if self.headers is not None and not isinstance(self.headers, Mapping):
            raise ConfigurationError(
                f"headers must be a dict with str keys, got {type(self.headers).__name__}"
            )

    def due_time(self, now: float) -> float | None:
        """Unix time the message becomes due by the clock that gave ``now``, or ``None`` to
        publish at once.

        A ``delay`` gives ``now + delay`` (the broker receives the delay itself and counts
        it on its own clock; see :meth:`relative_delay`). An ``eta`` is returned as is, even
        when it looks past by ``now``: the broker compares it with its own clock.

        Raises:
            ConfigurationError: a naive datetime, an eta more than ``MAX_SECONDS`` (10
                years) ahead, or both delay and eta.
        """
        if self.delay is not None and self.eta is not None:
            raise ConfigurationError("give delay= or eta=, not both")
        if self.delay is not None:
            return now + self.delay if self.delay > 0 else None
        if self.eta is None:
            return None
        if isinstance(self.eta, _dt.datetime):
            if self.eta.tzinfo is None:
                raise ConfigurationError("eta must be a timezone-aware datetime")
            due = self.eta.timestamp()
        else:
            due = float(self.eta)
        if due - now > MAX_SECONDS:
            raise ConfigurationError(
                f"eta must be at most {MAX_SECONDS} s (10 years) ahead, got {self.eta!r}"
            )
        return due

    def relative_delay(self) -> float | None:
        """Seconds of ``delay`` to send the broker, or ``None`` for none or an ``eta``."""
        return self.delay if self.delay is not None and self.delay > 0 else None


#: The core per-call options: fields of :class:`CallOptions` (``extensions`` aside).
CORE_CALL_OPTIONS: frozenset[str] = frozenset(
    f.name for f in dataclasses.fields(CallOptions) if f.name != "extensions"
)


__all__ = [
    "CORE_CALL_OPTIONS",
    "CORE_OPTIONS",
    "FIELD_RULES",
    "CallOptions",
    "Option",
    "TaskOptions",
    "build_options",
    "declared_call_options",
    "declared_options",
    "positive_seconds",
]


def call_options(
    changes: Mapping[str, Any],
    base: CallOptions | None = None,
    declared: Mapping[str, Option] | None = None,
) -> CallOptions:
    """``base`` (default: no options) with ``changes`` applied, every name checked first.

    Args:
        changes: option names (the fields of :class:`CallOptions`, or the per-call options
            ``declared``) to their values; a declared one given ``None`` is dropped.
        base: the options to start from.
        declared: the per-call options middleware declare (:func:`declared_call_options`),
            each value checked by its :class:`Option`'s check.

    Raises:
        ConfigurationError: a name that is no call option (the message names it and lists
            the options), or an invalid value.
    """
    declared = declared or {}
    core = {k: v for k, v in changes.items() if k in CORE_CALL_OPTIONS}
    unknown = sorted(str(name) for name in changes if name not in core and name not in declared)
    if unknown:
        listed = ", ".join([*sorted(CORE_CALL_OPTIONS), *sorted(declared)])
        raise ConfigurationError(
            f"unknown call option {', '.join(map(repr, unknown))} (options: {listed})"
        )
    base = base if base is not None else CallOptions()
    extra = {k: v for k, v in changes.items() if k not in core}
    if extra:
        merged = dict(base.extensions or {})
        for name, value in extra.items():
            check = declared[name].check
            value = check(name, value) if check is not None and value is not None else value
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        core["extensions"] = merged or None
    return dataclasses.replace(base, **core)
