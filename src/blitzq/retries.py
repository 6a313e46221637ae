"""Retry policy: how many times a failed task runs again, and how long it waits first.

Backoff is exponential with jitter, from Marc Brooker, "Exponential Backoff And Jitter"
(AWS Architecture Blog, 2015): the n-th retry waits ``min(max_delay, base * factor**(n-1))``
seconds, and "full" jitter draws the wait uniformly from ``[0, that]`` so that many tasks that
failed together do not retry together. A retry never sleeps in a worker slot: the message goes
back to the broker's schedule with its due time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from ._checks import integer, seconds
from .exceptions import ConfigurationError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """When and how a failing task is retried.

    Args:
        max_retries: retries after the first attempt (so ``max_retries + 1`` attempts in all);
            ``None`` takes the task's ``retries=`` setting.
        base: delay in seconds before the first retry.
        factor: multiplier per further retry (1.0 gives a fixed delay).
        max_delay: upper bound of one delay, in seconds.
        jitter: ``"full"`` (uniform in [0, delay]), ``"equal"`` (uniform in [delay/2, delay])
            or ``"none"``.
        retry_on: exception types that are retried; others fail at once. Empty = all
            ``Exception`` subclasses.
        dont_retry_on: exception types never retried (checked first).

    Raises:
        ConfigurationError: a delay that is negative, not a finite number or over ten years,
            a factor below 1 or not finite, a non-int ``max_retries``, or an unknown jitter
            mode.
    """

    max_retries: int | None = None
    base: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: Literal["full", "equal", "none"] = "full"
    retry_on: tuple[type[BaseException], ...] = field(default=())
    dont_retry_on: tuple[type[BaseException], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.max_retries is not None:
            integer("max_retries", self.max_retries, minimum=0)
        seconds("base", self.base, strict=False)
        seconds("max_delay", self.max_delay, strict=False)
        if isinstance(self.factor, bool) or not isinstance(self.factor, int | float):
            raise ConfigurationError(f"factor must be a number >= 1, got {self.factor!r}")
        if not (math.isfinite(self.factor) and self.factor >= 1):
            raise ConfigurationError(f"factor must be a finite number >= 1, got {self.factor}")
        if self.jitter not in ("full", "equal", "none"):
            raise ConfigurationError(f"jitter must be full, equal or none, got {self.jitter!r}")

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        try:
            ceiling = min(self.max_delay, self.base * self.factor ** max(0, retry - 1))
        except OverflowError:  # factor ** n past the float range: the bound applies
            ceiling = self.max_delay
        draw = (rng or random).random()
        if self.jitter == "full":
            return ceiling * draw
        if self.jitter == "equal":
            return ceiling / 2 + ceiling / 2 * draw
        return ceiling

    def should_retry(self, exc: BaseException) -> bool:
        """Whether this exception type is retried at all (ignoring the attempt count)."""
        if self.dont_retry_on and isinstance(exc, self.dont_retry_on):
            return False
        if self.retry_on:
            return isinstance(exc, self.retry_on)
        return isinstance(exc, Exception)


DEFAULT_RETRY_POLICY = RetryPolicy()
