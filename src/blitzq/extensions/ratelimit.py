"""Rate limits: task starts per period across all workers, as a built-in middleware.

``@queue.task(rate_limit="10/s", rate_key=None)`` limits the starts of one task (or, with a
shared ``rate_key``, of every task naming that key); ``Queue(queue_rate_limits={"emails":
"20/s"})`` limits the starts of every task taken from a queue (all its priority levels).
Each limit is a token bucket in the broker (:class:`~blitzq.RateLimit` is the spec; see
:mod:`blitzq.ratelimit` for the bucket and docs/flow-control.md for the behaviour).

The options are declared by the built-in middleware :class:`RateLimits`, checked once when
the task is registered; ``queue_rate_limits`` is checked once by :func:`queue_limits` when
the Queue is made. A task that has a limit of its own, or whose Queue has any queue limit,
gets the start check :class:`RateCheck`, the first of its start checks:

- a copy that already holds a reserved token (``Envelope.reserved``) starts without asking;
- otherwise it takes one token from each of its buckets in one broker call
  (:meth:`~blitzq.broker.state.ControlState.acquire_rate`, the broker's clock). Granted now:
  the task starts, and its copy is marked reserved (so a later start check that puts it back
  does not make it ask again). Not yet: it goes back on the schedule for the wait
  (``WorkerContext.reschedule``: attempt unchanged, no slot held), reserved if the bucket
  reserved a token for it. A broker error is raised to the worker
  (:mod:`blitzq.worker.deferral`): an outage defers the task with backoff, unreserved and
  without spending an attempt; an error reply (a ``WRONGTYPE`` bucket) fails the attempt.

A task without a limit on a Queue without queue limits has no such check and pays nothing
for rate limits. The buckets of a task are worked out once per physical queue it is taken
from (``queue:<q>`` keys the queue's bucket unless its ``RateLimit`` names a key).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from .._checks import text
from ..exceptions import ConfigurationError
from ..options import Option
from ..ratelimit import RateLimit
from ..routing import base_queue, check_queue_name
from .middleware import Middleware

if TYPE_CHECKING:
    from ..broker import Completion
    from ..options import TaskOptions
    from ..task import Task
    from ..worker.execution import Job
    from .middleware import WorkerContext

#: A bucket's wait below this many seconds starts the task at once.
RATE_SLACK = 0.002

#: One token bucket a start draws on: ``(key, rate in tokens/s, capacity in tokens)``.
Bucket = tuple[str, float, float]


def _limit(label: str, value: Any) -> RateLimit | None:
    return None if value is None else RateLimit.parse(value)


def _key(label: str, value: Any) -> str | None:
    return text(label, value)


def queue_limits(given: Mapping[str, str | RateLimit] | None) -> dict[str, RateLimit]:
    """Check ``Queue(queue_rate_limits=...)`` once.

    Args:
        given: queue name → ``"10/s"``-like text or :class:`~blitzq.RateLimit`, or ``None``.

    Returns:
        queue name → the limit, keyed ``queue:<name>`` unless the ``RateLimit`` names a key.

    Raises:
        ConfigurationError: not a mapping, a bad queue name, or a bad limit.
    """
    if given is not None and not isinstance(given, Mapping):
        raise ConfigurationError(f"queue_rate_limits must be a dict, got {given!r}")
    return {
        check_queue_name("queue name", q): RateLimit.parse(limit, key=f"queue:{q}")
        for q, limit in (given or {}).items()
    }


class RateLimits(Middleware):
    """Built-in middleware of the ``rate_limit`` and ``rate_key`` options and of the Queue's
    ``queue_rate_limits`` (see the module docstring)."""

    task_options: ClassVar[Mapping[str, Option]] = {
        "rate_limit": Option(None, _limit),
        "rate_key": Option(None, _key),
    }

    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        """Set ``task.rate_limit`` (keyed by ``rate_key`` or the task name) and add
        :class:`RateCheck` to a task with a limit, or to every task of a Queue with queue
        limits (read as the task is registered).

        Raises:
            ConfigurationError: a ``rate_key`` without a ``rate_limit``.
        """
        limit: RateLimit | None = options.get("rate_limit")
        key: str | None = options.get("rate_key")
        if key is not None and limit is None:
            raise ConfigurationError(f"task {task.name}: rate_key= needs a rate_limit=")
        if limit is not None:
            task.rate_limit = RateLimit.parse(limit, key=key or task.name)
        queues = task.owner.queue_rate_limits
        if task.rate_limit is not None or queues:
            task.checks.append(RateCheck(task.name, task.rate_limit, queues))


class RateCheck:
    """The start check of one task's rate limits (its own, then its queue's).

    Args:
        task_name: the task's name (its bucket's key when the limit names none).
        limit: the task's own limit, or ``None``.
        queue_limits: the Queue's limits per queue name (:func:`queue_limits`).
    """

    __slots__ = ("_buckets", "limit", "queue_limits", "task_name")

    def __init__(
        self, task_name: str, limit: RateLimit | None, queue_limits: Mapping[str, RateLimit]
    ) -> None:
        self.task_name = task_name
        self.limit = limit
        self.queue_limits = queue_limits
        self._buckets: dict[str, list[Bucket]] = {}

    def buckets(self, physical: str) -> list[Bucket]:
        """The buckets a start taken from queue ``physical`` (``<q>``, ``<q>:high``, …) draws
        a token from: the task's, then its queue's (worked out once per queue)."""
        buckets = self._buckets.get(physical)
        if buckets is None:
            buckets = []
            if self.limit is not None:
                limit = self.limit
                buckets.append((limit.key or self.task_name, limit.rate, limit.capacity))
            queue_limit = self.queue_limits.get(base_queue(physical))
            if queue_limit is not None:
                buckets.append((queue_limit.key or "", queue_limit.rate, queue_limit.capacity))
            self._buckets[physical] = buckets
        return buckets

    async def __call__(self, worker: WorkerContext, job: Job) -> Completion | None:
        """``None`` to start now (a token taken or already reserved), else the completion
        that puts ``job`` back on the schedule until its token exists."""
        if job.envelope.reserved:
            return None
        buckets = self.buckets(job.delivery.queue)
        if not buckets:
            return None
        reserved, wait = await worker.broker.acquire_rate(buckets)
        if reserved and wait <= RATE_SLACK:
            job.envelope = msgspec.structs.replace(job.envelope, reserved=True)
            return None
        return worker.reschedule(job, wait, reserved=reserved)


__all__ = ["RATE_SLACK", "Bucket", "RateCheck", "RateLimits", "queue_limits"]
