"""Retry policy: how many times a failed task runs again, and how long it waits first.

Backoff is exponential with jitter by default, from Marc Brooker, "Exponential Backoff And
Jitter" (AWS Architecture Blog, 2015): the n-th retry waits ``min(max_delay, base *
factor**(n-1))`` seconds, and "full" jitter draws the wait uniformly from ``[0, that]`` so that
many tasks that failed together do not retry together. ``backoff="linear"`` grows the ceiling
by a fixed ``increment`` per retry instead (``base + increment * (n-1)``), and
``backoff="fixed"`` keeps it at ``base``. A retry never sleeps in a worker slot: the message
goes back to the broker's schedule with its due time. A task that raises
:class:`~blitzq.exceptions.NoRetry` is never retried, whatever the policy says.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from ._checks import integer, seconds
from .exceptions import ConfigurationError, NoRetry

Backoff = Literal["exponential", "linear", "fixed"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how a failing task is retried.

    Args:
        max_retries: retries after the first attempt (so ``max_retries + 1`` attempts in all);
            ``None`` takes the task's ``retries=`` setting.
        base: delay in seconds before the first retry.
        factor: multiplier per further retry of exponential backoff (1.0 gives a fixed
            delay); not used by the other backoffs.
        max_delay: upper bound of one delay, in seconds.
        jitter: ``"full"`` (uniform in [0, delay]), ``"equal"`` (uniform in [delay/2, delay])
            or ``"none"``.
        retry_on: exception types that are retried; others fail at once. Empty = all
            ``Exception`` subclasses.
        dont_retry_on: exception types never retried (checked first; a
            :class:`~blitzq.exceptions.NoRetry` is never retried either).
        backoff: ``"exponential"`` (the ceiling of retry n is ``base * factor**(n-1)``),
            ``"linear"`` (``base + increment * (n-1)``) or ``"fixed"`` (``base``); every
            ceiling is capped at ``max_delay`` and jittered by ``jitter``.
        increment: seconds added per further retry of linear backoff; ``None`` takes
            ``base`` (so the waits are ``base, 2*base, 3*base, ...``).

    Raises:
        ConfigurationError: a delay that is negative, not a finite number or over ten years,
            a factor below 1 or not finite, a non-int ``max_retries``, or an unknown jitter
            or backoff mode.
    """

    max_retries: int | None = None
    base: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: Literal["full", "equal", "none"] = "full"
    retry_on: tuple[type[BaseException], ...] = field(default=())
    dont_retry_on: tuple[type[BaseException], ...] = field(default=())
    backoff: Backoff = "exponential"
    increment: float | None = None

    def __post_init__(self) -> None:
        if self.max_retries is not None:
            integer("max_retries", self.max_retries, minimum=0)
        # A timedelta is kept as its seconds (``_checks.seconds``): the policy computes in floats.
        object.__setattr__(self, "base", seconds("base", self.base, strict=False))
        object.__setattr__(self, "max_delay", seconds("max_delay", self.max_delay, strict=False))
        if isinstance(self.factor, bool) or not isinstance(self.factor, int | float):
            raise ConfigurationError(f"factor must be a number >= 1, got {self.factor!r}")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ConfigurationError(f"factor must be a finite number >= 1, got {self.factor}")
        if self.jitter not in ("full", "equal", "none"):
            raise ConfigurationError(f"jitter must be full, equal or none, got {self.jitter!r}")
        if self.backoff not in ("exponential", "linear", "fixed"):
            raise ConfigurationError(
                f"backoff must be exponential, linear or fixed, got {self.backoff!r}"
            )
        if self.increment is not None:
            object.__setattr__(
                self, "increment", seconds("increment", self.increment, strict=False)
            )

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry; a number
        below 1 counts as 1), drawn with ``rng`` (default: the ``random`` module)."""
        step = max(0, retry - 1)
        if self.backoff == "fixed":
            ceiling = min(self.max_delay, self.base)
        elif self.backoff == "linear":
            increment = self.base if self.increment is None else self.increment
            ceiling = min(self.max_delay, self.base + increment * step)
        else:
            try:
                ceiling = min(self.max_delay, self.base * self.factor**step)
            except OverflowError:  # factor ** n past the float range: the bound applies
                ceiling = self.max_delay
        draw = (rng or random).random()
        if self.jitter == "full":
            return ceiling * draw
        if self.jitter == "equal":
            return ceiling / 2 + ceiling / 2 * draw
        return ceiling

    def should_retry(self, exc: BaseException) -> bool:
        """Whether this exception type is retried at all (ignoring the attempt count); a
        :class:`~blitzq.exceptions.NoRetry` never is."""
        if isinstance(exc, NoRetry):
            return False
        if self.dont_retry_on and isinstance(exc, self.dont_retry_on):
            return False
        if self.retry_on:
            return isinstance(exc, self.retry_on)
        return isinstance(exc, Exception)


DEFAULT_RETRY_POLICY = RetryPolicy()
