"""Per-task controls: unique calls, locks, soft / hard timeouts and ``max_age`` expiry.

``@queue.task(...)`` passes these options to :func:`install_controls`, which checks them and
plugs each feature into the task's extension points (:mod:`blitzq.hooks`): start checks
(expiry, lock, unique release at start), finishers (lock and unique release) and the queue's
enqueue filter (unique claim). A task without any of them gets none of these hooks and pays
nothing. The features live in :mod:`blitzq.expiry`, :mod:`blitzq.locks`,
:mod:`blitzq.uniqueness` and :mod:`blitzq.worker.timeouts`; see ``docs/control.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .exceptions import ConfigurationError
from .limits import MAX_SECONDS

if TYPE_CHECKING:
    from .extensions.locks import LockSpec
    from .task import Task

#: Default seconds a unique key is held at most (a crashed run cannot keep it longer).
DEFAULT_UNIQUE_TTL = 3600.0

_KNOWN = frozenset(
    {
        "unique",
        "unique_until",
        "unique_ttl",
        "lock",
        "lock_limit",
        "lock_ttl",
        "soft_timeout",
        "hard_timeout",
        "max_age",
    }
)


@dataclass(frozen=True, slots=True)
class TaskControls:
    """The control settings of one task (``task.controls``).

    Attributes:
        unique: duplicate calls are not enqueued while the first is pending.
        unique_until: ``"start"`` or ``"completion"``: when the unique key is freed.
        unique_ttl: seconds the unique key lives at most.
        lock: the lock key template (``"user:{user_id}"``), or ``None``.
        lock_limit: runs holding the lock at once (1: mutex).
        lock_ttl: lease in seconds of a lock place (``None``: the queue's visibility
            timeout).
        soft_timeout: seconds before SoftTimeoutError is raised in the task, or ``None``.
        max_age: seconds a call may wait before it starts, or ``None``.
        lock_spec: the parsed lock, or ``None``.
    """

    unique: bool = False
    unique_until: str = "completion"
    unique_ttl: float = DEFAULT_UNIQUE_TTL
    lock: str | None = None
    lock_limit: int = 1
    lock_ttl: float | None = None
    soft_timeout: float | None = None
    max_age: float | None = None
    lock_spec: LockSpec | None = None


NO_CONTROLS = TaskControls()


def _seconds(task: str, name: str, value: Any) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
        or value > MAX_SECONDS
    ):
        raise ConfigurationError(
            f"task {task}: {name} must be > 0 and <= {MAX_SECONDS} seconds, got {value!r}"
        )
    return float(value)


def install_controls(task: Task[Any, Any], options: Mapping[str, Any]) -> TaskControls:
    """Check ``options`` and install the hooks they need on ``task`` (and its queue).

    Args:
        task: the task being registered (its ``checks``, ``finishers``, ``timeout`` and its
            owner's ``enqueue_filters`` are updated).
        options: the keyword options of :meth:`blitzq.Queue.task` listed in
            :class:`TaskControls`, plus ``hard_timeout`` (the alias of ``timeout``).

    Returns:
        The task's :class:`TaskControls`.

    Raises:
        ConfigurationError: an unknown or invalid option, a lock template naming something
            that is not a parameter, or ``soft_timeout`` on a process task.
    """
    unknown = set(options) - _KNOWN
    if unknown:
        raise ConfigurationError(f"task {task.name}: unknown options {sorted(unknown)}")
    # Checked even when unused (no unique= / lock=): a bad value is an error wherever it is.
    _seconds(task.name, "unique_ttl", options.get("unique_ttl", DEFAULT_UNIQUE_TTL))
    _seconds(task.name, "lock_ttl", options.get("lock_ttl"))
    if not any(
        options.get(k) for k in ("unique", "lock", "soft_timeout", "hard_timeout", "max_age")
    ):
        return NO_CONTROLS
    name = task.name
    hard = _seconds(name, "hard_timeout", options.get("hard_timeout"))
    if hard is not None:
        if task.timeout is not None and task.timeout != hard:
            raise ConfigurationError(f"task {name}: give timeout= or hard_timeout=, not both")
        task.timeout = hard
    soft = _seconds(name, "soft_timeout", options.get("soft_timeout"))
    if soft is not None and task.executor == "process":
        raise ConfigurationError(
            f"task {name}: soft_timeout is not supported for process tasks (use hard_timeout)"
        )
    max_age = _seconds(name, "max_age", options.get("max_age"))
    unique = bool(options.get("unique", False))
    until = options.get("unique_until", "completion")
    if until not in ("start", "completion"):
        raise ConfigurationError(
            f"task {name}: unique_until must be 'start' or 'completion', got {until!r}"
        )
    unique_ttl = _seconds(name, "unique_ttl", options.get("unique_ttl", DEFAULT_UNIQUE_TTL))
    lock = options.get("lock")
    limit = options.get("lock_limit", 1)
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError(f"task {name}: lock_limit must be an int >= 1, got {limit!r}")
    lock_ttl = _seconds(name, "lock_ttl", options.get("lock_ttl"))
    spec: LockSpec | None = None
    if lock is not None:
        from .extensions.locks import LockSpec

        spec = LockSpec.parse(task, lock, limit, lock_ttl)
    controls = TaskControls(
        unique=unique,
        unique_until=until,
        unique_ttl=unique_ttl or DEFAULT_UNIQUE_TTL,
        lock=lock,
        lock_limit=limit,
        lock_ttl=lock_ttl,
        soft_timeout=soft,
        max_age=max_age,
        lock_spec=spec,
    )
    # Start checks run in this order: an expired task takes no lock; a locked-out task keeps
    # its unique key until it really starts.
    if max_age is not None:
        from .extensions.expiry import check_expiry

        task.checks.append(check_expiry)
    if spec is not None:
        from .extensions.locks import release_lock

        task.checks.append(spec.acquire)
        task.finishers.append(release_lock)
    if unique:
        from .extensions.unique import install_unique

        install_unique(task, until)
    return controls
