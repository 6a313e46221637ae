"""When periodic tasks run: :class:`Every` (fixed interval) and :class:`Cron` (cron expression).

Both are pure functions of time: every scheduler process computes the same occurrence times
(Unix seconds, floats), so concurrent schedulers agree on what "the 12:05 run" is and the broker
can make exactly one of them dispatch it.

* :class:`Every` is aligned to the Unix epoch: occurrences are the times ``t`` where
  ``(t - offset) % seconds == 0``. ``Every(60)`` fires at the start of each UTC minute whatever
  time the scheduler started.
* :class:`Cron` evaluates a cron expression (the ``croniter`` library) on the wall clock of an
  IANA time zone, with a daylight-saving policy that never skips a day and never stalls:

  - an entry whose hour field is ``*`` (``*/15 * * * *``, ``@hourly``) follows real elapsed
    time: it fires at every instant whose local wall reading matches, so in the hour repeated
    in autumn it fires in both passes (25 hourly runs that local day), and the hour skipped
    in spring simply does not exist (the spacing stays real);
  - any other entry (a fixed hour, ``30 2 * * *``, ``0 9 * * 1-5``) fires once per matching
    local wall time: a repeated wall time fires once, at its first pass, and a wall time
    inside the spring-forward gap fires once, at the first instant after the gap (the moment
    the clocks jump), so a daily entry runs every day.
"""

from __future__ import annotations

import abc
import collections
import datetime as _dt
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from .exceptions import ConfigurationError

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

__all__ = ["CRON_ALIASES", "Cron", "Every", "Schedule"]

_UTC = _dt.UTC
#: The shorthands a cron expression may be instead of its five fields (any case).
CRON_ALIASES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
#: Candidate wall times one :meth:`Cron.next_after` call may examine before giving up.
_MAX_CRON_STEPS = 100_000
#: How far around an instant :meth:`Cron.next_after` looks for a UTC-offset change (seconds);
#: longer than any daylight-saving shift (at most 2 h) or repeated hour.
_TRANSITION_WINDOW = 3 * 3600.0


class Schedule(abc.ABC):
    """A set of occurrence times (Unix seconds); see :class:`Every` and :class:`Cron`."""

    @abc.abstractmethod
    def next_after(self, ts: float) -> float:
        """The first occurrence strictly after ``ts`` (Unix seconds).

        Raises:
            ConfigurationError: the schedule has no occurrence after ``ts``.
        """

    @abc.abstractmethod
    def describe(self) -> str:
        """A short human-readable description (``every 60s``, ``cron */5 * * * * (UTC)``)."""

    def occurrences(self, start: float, end: float) -> Iterator[float]:
        """Occurrences ``t`` with ``start < t <= end`` (Unix seconds), in increasing order."""
        t = self.next_after(start)
        while t <= end:
            yield t
            t = self.next_after(t)

    def latest(self, after: float, until: float, limit: int) -> list[float]:
        """The newest ``limit`` occurrences in ``(after, until]``, oldest first.

        Searches backwards from ``until`` in doubling windows, so the cost depends on
        ``limit`` and the schedule's density, not on how far back ``after`` lies.

        Args:
            after: exclusive lower bound (Unix seconds).
            until: inclusive upper bound (Unix seconds).
            limit: most occurrences to return (``>= 1``).
        """
        if until <= after or limit < 1:
            return []
        window = 60.0
        while True:
            start = max(after, until - window)
            found = collections.deque(self.occurrences(start, until), maxlen=limit)
            if start <= after or len(found) >= limit:
                return list(found)
            window *= 2

    def __str__(self) -> str:
        return self.describe()


