"""Rate limits: a token bucket per key, shared by every worker through Redis.

A limit of ``count`` per ``period`` seconds is a bucket that holds at most ``burst`` tokens
(``count`` unless given) and refills continuously at ``count / period`` tokens per second
(the classic token bucket, e.g. Tanenbaum, *Computer Networks*, §5.4). "100/m" lets 100 tasks
start at once after an idle minute, then one every 0.6 s.

A task over its limit is not an error: the bucket *reserves* the next free token for it and
reports how long until that token exists; the worker puts the task back on the schedule for
exactly that long (attempt unchanged, no slot held) and, when it comes back, it runs on its
reservation without asking again. So a backlog of N rate-limited tasks is rescheduled once
each instead of retrying in a herd. The bucket takes time from the Redis server inside the
script (never from the workers' clocks) so skewed clocks or reordered calls cannot let extra
tasks through.

This module is the spec (:class:`RateLimit`); the worker applies limits through the built-in
middleware :mod:`blitzq.extensions.ratelimit`.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from dataclasses import dataclass

from .exceptions import ConfigurationError

_UNITS = {
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(\d+(?:\.\d+)?)?\s*([a-z]+)\s*$")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``count`` task starts per ``period`` seconds, across all workers.

    Args:
        count: tasks per period (> 0).
        period: seconds (> 0), or a ``timedelta`` (kept as its seconds).
        burst: most tasks that may start at once after an idle period (default ``count``).
        key: bucket name; tasks with the same key share one bucket (default: the task name).

    Raises:
        ConfigurationError: a non-positive count, period or burst.
    """

    count: float
    period: float = 1.0
    burst: float | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        given: object = self.period  # a timedelta is kept as its seconds, checked as them
        if isinstance(given, _dt.timedelta):
            object.__setattr__(self, "period", given.total_seconds())
        for name, value in (("count", self.count), ("period", self.period)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigurationError(f"a rate limit's {name} must be a number, got {value!r}")
        if not (math.isfinite(self.count) and math.isfinite(self.period)):
            raise ConfigurationError("a rate limit's count and period must be finite")
        if self.count <= 0 or self.period <= 0:
            raise ConfigurationError(
                "a rate limit needs count > 0 and period > 0 seconds, got "
                f"count={self.count!r}, period={self.period!r}"
            )
        if self.burst is not None and (
            isinstance(self.burst, bool)
            or not isinstance(self.burst, int | float)
            or not math.isfinite(self.burst)
            or self.burst < 1
        ):
            raise ConfigurationError(
                f"a rate limit's burst must be a finite number >= 1, got {self.burst!r}"
            )

    @property
    def rate(self) -> float:
        """Tokens per second."""
        return self.count / self.period

    @property
    def capacity(self) -> float:
        """Bucket size (the burst)."""
        return self.burst if self.burst is not None else max(1.0, self.count)

    @classmethod
    def parse(cls, spec: str | RateLimit, key: str | None = None) -> RateLimit:
        """Read ``"10/s"``, ``"100/m"``, ``"1000/hour"`` or ``"5/10s"`` (a RateLimit passes).

        Raises:
            ConfigurationError: the text is not ``<count>/<unit>``.
        """
        if isinstance(spec, RateLimit):
            return (
                spec
                if key is None or spec.key is not None
                else cls(spec.count, spec.period, spec.burst, key)
            )
        match = _PATTERN.match(spec.lower()) if isinstance(spec, str) else None
        if match is None or match.group(3) not in _UNITS:
            raise ConfigurationError(
                f"rate limit {spec!r} is not like '10/s', '100/m', '1000/hour' or '5/10s'"
            )
        count = float(match.group(1))
        multiple = float(match.group(2)) if match.group(2) else 1.0
        return cls(count, multiple * _UNITS[match.group(3)], None, key)
