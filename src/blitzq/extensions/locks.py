"""Task locks: at most ``lock_limit`` runs of tasks sharing a lock key at once.

``@queue.task(lock="user:{user_id}", lock_limit=1, lock_ttl=None)`` formats the key from the
call's arguments (bound with the function's signature, so positional and keyword arguments
and defaults all work). ``lock_limit=1`` is a mutex, ``N`` a semaphore; tasks using the same
key share it.

The options are declared by the built-in middleware :class:`Locks`.

- A start check (:meth:`LockSpec.acquire`) takes a place atomically in the broker: a sorted
  set of holders scored by lease expiry; expired holders are dropped first. A task that gets
  no place is put back on the schedule (``WorkerContext.reschedule``) for a short wait: it holds no
  slot and spends no attempt.
- A finisher (:func:`release_lock`) gives the place back with the completion of every
  attempt (success, failure, retry, timeout, requeue at shutdown). A thread that passed its
  hard timeout keeps the place until it really returns.
- A broker error while taking a place is raised to the worker
  (:mod:`blitzq.worker.deferral`): an outage defers the task with backoff, an error reply
  fails the attempt. A place that call may have taken with its answer lost (a reset, the
  check's timeout) is given back with that deferral's or failure's completion (a release
  of a place never taken changes nothing), so it never blocks the key for a whole lease.
- A lease lasts ``lock_ttl`` seconds (default: the queue's ``visibility_timeout``). While
  the task runs, its worker renews the lease every third of it; a place held by a killed
  worker is freed when its lease expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import string
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..broker import Completion
from ..broker.effects import LockRelease
from ..exceptions import BrokerError, ConfigurationError
from ..options import Option, positive_seconds
from .middleware import Middleware

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..options import TaskOptions
    from ..task import Task
    from ..worker.execution import Job
    from .middleware import WorkerContext

logger = logging.getLogger("blitzq.worker")

#: Longest a locked-out task waits before it asks again (seconds).
RETRY_CEILING = 0.2
#: Shortest wait before asking again (seconds).
RETRY_FLOOR = 0.02

_FIELD = re.compile(r"[^.\[]*")


def _limit(label: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{label} must be an int >= 1, got {value!r}")
    return value


class Locks(Middleware):
    """Built-in middleware of the ``lock``, ``lock_limit`` and ``lock_ttl`` options (see the
    module docstring)."""

    task_options: ClassVar[Mapping[str, Option]] = {
        "lock": Option(None),
        "lock_limit": Option(1, _limit),
        "lock_ttl": Option(None, positive_seconds),
    }

    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        """Check the lock template against the task's parameters; add the acquiring start
        check and the releasing finisher.

        Raises:
            ConfigurationError: see :meth:`LockSpec.parse`.
        """
        template = options.get("lock")
        if template is None:
            return
        spec = LockSpec.parse(task, template, options.get("lock_limit"), options.get("lock_ttl"))
        task.checks.append(spec.acquire)
        task.finishers.append(release_lock)


@dataclass(frozen=True, slots=True)
class LockSpec:
    """A task's lock.

    Attributes:
        template: the key template, e.g. ``"user:{user_id}"``.
        limit: holders at once.
        ttl: lease seconds, or ``None`` for the queue's visibility timeout.
        task: the task it belongs to.
    """

    template: str
    limit: int
    ttl: float | None
    task: Task[Any, Any]

    @classmethod
    def parse(cls, task: Task[Any, Any], template: str, limit: int, ttl: float | None) -> LockSpec:
        """Check ``template`` against ``task``'s parameters.

        Raises:
            ConfigurationError: not a str, a bad format, a positional ``{}`` field, or a
                field that is not a named parameter of the task.
        """
        if not isinstance(template, str) or not template:
            raise ConfigurationError(f"task {task.name}: lock must be a non-empty str")
        params = {
            p.name
            for p in task.signature.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
        except ValueError as exc:
            raise ConfigurationError(f"task {task.name}: bad lock template: {exc}") from None
        for field in fields:
            match = _FIELD.match(field)
            base = match.group(0) if match else ""
            if base not in params:
                raise ConfigurationError(
                    f"task {task.name}: lock field {{{field}}} is not a parameter of the task"
                    f" (parameters: {sorted(params)})"
                )
        return cls(template, limit, ttl, task)

    def key(self, args: list[Any], kwargs: dict[str, Any]) -> str:
        """The lock key of one call.

        Raises:
            TypeError: the arguments do not fit the task's signature.
        """
        bound = self.task.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return self.template.format(**bound.arguments)

    async def acquire(self, worker: WorkerContext, job: Job) -> Completion | None:
        """Start check: take a place, or put the task back on the schedule for a short wait."""
        env = job.envelope
        try:
            key = self.key(env.args, env.kwargs)
        except (TypeError, LookupError, AttributeError, ValueError):
            return None  # a call that does not fit: it fails on its own when run
        lease = self.ttl or worker.visibility_timeout
        holder = holder_of(job)
        try:
            wait = await worker.broker.acquire_lock(key, holder, self.limit, lease)
        except BaseException:
            # The place may be taken with the reply lost (a reset, the check's timeout): held
            # here, so the completion of the deferral or failed attempt gives it back
            # (release_lock) rather than leaving it to block the lock for a whole lease.
            _keeper(worker).hold(job, key, holder, lease)
            raise
        if wait <= 0:
            _keeper(worker).hold(job, key, holder, lease)
            return None
        delay = min(max(wait, RETRY_FLOOR), RETRY_CEILING) * random.uniform(0.7, 1.3)
        return worker.reschedule(job, delay)


def holder_of(job: Job) -> str:
    """The lock holder name of one delivery: ``<task id>@<delivery token>``, or
    ``<task id>@<random>`` for a delivery without a token (fast mode).

    Each delivery holds its own place, so a run abandoned by a worker that lost its lease
    (or a thread still running past its hard timeout) can renew or free only its own place,
    never the place of the retry or redelivery now running the same task.
    """
    token = job.delivery.token
    suffix = uuid.uuid4().hex[:12] if token is None else token.decode(errors="replace")
    return f"{job.envelope.id}@{suffix}"


class _Keeper:
    """Renews the lock leases of one worker's running tasks, in one call per round."""

    def __init__(self, worker: WorkerContext) -> None:
        self.worker = worker
        self.held: dict[Job, tuple[str, str, float, float]] = {}
        self.loop_task: asyncio.Task[None] | None = None
        self.idle = asyncio.Event()  # set when nothing is held: the renewal loop ends

    def hold(self, job: Job, key: str, holder: str, lease: float) -> None:
        self.held[job] = (key, holder, lease, time.monotonic())
        _OWNERS[job] = self
        self.idle.clear()
        if self.loop_task is None or self.loop_task.done():
            self.loop_task = asyncio.ensure_future(self._renew())

    def _alive(self, job: Job, since: float, lease: float, now: float) -> bool:
        handle = job.handle
        if handle is not None:
            return not handle.done()
        # Between the start check and the run: allow the lease once, then let it lapse.
        return not job.finished and now - since < lease

    def drop(self, job: Job) -> tuple[str, str, float, float] | None:
        """Forget ``job``'s place; return what it held."""
        entry = self.held.pop(job, None)
        _OWNERS.pop(job, None)
        if not self.held:
            self.idle.set()
        return entry

    async def _renew(self) -> None:
        while self.held:
            interval = max(0.05, min(v[2] for v in self.held.values()) / 3)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), interval)
            now = time.monotonic()
            items = []
            for job, (key, holder, lease, since) in list(self.held.items()):
                if self._alive(job, since, lease, now):
                    items.append((key, holder, lease))
                else:  # ended without a finisher (never started): its lease lapses
                    self.drop(job)
            if items:
                try:
                    await self.worker.broker.renew_locks(items)
                except BrokerError as exc:
                    logger.warning("lock lease renewal failed: %s", exc)

    def release_later(self, job: Job, handle: Any) -> None:
        """Give ``job``'s place back once ``handle`` (a thread still running) is done."""

        def done(_: Any) -> None:
            entry = self.drop(job)
            if entry is not None:
                op = LockRelease(entry[0], entry[1])
                self.worker.write(Completion(job.delivery.queue, None, job.envelope.id, ops=(op,)))

        handle.add_done_callback(done)


_KEEPERS: weakref.WeakKeyDictionary[WorkerContext, _Keeper] = weakref.WeakKeyDictionary()
_OWNERS: dict[Job, _Keeper] = {}


def _keeper(worker: WorkerContext) -> _Keeper:
    keeper = _KEEPERS.get(worker)
    if keeper is None:
        keeper = _KEEPERS[worker] = _Keeper(worker)
    return keeper


def release_lock(
    job: Job, completion: Completion, final: bool, error: BaseException | None
) -> Completion:
    """Finisher: give the lock place back with the completion of the attempt.

    A thread or process task that passed its hard timeout is still running: its place is
    given back (and renewed until then) when the code really stops. A requeue at shutdown
    gives it back at once.
    """
    keeper = _OWNERS.get(job)
    if keeper is None:
        return completion
    handle = job.handle
    if handle is not None and not handle.done() and completion.requeue is None:
        keeper.release_later(job, handle)
        return completion
    entry = keeper.drop(job)
    if entry is not None:
        completion.ops = (*completion.ops, LockRelease(entry[0], entry[1]))
    return completion
