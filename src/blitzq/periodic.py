"""Periodic-task entries: what runs when, validated once, and the message of each occurrence.

``Queue.periodic`` / ``Queue.add_periodic`` (:class:`blitzq.registration.Registrar`) register a
:class:`PeriodicTask` built by :func:`make_periodic`;
the :class:`~blitzq.scheduler.Scheduler` decides which occurrences are due and dispatches
:func:`build_message` for each; :func:`periodic_status` describes the entries for ``blitzq
scheduler list``. The missed-run policies are described in
:mod:`blitzq.scheduler`.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from .exceptions import ConfigurationError
from .routing import PRIORITIES, physical_queue
from .schedules import Cron, Every, Schedule
from .serialization import dumps, encode_envelope, plain_args, plain_kwargs
from .task import CallOptions, Task

if TYPE_CHECKING:
    from .broker import Broker
    from .client.publish import Producer

__all__ = [
    "MissedPolicy",
    "PeriodicTask",
    "as_schedule",
    "build_message",
    "make_periodic",
    "periodic_status",
]

MissedPolicy = Literal["run_once", "run_all", "skip"]


class PeriodicOwner(Protocol):
    """What the periodic code reads of a :class:`~blitzq.Queue`: its settings, its periodic
    entries and its producer (whose envelope code builds each occurrence's message)."""

    periodic_tasks: dict[str, PeriodicTask]

    @property
    def broker(self) -> Broker:
        """The broker of the running event loop."""
        ...

    @property
    def max_message_size(self) -> int:
        """Largest encoded message, in bytes."""
        ...

    @property
    def _producer(self) -> Producer:
        """The producer."""
        ...


_POLICIES: frozenset[str] = frozenset({"run_once", "run_all", "skip"})


@dataclass(frozen=True, slots=True)
class PeriodicTask:
    """One periodic entry: which task runs, when, with what arguments.

    Attributes:
        name: unique entry name (keys the last-run record; part of each occurrence's task id
            ``periodic:<name>:<int timestamp>``).
        task: the registered task.
        schedule: when it runs.
        missed: missed-run policy (see the module docstring).
        args, kwargs: the call's arguments (plain data).
        queue: queue to publish to, or ``None`` for the task's own.
        priority: ``"high"``, ``"normal"`` or ``"low"``; ``None`` takes the task's own.
    """

    name: str
    task: Task[Any, Any]
    schedule: Schedule
    missed: MissedPolicy
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    queue: str | None
    priority: str | None

    def task_id(self, occurrence: float) -> str:
        """Task id of the message of ``occurrence`` (Unix seconds)."""
        return f"periodic:{self.name}:{int(occurrence)}"

    def target_queue(self) -> str:
        """Physical queue the messages go to (``<queue>:high`` / ``<queue>:low`` by priority)."""
        return physical_queue(self.queue or self.task.queue, self.priority or self.task.priority)


def as_schedule(schedule: Schedule | str | float | _dt.timedelta, tz: str | None) -> Schedule:
    """Coerce what ``queue.periodic`` accepts into a :class:`Schedule`.

    A ``str`` is a cron expression evaluated in ``tz`` (default UTC); a number or ``timedelta``
    is an :class:`Every` interval in seconds.

    Raises:
        ConfigurationError: an invalid schedule, or ``tz`` given with anything but a cron string.
    """
    if isinstance(schedule, str):
        return Cron(schedule, tz=tz)
    if tz is not None:
        raise ConfigurationError(
            "tz= applies to a cron expression given as a string; pass tz to Cron(...) instead"
        )
    if isinstance(schedule, Schedule):
        return schedule
    if isinstance(schedule, bool) or not isinstance(schedule, int | float | _dt.timedelta):
        raise ConfigurationError(
            f"schedule must be Every(...), Cron(...), a cron string or seconds, got {schedule!r}"
        )
    return Every(schedule)


def make_periodic(
    task: Task[Any, Any],
    schedule: Schedule | str | float | _dt.timedelta,
    *,
    tz: str | None = None,
    missed: str = "run_once",
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    queue: str | None = None,
    priority: str | None = None,
) -> PeriodicTask:
    """Validate the options of a periodic entry and build it (see ``Queue.add_periodic``).

    Raises:
        ConfigurationError: a bad schedule, policy, name, queue or priority, ``args`` not a
            tuple or list, ``kwargs`` not a mapping.
        SerializationError: an argument that is not plain data or cannot be encoded.
    """
    from .routing import check_periodic_name, check_queue_name

    if missed not in _POLICIES:
        raise ConfigurationError(f"missed must be one of {sorted(_POLICIES)}, got {missed!r}")
    if priority is not None and priority not in PRIORITIES:
        raise ConfigurationError(f"priority must be one of {sorted(PRIORITIES)}, got {priority!r}")
    if not isinstance(args, tuple | list):
        raise ConfigurationError(f"periodic args must be a tuple or list, got {args!r}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"periodic kwargs must be a dict, got {kwargs!r}")
    args = tuple(args)
    kwargs = dict(kwargs or {})
    # Refuse what cannot be encoded now, not at the first occurrence (a lone surrogate too).
    dumps([plain_args(args), plain_kwargs(kwargs)])
    return PeriodicTask(
        name=check_periodic_name("periodic task name", name or task.name),
        task=task,
        schedule=as_schedule(schedule, tz),
        missed=missed,  # type: ignore[arg-type]
        args=args,
        kwargs=kwargs,
        queue=check_queue_name("queue name", queue) if queue is not None else None,
        priority=priority,
    )


def build_message(
    owner: PeriodicOwner, entry: PeriodicTask, occurrence: float, now: float
) -> bytes:
    """The encoded message of one occurrence, made by the Queue's own envelope code."""
    opts = CallOptions(task_id=entry.task_id(occurrence), queue=entry.target_queue())
    env = owner._producer.envelope(
        entry.task.name, entry.target_queue(), entry.args, entry.kwargs, opts, now
    )
    return encode_envelope(env, owner.max_message_size)


async def periodic_status(
    queue: PeriodicOwner, now: float | None = None, extra: Sequence[PeriodicTask] = ()
) -> list[dict[str, Any]]:
    """Each periodic entry of ``queue`` (and of ``extra``) with its schedule, next and last
    run.

    Args:
        queue: the Queue whose entries to describe.
        now: the time to compute the next runs from (Unix seconds); default the broker's
            clock, which is what decides when they run.
        extra: more entries (the run-time ones a scheduler of ``queue`` dispatches).

    Returns:
        One dict per entry, sorted by name: ``name``, ``task``, ``schedule`` (text),
        ``missed``, ``queue``, ``next_run`` and ``last_run`` (Unix seconds or ``None``),
        ``zone`` (the IANA zone of a cron schedule, else ``None``) and ``source``
        (``"code"``, or ``"runtime"`` for ``extra``).

    Raises:
        BrokerError: the broker could not be reached.
    """
    if now is None:
        now = await queue.broker.server_time()
    code = set(queue.periodic_tasks)
    entries = sorted([*queue.periodic_tasks.values(), *extra], key=lambda e: e.name)
    history = await queue.broker.periodic_last([e.name for e in entries]) if entries else {}
    rows = []
    for entry in entries:
        try:
            next_run: float | None = entry.schedule.next_after(now)
        except ConfigurationError:
            next_run = None
        rows.append(
            {
                "name": entry.name,
                "task": entry.task.name,
                "schedule": entry.schedule.describe(),
                "missed": entry.missed,
                "queue": entry.target_queue(),
                "next_run": next_run,
                "last_run": history.get(entry.name),
                "zone": entry.schedule.tz if isinstance(entry.schedule, Cron) else None,
                "source": "code" if entry.name in code else "runtime",
            }
        )
    return rows