class Every(Schedule):
    """Every ``seconds`` seconds, aligned to the Unix epoch (plus ``offset``).

    Occurrences are the Unix times ``t`` with ``(t - offset) % seconds == 0``: ``Every(3600)``
    fires on the hour (UTC), ``Every(3600, offset=15 * 60)`` at a quarter past. Independent of
    time zones and daylight saving.

    Args:
        seconds: the interval, ``>= 1`` second (a float or a ``timedelta``).
        offset: shift of the occurrences from the epoch alignment, in seconds.

    Raises:
        ConfigurationError: ``seconds < 1`` or a non-finite value.
    """

    __slots__ = ("offset", "seconds")

    def __init__(self, seconds: float | _dt.timedelta, offset: float | _dt.timedelta = 0.0) -> None:
        if isinstance(seconds, _dt.timedelta):
            seconds = seconds.total_seconds()
        if isinstance(offset, _dt.timedelta):
            offset = offset.total_seconds()
        seconds, offset = float(seconds), float(offset)
        if not math.isfinite(seconds) or seconds < 1:
            raise ConfigurationError(
                f"Every() needs an interval of at least 1 second, got {seconds}"
            )
        if not math.isfinite(offset):
            raise ConfigurationError(f"Every() offset must be finite, got {offset}")
        self.seconds = seconds
        self.offset = offset

    def next_after(self, ts: float) -> float:
        """The first ``offset + k * seconds`` strictly after ``ts`` (Unix seconds)."""
        k = math.floor((ts - self.offset) / self.seconds) + 1
        t = self.offset + k * self.seconds
        while t <= ts:  # float rounding
            k += 1
            t = self.offset + k * self.seconds
        while self.offset + (k - 1) * self.seconds > ts:
            k -= 1
            t = self.offset + k * self.seconds
        return t

    def latest(self, after: float, until: float, limit: int) -> list[float]:
        """The newest ``limit`` occurrences in ``(after, until]``, oldest first (arithmetic)."""
        if until <= after or limit < 1:
            return []
        first = self.next_after(after)
        if first > until:
            return []
        last = self.next_after(until) - self.seconds
        count = min(limit, math.floor((last - first) / self.seconds + 0.5) + 1)
        return [last - (count - 1 - i) * self.seconds for i in range(count)]

    def describe(self) -> str:
        """``every 60s`` (plus ``+15s`` when there is an offset)."""
        text = f"every {self.seconds:g}s"
        return text + (f" +{self.offset:g}s" if self.offset else "")

    def __repr__(self) -> str:
        return f"Every({self.seconds:g}, offset={self.offset:g})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Every):
            return NotImplemented
        return (self.seconds, self.offset) == (other.seconds, other.offset)

    def __hash__(self) -> int:
        return hash((Every, self.seconds, self.offset))


_CRON_FIELDS = ("minute", "hour", "day-of-month", "month", "day-of-week")
_RANGES = ("0-59", "0-23", "1-31", "1-12 or jan-dec", "0-7 or sun-sat, 0 and 7 are Sunday")


def _cron_reason(fields: list[str]) -> str:
    """Why croniter refuses the cron expression of ``fields``: the first field refused on its
    own (the others ``*``) and croniter's words for it."""
    from croniter import croniter

    def refusal(expression: str) -> str | None:
        try:
            croniter(expression)
        except Exception as exc:  # croniter raises several types (CroniterError, ValueError)
            return str(exc) or type(exc).__name__
        return None

    if len(fields) == 5:
        for i, name in enumerate(_CRON_FIELDS):
            alone = ["*"] * 5
            alone[i] = fields[i]
            reason = refusal(" ".join(alone))
            if reason is not None:
                return f"the {name} field {fields[i]!r} is refused ({reason}; {_RANGES[i]})"
    return refusal(" ".join(fields)) or "croniter refuses it"


