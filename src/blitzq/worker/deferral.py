"""A start check that fails: an outage defers the task with backoff, an error reply spends it.

A start check (rate limit, lock, a middleware's own) asks the state store before a task
starts. When it raises, :func:`check_failed` tells two kinds apart (:func:`is_outage`):

- **an outage**: the store could not be reached or did not answer in time (a transient
  :class:`~blitzq.BrokerError`, ``TimeoutError``, ``OSError``/``ConnectionError``, or the
  check passing the worker's ``start_check_timeout``). The delivery goes back on the
  schedule, unstarted, for a delay that doubles with every deferral of the message in a
  row: ``defer_base_delay`` (1 s), 2 s, 4 s, ... up to ``defer_max_delay`` (60 s), each with
  +-20 % jitter (never past the maximum). No attempt is spent (the message's ``attempt`` is
  unchanged) and no delivery either (the delivery is acknowledged with the reschedule, the
  copy promoted later is a fresh one). The count travels in the message
  (``Envelope.deferrals``), so it grows whichever worker takes the message, and it is cleared
  as soon as a check answers. One WARNING per deferral names the task, the deferral's
  number, the next delay and the error (fields ``task_id``, ``deferrals``, ``defer_delay``).
- **an error reply** (anything else: a ``ResponseError`` such as ``WRONGTYPE``, ``NOPERM``,
  a script error; a bug in a middleware's check): the attempt fails with that error, as if
  the task had raised it. The task's retry policy applies, and once its ``retries`` are
  spent it fails, dead-lettered with reason ``"failed"`` and the error's text (unless
  ``dead_letter=False``), so a broken key never loops. Each such attempt is logged as any
  failed attempt is (:meth:`~blitzq.worker.ending.Ending.log_failure`).

Either way the task's finishers run with the completion (a lock place taken by an earlier
check is given back).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from .._checks import seconds
from ..exceptions import BrokerError, ConfigurationError, describe_error

if TYPE_CHECKING:
    from .ending import Ending
    from .execution import Job

logger = logging.getLogger("blitzq.worker")

#: Relative jitter of each deferral's delay: +-20 %.
JITTER = 0.2


@dataclass(frozen=True, slots=True)
class OutageBackoff:
    """How a worker defers a task whose start check met an outage (see the module docstring).

    Attributes:
        base: seconds of the first deferral (``Worker(defer_base_delay=...)``).
        ceiling: most seconds of any deferral (``Worker(defer_max_delay=...)``).
        timeout: seconds one start check may take before it counts as an outage
            (``Worker(start_check_timeout=...)``).
    """

    base: float = 1.0
    ceiling: float = 60.0
    timeout: float = 10.0

    @classmethod
    def checked(cls, base: float, ceiling: float, timeout: float) -> OutageBackoff:
        """The backoff for the Worker options of the same names.

        Args:
            base: ``defer_base_delay``, seconds > 0.
            ceiling: ``defer_max_delay``, seconds >= ``base``.
            timeout: ``start_check_timeout``, seconds > 0.

        Raises:
            ConfigurationError: a value that is not a finite positive number of seconds, or a
                maximum below the base.
        """
        base = seconds("defer_base_delay", base)
        ceiling = seconds("defer_max_delay", ceiling)
        timeout = seconds("start_check_timeout", timeout)
        if ceiling < base:
            raise ConfigurationError(
                f"defer_max_delay ({ceiling:g} s) must be >= defer_base_delay ({base:g} s)"
            )
        return cls(float(base), float(ceiling), float(timeout))

    def delay(self, deferral: int, rng: random.Random | None = None) -> float:
        """Seconds before a message deferred ``deferral`` times in a row (1 for the first)
        is taken again: ``base * 2 ** (deferral - 1)``, at most the ceiling, times a random
        factor in [0.8, 1.2], never past the ceiling."""
        try:
            nominal = min(self.ceiling, self.base * 2.0 ** max(0, deferral - 1))
        except OverflowError:  # 2 ** n past the float range: the ceiling applies
            nominal = self.ceiling
        factor = (rng or random).uniform(1.0 - JITTER, 1.0 + JITTER)
        return min(self.ceiling, nominal * factor)


def is_outage(exc: BaseException) -> bool:
    """Whether a start check's error means the store could not be reached or answer in time
    (trying later may succeed), rather than that it answered with an error.

    Args:
        exc: what the check raised.
    """
    if isinstance(exc, BrokerError):
        return exc.transient
    return isinstance(exc, TimeoutError | OSError)


def take_deferrals(job: Job) -> int:
    """The deferrals in a row of ``job``'s message so far; cleared from ``job.envelope`` (a
    completion a check builds from now on carries none, as the store answered)."""
    count = job.envelope.deferrals or 0
    if count:
        job.envelope = msgspec.structs.replace(job.envelope, deferrals=None)
    return count


def check_failed(
    ending: Ending, backoff: OutageBackoff, job: Job, exc: Exception, deferrals: int
) -> None:
    """A start check of ``job`` raised ``exc``: defer it (an outage) or fail the attempt
    (an error reply), committing the completion through the task's finishers. The caller
    frees the delivery's slot.

    Args:
        ending: the worker's end of runs (:class:`~blitzq.worker.ending.Ending`).
        backoff: the worker's ``outage_backoff``.
        job: the delivery whose check failed.
        exc: the error (a ``TimeoutError`` when the check passed ``start_check_timeout``).
        deferrals: the message's deferrals in a row before this one (:func:`take_deferrals`).
    """
    if not is_outage(exc):  # logged as a failed attempt (blitzq.worker.outcomes)
        ending.finish(job, None, exc)
        return
    env = job.envelope
    error_type, message = describe_error(exc)
    count = deferrals + 1
    delay = backoff.delay(count)
    if isinstance(exc, TimeoutError) and not message:
        message = f"no answer within start_check_timeout ({backoff.timeout:g} s)"
    logger.warning(
        "start check of task %s (%s) could not reach the broker (deferral %d): back on the "
        "schedule in %.2f s, no attempt spent: %s: %s",
        env.id,
        env.task,
        count,
        delay,
        error_type,
        message,
        extra={
            "task_id": env.id,
            "task": env.task,
            "deferrals": count,
            "defer_delay": round(delay, 4),
        },
    )
    job.envelope = msgspec.structs.replace(env, deferrals=count)
    ending.commit(job, ending.completions.reschedule(job, delay))


__all__ = ["JITTER", "OutageBackoff", "check_failed", "is_outage", "take_deferrals"]
