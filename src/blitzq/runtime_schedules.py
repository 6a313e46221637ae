"""Periodic entries defined at run time (``blitzq schedule add|list|remove``), kept in the
broker next to the code-defined ones of ``Queue.periodic``.

A :class:`RuntimeSchedule` names its task by name (``--task``), so the shell that adds it
needs no application code; it is stored (MessagePack) in the broker's run-time entries
(``{ns}:periodic:rt``). Every :class:`~blitzq.scheduler.Scheduler` reads them on each tick
through :class:`RuntimeEntries` and dispatches them like code-defined entries (same
once-per-occurrence claim, same missed-run policies), so an entry added or removed takes
effect within one ``poll_interval``, without a restart. A scheduler dispatches a run-time
entry only when its Queue has the task registered (it takes the task's queue and priority
from there, unless the entry names a queue); it logs a warning, once, for an entry whose
task it does not know, and for one whose name a code-defined entry already uses (the code
wins).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .exceptions import BlitzQError, ConfigurationError, SerializationError, unknown_outcome
from .limits import clip_text
from .periodic import _POLICIES, PeriodicTask, make_periodic, periodic_status
from .routing import check_name, check_periodic_name, check_queue_name
from .schedules import Cron, Every, Schedule
from .serialization import dumps, loads, lookup_key, plain_args, plain_kwargs

if TYPE_CHECKING:
    from .queue import Queue

__all__ = [
    "RuntimeEntries",
    "RuntimeSchedule",
    "add_schedule",
    "all_periodic_status",
    "remove_schedule",
    "runtime_schedules",
]

logger = logging.getLogger("blitzq.scheduler")


@dataclass(frozen=True, slots=True)
class RuntimeSchedule:
    """One run-time periodic entry.

    Attributes:
        name: the entry's name (also keys its last run, as for code-defined entries).
        task: the registered task name it runs.
        cron: a cron expression evaluated in ``tz``, or ``None``.
        every: an interval in seconds, or ``None`` (exactly one of ``cron``/``every``).
        tz: IANA zone of ``cron`` (``None``: UTC).
        args, kwargs: the call's arguments (plain data).
        queue: queue to publish to (``None``: the task's own).
        missed: missed-run policy (``run_once``, ``run_all``, ``skip``).
        added_at: when it was added (Unix seconds).
    """

    name: str
    task: str
    cron: str | None = None
    every: float | None = None
    tz: str | None = None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    queue: str | None = None
    missed: str = "run_once"
    added_at: float = 0.0

    def schedule(self) -> Schedule:
        """The entry's :class:`~blitzq.schedules.Schedule`.

        Raises:
            ConfigurationError: an invalid cron expression, zone or interval.
        """
        if self.cron is not None:
            return Cron(self.cron, tz=self.tz)
        if self.every is None:
            raise ConfigurationError(f"schedule {self.name!r} has neither a cron nor an interval")
        return Every(self.every)

    def check(self) -> None:
        """Validate every field (what :func:`add_schedule` refuses).

        Raises:
            ConfigurationError: a bad name, task, schedule, zone, queue or policy, or both
                or neither of ``cron`` and ``every``.
            SerializationError: arguments that are not plain data, or a name that is not
                valid Unicode text (a lone surrogate).
        """
        check_periodic_name("schedule name", self.name)
        check_name("task name", self.task)
        if (self.cron is None) == (self.every is None):
            raise ConfigurationError("give exactly one of a cron expression and an interval")
        if self.tz is not None and self.cron is None:
            raise ConfigurationError("a time zone applies to a cron expression only")
        self.schedule()
        if self.queue is not None:
            check_queue_name("queue name", self.queue)
        if self.missed not in _POLICIES:
            raise ConfigurationError(f"missed must be one of {sorted(_POLICIES)}")
        if not isinstance(self.args, list) or not isinstance(self.kwargs, dict):
            raise ConfigurationError("args must be a list and kwargs a dict")
        dumps([plain_args(self.args), plain_kwargs(self.kwargs)])

    def encode(self) -> bytes:
        """The stored form (a MessagePack map)."""
        return dumps(
            {
                "task": self.task,
                "cron": self.cron,
                "every": self.every,
                "tz": self.tz,
                "args": self.args,
                "kwargs": self.kwargs,
                "queue": self.queue,
                "missed": self.missed,
                "added_at": self.added_at,
            }
        )

    @classmethod
    def decode(cls, name: str, data: bytes) -> RuntimeSchedule:
        """The entry ``name`` from its stored form.

        Raises:
            SerializationError: ``data`` is not a stored entry.
        """
        doc = loads(data)
        if not isinstance(doc, dict) or not isinstance(doc.get("task"), str):
            raise SerializationError(f"schedule {name!r}: not a stored periodic entry")
        try:
            return cls(
                name=name,
                task=doc["task"],
                cron=doc.get("cron"),
                every=doc.get("every"),
                tz=doc.get("tz"),
                args=list(doc.get("args") or []),
                kwargs=dict(doc.get("kwargs") or {}),
                queue=doc.get("queue"),
                missed=str(doc.get("missed") or "run_once"),
                added_at=float(doc.get("added_at") or 0.0),
            )
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"schedule {name!r}: {exc}") from None

    def periodic(self, queue: Queue) -> PeriodicTask | None:
        """The :class:`~blitzq.periodic.PeriodicTask` a scheduler of ``queue`` dispatches,
        or ``None`` when ``queue`` has no task of that name.

        Raises:
            ConfigurationError, SerializationError: an invalid stored entry.
        """
        task = queue.tasks.get(self.task)
        if task is None:
            return None
        return make_periodic(
            task,
            self.schedule(),
            missed=self.missed,
            args=self.args,
            kwargs=self.kwargs,
            name=self.name,
            queue=self.queue,
        )


async def add_schedule(
    queue: Queue,
    name: str,
    task: str,
    *,
    cron: str | None = None,
    every: float | None = None,
    tz: str | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    target_queue: str | None = None,
    missed: str = "run_once",
) -> RuntimeSchedule:
    """Add (or replace) the run-time periodic entry ``name`` in ``queue``'s broker.

    Args:
        queue: the Queue whose broker and namespace keep the entry.
        name: the entry's name.
        task: the registered task name to run.
        cron: a cron expression (evaluated in ``tz``, default UTC) ...
        every: ... or an interval in seconds (exactly one of the two).
        tz: IANA zone of ``cron``.
        args, kwargs: arguments of every call (plain data).
        target_queue: queue the messages go to (default: the task's own, as the scheduler's
            Queue registers it).
        missed: missed-run policy (see :mod:`blitzq.scheduler`).

    Raises:
        ConfigurationError: an invalid field (see :meth:`RuntimeSchedule.check`).
        SerializationError: arguments that are not plain data.
        OutcomeUnknown: the broker stopped answering after the write was sent (``.task_id``:
            ``name``); the entry may be stored. Adding it again is safe (it replaces).
        BrokerError: the broker could not be reached.
    """
    if not isinstance(args, list | tuple):
        raise ConfigurationError(f"args must be a list, got {args!r}")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigurationError(f"kwargs must be a dict, got {kwargs!r}")
    entry = RuntimeSchedule(
        name=name,
        task=task,
        cron=cron,
        every=every,
        tz=tz,
        args=list(args),
        kwargs=dict(kwargs or {}),
        queue=target_queue,
        missed=missed,
        added_at=time.time(),
    )
    entry.check()
    with unknown_outcome("schedule", (name,)):
        await queue.broker.state.operations.set_runtime_periodic(name, entry.encode())
    return entry


async def remove_schedule(queue: Queue, name: str) -> bool:
    """Delete the run-time entry ``name`` (and its last run); ``True`` when it existed.

    Raises:
        ConfigurationError: ``name`` breaks the rule :func:`add_schedule` holds a name to
            (:func:`~blitzq.routing.check_name`: empty, a space, a brace, a newline).
        SerializationError: ``name`` is not valid Unicode text
            (:func:`~blitzq.serialization.lookup_key`).
        BrokerError: the broker could not be reached.
    """
    return await queue.broker.state.operations.remove_runtime_periodic(
        lookup_key("schedule name", check_name("schedule name", name))
    )


async def runtime_schedules(queue: Queue) -> list[RuntimeSchedule]:
    """Every run-time entry of ``queue``'s namespace, sorted by name (unreadable stored
    entries are logged and left out).

    Raises:
        BrokerError: the broker could not be reached.
    """
    out = []
    for name, data in sorted((await queue.broker.state.operations.runtime_periodic()).items()):
        try:
            out.append(RuntimeSchedule.decode(name, data))
        except BlitzQError as exc:
            logger.warning("run-time schedule %s is unreadable: %s", name, exc)
    return out


class RuntimeEntries:
    """The run-time entries a scheduler of ``queue`` dispatches, read again on each
    :meth:`refresh` (rebuilt only when the stored entries changed).

    Args:
        queue: the scheduler's Queue (its tasks and code-defined entries).
    """

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        #: The dispatchable run-time entries by name, as of the last refresh.
        self.entries: dict[str, PeriodicTask] = {}
        self._stored: dict[str, bytes] | None = None
        self._warned: set[tuple[str, bytes]] = set()

    async def refresh(self) -> dict[str, PeriodicTask]:
        """Read the stored entries; return the dispatchable ones by name.

        Raises:
            BrokerError: the broker could not be reached.
        """
        stored = await self.queue.broker.state.operations.runtime_periodic()
        if stored == self._stored:
            return self.entries
        entries: dict[str, PeriodicTask] = {}
        for name, data in sorted(stored.items()):
            problem = None
            if name in self.queue.periodic_tasks:
                problem = "a code-defined periodic entry has that name; it runs instead"
            else:
                try:
                    entry = RuntimeSchedule.decode(name, data).periodic(self.queue)
                except BlitzQError as exc:
                    entry, problem = None, str(exc)
                if entry is None and problem is None:
                    problem = "its task is not registered in this scheduler's Queue"
                if entry is not None:
                    entries[name] = entry
            if problem is not None and (name, data) not in self._warned:
                self._warned.add((name, data))
                shown = clip_text(name, 80)  # a name stored by hand or an older release
                logger.warning("run-time schedule %s is not dispatched: %s", shown, problem)
        for name in entries.keys() - self.entries.keys():
            logger.info("run-time schedule %s added: %s", name, entries[name].schedule.describe())
        for name in self.entries.keys() - entries.keys():
            logger.info("run-time schedule %s removed", name)
        self._stored, self.entries = stored, entries
        return entries


async def all_periodic_status(
    queue: Queue, runtime: RuntimeEntries | None = None
) -> list[dict[str, Any]]:
    """The rows of :func:`~blitzq.periodic.periodic_status` for every entry a scheduler of
    ``queue`` dispatches: the code-defined ones (``source`` ``"code"``) and the run-time ones
    of ``blitzq schedule add`` (``source`` ``"runtime"``) whose task ``queue`` registers.

    Args:
        queue: the application's Queue.
        runtime: the :class:`RuntimeEntries` to refresh (keep one across calls so that an
            entry it cannot dispatch is logged once); default a fresh one.

    Raises:
        BrokerError: the broker could not be reached.
    """
    entries = await (runtime or RuntimeEntries(queue)).refresh()
    return await periodic_status(queue, extra=list(entries.values()))