class Cron(Schedule):
    """A cron expression evaluated on the wall clock of an IANA time zone.

    Exactly the five standard fields (``minute hour day-of-month month day-of-week``), or one
    of the shorthands :data:`CRON_ALIASES` (``@hourly``, ``@daily``, ``@midnight``,
    ``@weekly``, ``@monthly``, ``@yearly``, ``@annually``). croniter's extensions that change
    the meaning of the fields (a sixth field for seconds, a seventh for years) are refused,
    so an expression means what cron(8) says it means.

    Daylight saving (the policy; see also ``docs/periodic.md``):

    * hour field ``*`` (``*/15 * * * *``, ``0 * * * *``): the entry follows real elapsed time.
      It fires at every instant whose local wall reading matches the expression, so both
      passes of the hour repeated in autumn fire (``0 * * * *`` in US/Pacific runs 25 times
      on 2026-11-01, at 01:00 PDT and 01:00 PST), and ``*/15`` keeps 15 real minutes between
      runs across both changes.
    * any other hour field (``30 2 * * *``, ``0 9 * * 1-5``, ``0 */2 * * *``): once per
      matching local wall time. A repeated wall time fires at its first pass only; a wall
      time that does not exist (inside the spring-forward gap) fires once, at the first
      instant after the gap: ``30 2 * * *`` in Europe/Paris runs at 03:00 CEST (01:00 UTC)
      on 2026-03-29. So an entry that matches a local day never skips it.

    Args:
        expression: the cron expression.
        tz: IANA zone name (``"Europe/Berlin"``) or a ``ZoneInfo``; default UTC.

    Raises:
        ConfigurationError: an invalid expression (not five fields nor a shorthand, or a
            field out of range), an unknown zone, or an expression that never matches
            (``0 0 30 2 *``).
    """

    __slots__ = ("_every_hour", "_zone", "expression", "tz")

    def __init__(self, expression: str, tz: str | ZoneInfo | None = None) -> None:
        if not isinstance(expression, str):
            raise ConfigurationError(f"a cron expression must be a str, got {expression!r}")
        fields = expression.split()
        if len(fields) == 1 and fields[0].startswith("@"):
            if fields[0].lower() not in CRON_ALIASES:
                raise ConfigurationError(
                    f"invalid cron expression {expression!r}: the shorthands are "
                    f"{', '.join(sorted(CRON_ALIASES))}"
                )
        elif len(fields) != 5:
            raise ConfigurationError(
                f"invalid cron expression {expression!r}: {len(fields)} fields, a cron "
                "expression has exactly 5 (minute hour day-of-month month day-of-week)"
            )
        # croniter (and dateutil under it) and zoneinfo are imported by the first Cron, not by
        # every process that imports blitzq (an idle worker's memory, issue 29).
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        from croniter import CroniterError, croniter

        if not croniter.is_valid(expression.strip()):
            raise ConfigurationError(
                f"invalid cron expression {expression!r}: {_cron_reason(fields)}"
            )
        if isinstance(tz, ZoneInfo):
            zone = tz
        else:
            try:
                zone = ZoneInfo(tz or "UTC")
            except (ZoneInfoNotFoundError, ValueError) as exc:
                raise ConfigurationError(f"unknown time zone {tz!r}: {exc}") from None
        self.expression = expression.strip()
        self.tz = zone.key
        self._zone = zone
        try:
            hours = croniter(self.expression).expanded[1]
        except CroniterError as exc:
            raise ConfigurationError(f"invalid cron expression {expression!r}: {exc}") from None
        #: The hour field is ``*``: step in real elapsed time (see the class docstring).
        self._every_hour = hours == ["*"]
        self.next_after(_dt.datetime.now(_UTC).timestamp())  # never matching: fail now

    def _offset(self, ts: float) -> _dt.timedelta | None:
        return _dt.datetime.fromtimestamp(ts, self._zone).utcoffset()

    def _gap_end(self, wall: _dt.datetime) -> float:
        """The first instant after the spring-forward gap that contains the wall time ``wall``.

        ``fold=1`` maps a wall time in the gap before the jump and ``fold=0`` after it
        (PEP 495), so the jump lies between the two; found by bisection on whole seconds
        (zone transitions are on whole seconds).
        """
        lo = math.floor(wall.replace(tzinfo=self._zone, fold=1).timestamp())
        hi = math.ceil(wall.replace(tzinfo=self._zone, fold=0).timestamp())
        before = self._offset(lo)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._offset(mid) == before:
                lo = mid
            else:
                hi = mid
        return float(hi)

    def _instants(self, wall: _dt.datetime) -> list[float]:
        """The instants (Unix seconds, increasing) at which the naive wall time ``wall`` fires."""
        first = wall.replace(tzinfo=self._zone, fold=0)
        if first.astimezone(_UTC).astimezone(self._zone).replace(tzinfo=None) != wall:
            # In a spring-forward gap: real time never shows this wall reading.
            return [] if self._every_hour else [self._gap_end(wall)]
        ts = first.timestamp()
        if self._every_hour:
            second = wall.replace(tzinfo=self._zone, fold=1).timestamp()
            if second != ts:  # a repeated wall time: both passes are real instants
                return [ts, second]
        return [ts]

    def next_after(self, ts: float) -> float:
        """The first occurrence strictly after ``ts`` (Unix seconds).

        croniter iterates naive wall times (so it never sees a DST change); each candidate is
        mapped to its instants by the daylight-saving policy (see the class docstring), and
        the earliest instant after ``ts`` wins. Near an offset change the search starts one
        shift earlier, since a wall time in the repeated hour can come after ``ts`` in real
        time although its reading is earlier.

        Raises:
            ConfigurationError: the expression matches no time after ``ts``.
        """
        start = _dt.datetime.fromtimestamp(ts, self._zone).replace(tzinfo=None)
        if self._every_hour:
            early, late = (
                self._offset(ts - _TRANSITION_WINDOW),
                self._offset(ts + _TRANSITION_WINDOW),
            )
            if early is not None and late is not None and early != late:
                start -= abs(early - late) + _dt.timedelta(seconds=1)
        best: float | None = None
        from croniter import CroniterError, croniter  # imported already by __init__

        try:
            it = croniter(self.expression, start)
            for _ in range(_MAX_CRON_STEPS):
                instants = self._instants(it.get_next(_dt.datetime))
                for instant in instants:
                    if instant > ts and (best is None or instant < best):
                        best = instant
                # Later wall times map to instants no earlier than this one's first.
                if best is not None and instants and instants[0] >= best:
                    return best
        except CroniterError as exc:
            if best is not None:
                return best
            raise ConfigurationError(
                f"cron expression {self.expression!r} has no time after {start}: {exc}"
            ) from None
        if best is not None:
            return best
        raise ConfigurationError(f"cron expression {self.expression!r} matches no existing time")

    def describe(self) -> str:
        """``cron */5 * * * * (Europe/Berlin)``."""
        return f"cron {self.expression} ({self.tz})"

    def __repr__(self) -> str:
        return f"Cron({self.expression!r}, tz={self.tz!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Cron):
            return NotImplemented
        return (self.expression, self.tz) == (other.expression, other.tz)

    def __hash__(self) -> int:
        return hash((Cron, self.expression, self.tz))
