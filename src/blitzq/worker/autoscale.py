"""The supervisor's autoscaler (``blitzq worker … --autoscale MIN,MAX``): when to add a worker
process and which idle one to remove.

Once per sampling interval the supervisor's :class:`~blitzq.worker.sampler.Sampler` reads the
queues its workers consume (messages waiting, the age of the oldest waiting message), whether
each of its worker processes runs a task (from the workers' registrations) and the runtime
setpoint of ``blitzq control scale``; :meth:`Autoscaler.decide` turns that
:class:`Sample` into a :class:`Decision`:

- **Bounds.** The setpoint in Redis (of the supervisor's ``--group``), when one is set and
  accepted (:func:`check_setpoint`: whole numbers, ``1 <= min <= max <= headroom``, the
  headroom being ``--max-processes``, else :data:`HARD_CAP`), replaces ``MIN,MAX`` of the
  command line; a rejected one leaves them and its reason goes into the published status.
  Fewer processes than the minimum: add the missing ones at once; more than the
  maximum: remove the surplus at once (gracefully), whatever the cooldown and the ages.
- **Up.** More than ``backlog`` messages waiting per process, or an oldest waiting message
  older than ``latency`` seconds (reliable mode; fast mode has no age): add
  ``ceil(waiting / backlog) - processes`` processes (at least one, at most up to the
  maximum), then wait ``cooldown`` seconds before the next change.
- **Down.** Nothing waiting and a process that has run no task for ``idle`` seconds and is
  at least ``min_age`` seconds old: remove that one (the youngest such), one per
  ``cooldown``, never below the minimum. Waiting messages end every idle period.

Messages wait only when every worker's slots are taken (a worker fetches no more than it has
free slots), so a waiting backlog means the processes are saturated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..exceptions import ConfigurationError

__all__ = [
    "HARD_CAP",
    "AutoscaleSettings",
    "Autoscaler",
    "Decision",
    "Sample",
    "check_group",
    "check_range",
    "check_setpoint",
]

#: Most worker processes one supervisor runs, whatever ``--autoscale`` or the setpoint says.
HARD_CAP = 64


#: What a ``--group`` label may hold: 1 to 64 letters, digits, ``_``, ``-`` and ``.``.
GROUP_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def check_group(label: str) -> str | None:
    """Why ``label`` is not a valid ``--group`` label (:data:`GROUP_PATTERN`), or ``None``."""
    if GROUP_PATTERN.fullmatch(label):
        return None
    return f"{label!r} is not a group label (1 to 64 letters, digits, '_', '-' or '.')"


def check_range(minimum: int, maximum: int, cap: int = HARD_CAP) -> str | None:
    """Why ``minimum,maximum`` is not a valid process range, or ``None`` when it is.

    Valid: ``1 <= minimum <= maximum <= cap`` (whole numbers); ``cap`` is the hard cap or a
    supervisor's ``--max-processes`` headroom.
    """
    if isinstance(minimum, bool) or isinstance(maximum, bool):
        return "the bounds must be whole numbers"
    if minimum < 1:
        return f"the minimum must be at least 1 (got {minimum})"
    if minimum > maximum:
        return f"the minimum ({minimum}) is above the maximum ({maximum})"
    if maximum > HARD_CAP:
        return f"the maximum ({maximum}) is above the hard cap of {HARD_CAP} processes"
    if maximum > cap:
        return f"the maximum ({maximum}) is above this supervisor's --max-processes {cap}"
    return None


def check_setpoint(
    raw: Mapping[str, str] | None, headroom: int = HARD_CAP
) -> tuple[tuple[int, int] | None, str | None]:
    """Check a setpoint as read from Redis (its raw text fields, ``None``: none is set).

    Returns:
        ``(bounds, None)`` for an accepted setpoint, ``(None, reason)`` for a rejected one:
        *unreadable* (not a hash, ``min`` or ``max`` missing or not a whole number),
        *inverted* (``min`` above ``max``) or *out of range* (``min`` below 1, ``max`` above
        ``headroom`` or :data:`HARD_CAP`); ``(None, None)`` when none is set.
    """
    if raw is None:
        return None, None
    if "type" in raw and "min" not in raw:
        return None, f"unreadable: the key is a {raw['type']}, not a hash with min and max"
    numbers: list[int] = []
    for name in ("min", "max"):
        text = raw.get(name)
        if text is None:
            return None, f"unreadable: no {name!r} field"
        try:
            numbers.append(int(text.strip()))
        except ValueError:
            return None, f"unreadable: {name} {text[:40]!r} is not a whole number"
    low, high = numbers
    if low > high:
        return None, f"inverted: the minimum ({low}) is above the maximum ({high})"
    reason = check_range(low, high, headroom)
    if reason is not None:
        return None, f"out of range: {reason}"
    return (low, high), None


def parse_range(text: str) -> tuple[int, int]:
    """Parse ``"MIN,MAX"``: two whole numbers separated by a comma.

    Raises:
        ConfigurationError: not two whole numbers (a single ``"N"`` too: a fixed count is
            ``--workers N``), or out of range (:func:`check_range`); the message names
            ``text``.
    """
    parts = [p.strip() for p in text.split(",")]
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if len(numbers) != 2:
        fixed = " (a fixed number of processes is --workers N)" if len(parts) == 1 else ""
        raise ConfigurationError(f"--autoscale expects MIN,MAX (e.g. 2,8), got {text!r}{fixed}")
    reason = check_range(numbers[0], numbers[1])
    if reason:
        raise ConfigurationError(f"--autoscale {text}: {reason}")
    return numbers[0], numbers[1]


@dataclass(frozen=True)
class AutoscaleSettings:
    """How the autoscaler behaves (the ``--autoscale*`` options).

    Attributes:
        minimum, maximum: processes kept (``--autoscale MIN,MAX``), unless a setpoint is set.
        interval: seconds between two samples (``--autoscale-interval``, default 1).
        cooldown: least seconds between two changes (``--autoscale-cooldown``, default 10).
        idle: seconds a process must have run no task before it may be removed
            (``--autoscale-idle``, default 30).
        min_age: least age in seconds of a process that may be removed
            (``--autoscale-min-age``, default 30).
        backlog: messages waiting per process above which one is added
            (``--autoscale-backlog``, default 10).
        latency: age in seconds of the oldest waiting message above which one is added
            (``--autoscale-latency``, default 5; reliable mode only).
        headroom: the most processes a setpoint may ask for (``--max-processes``, default
            :data:`HARD_CAP`).
        group: the ``--group`` whose setpoint the supervisor reads (``None``: the
            namespace's setpoint for supervisors in no group).
    """

    minimum: int
    maximum: int
    interval: float = 1.0
    cooldown: float = 10.0
    idle: float = 30.0
    min_age: float = 30.0
    backlog: int = 10
    latency: float = 5.0
    headroom: int = HARD_CAP
    group: str | None = None


@dataclass(frozen=True)
class Sample:
    """What the sampler read at one interval.

    Attributes:
        waiting: messages waiting across the supervised queues.
        oldest_age: seconds the oldest waiting message has waited (``None``: unknown or none).
        busy: per worker pid seen in the registrations, whether it runs a task.
        setpoint: the runtime ``(min, max)`` from Redis when one is set and accepted
            (:func:`check_setpoint`), else ``None``.
    """

    waiting: int = 0
    oldest_age: float | None = None
    busy: Mapping[int, bool] = field(default_factory=dict)
    setpoint: tuple[int, int] | None = None


@dataclass(frozen=True)
class Decision:
    """What to do now: start ``add`` processes, gracefully stop the processes ``remove``."""

    add: int = 0
    remove: tuple[int, ...] = ()
    reason: str = ""


class Autoscaler:
    """Decide process changes from samples; see the module docstring.

    Args:
        settings: the bounds and windows.
    """

    def __init__(self, settings: AutoscaleSettings) -> None:
        self.settings = settings
        self.last_change = -math.inf
        self._idle_since: dict[int, float] = {}

    def bounds(self, sample: Sample) -> tuple[int, int]:
        """The ``(min, max)`` in force: the sample's valid setpoint, else the settings'."""
        if (
            sample.setpoint is not None
            and check_range(*sample.setpoint, self.settings.headroom) is None
        ):
            return sample.setpoint
        return self.settings.minimum, self.settings.maximum

    def decide(self, now: float, started: Mapping[int, float], sample: Sample) -> Decision:
        """The change to make at ``now`` (monotonic seconds).

        Args:
            now: the supervisor's monotonic clock.
            started: per running worker pid, its start time on the same clock.
            sample: the latest sample.
        """
        s = self.settings
        low, high = self.bounds(sample)
        count = len(started)
        self._track_idle(now, started, sample)
        if count < low:
            return self._change(now, add=low - count, reason=f"below the minimum {low}")
        if count > high:
            youngest = sorted(started, key=lambda pid: started[pid], reverse=True)
            return self._change(now, remove=youngest[: count - high], reason=f"above max {high}")
        if now - self.last_change < s.cooldown:
            return Decision()
        late = sample.oldest_age is not None and sample.oldest_age > s.latency
        if count < high and (sample.waiting > s.backlog * count or late):
            wanted = max(count + 1, math.ceil(sample.waiting / s.backlog))
            why = f"{sample.waiting} waiting" + (
                f", oldest {sample.oldest_age:.1f} s" if sample.oldest_age is not None else ""
            )
            return self._change(now, add=min(high, wanted) - count, reason=why)
        if count > low and sample.waiting == 0:
            idle = [
                pid
                for pid, since in self._idle_since.items()
                if now - since >= s.idle and now - started[pid] >= s.min_age
            ]
            if idle:
                pid = max(idle, key=lambda p: started[p])
                return self._change(now, remove=[pid], reason=f"idle for {s.idle:g} s")
        return Decision()

    def paused(self, seconds: float) -> None:
        """The supervisor did not run for ``seconds``: neither a worker's idle time nor the
        cooldown counts them (no worker is removed as idle over a pause it shared)."""
        self.last_change += seconds
        self._idle_since = {pid: since + seconds for pid, since in self._idle_since.items()}

    def _track_idle(self, now: float, started: Mapping[int, float], sample: Sample) -> None:
        for pid in list(self._idle_since):
            if pid not in started or sample.busy.get(pid, True) or sample.waiting:
                del self._idle_since[pid]
        if sample.waiting:
            return
        for pid in started:
            if sample.busy.get(pid) is False:
                self._idle_since.setdefault(pid, now)

    def _change(
        self, now: float, add: int = 0, remove: list[int] | None = None, reason: str = ""
    ) -> Decision:
        self.last_change = now
        for pid in remove or ():
            self._idle_since.pop(pid, None)
        return Decision(add, tuple(remove or ()), reason)
