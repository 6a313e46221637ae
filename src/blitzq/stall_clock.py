"""Noticing that this process itself did not run, before judging the silence of others.

A watchdog compares the time since another party last showed life (a worker's heartbeat, a
worker's lease renewal or registration) with a deadline. When the watchdog itself was not
running, e.g. the whole host was frozen (a VM pause or migration, a laptop asleep, SIGSTOP of
a process tree), the others were frozen with it: their silence says nothing about them, and
judging it at resume would kill or recover peers that are healthy and about to beat again.
:class:`StallClock` tells the watchdog that its own turn came far later than it asked for;
the watchdog then gives the others a fresh grace period instead of judging them.

Two clocks are read, because a pause shows in different clocks depending on its kind:
``CLOCK_MONOTONIC`` advances while a process is stopped (SIGSTOP, a VM whose clock is kept
running) but, on Linux, not while the system is suspended; ``CLOCK_BOOTTIME`` advances in
both. Where ``CLOCK_BOOTTIME`` does not exist, the wall clock (``time.time``) stands in; its
steps (an NTP correction, a clock set forward) at worst look like a pause, which only delays a
judgement by one grace period. The time the process did not run is the larger of the two
measurements.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

__all__ = ["HEARTBEAT_SLACK", "StallClock", "heartbeat_slack", "host_clocks"]

#: Most seconds a turn of a heartbeat watchdog (the supervisor's loop) may come late before it
#: counts as a pause of the watchdog (a quarter of the heartbeat timeout when that is less).
HEARTBEAT_SLACK = 5.0


def heartbeat_slack(heartbeat_timeout: float | None) -> float:
    """The ``slack`` of a watchdog of heartbeats with ``heartbeat_timeout`` (seconds;
    ``None``: heartbeats not watched): at most :data:`HEARTBEAT_SLACK`, a quarter of the
    timeout when that is less, at least 0.25 s. A pause of the whole host just below it leaves
    a watched party's last beat (one comes every fifth of the timeout) younger than the
    timeout."""
    if heartbeat_timeout is None:
        return HEARTBEAT_SLACK
    return min(HEARTBEAT_SLACK, max(0.25, heartbeat_timeout / 4))


def _boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def host_clocks() -> tuple[Callable[[], float], ...]:
    """The clocks :class:`StallClock` reads by default: ``time.monotonic`` and
    ``CLOCK_BOOTTIME`` (Linux), or the wall clock where ``CLOCK_BOOTTIME`` is missing."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        try:
            _boottime()
        except OSError:
            pass
        else:
            return (time.monotonic, _boottime)
    return (time.monotonic, time.time)


class StallClock:
    """Measure how much later than expected this process took its next turn.

    Call :meth:`expect` before waiting (a sleep, a ``select``) with the seconds the wait may
    last, and :meth:`stalled` when the turn comes: it returns the seconds the turn came late
    when that is ``slack`` or more (the process was not running: paused, suspended, starved),
    else ``0.0``.

    Args:
        slack: seconds (> 0) a turn may come late without counting as a stall (scheduling
            delays of a busy host).
        clocks: the time sources in seconds (default: :func:`host_clocks`); the lateness is
            the largest any of them measured.

    Raises:
        ValueError: ``slack`` is not positive, or no clock is given.
    """

    def __init__(self, slack: float, clocks: Sequence[Callable[[], float]] | None = None) -> None:
        if not slack > 0:
            raise ValueError(f"slack must be > 0 seconds, got {slack!r}")
        self.slack = slack
        self._clocks = tuple(host_clocks() if clocks is None else clocks)
        if not self._clocks:
            raise ValueError("clocks must name at least one clock")
        self._marks: tuple[float, ...] | None = None
        self._expected = 0.0
        #: Stalls noticed so far.
        self.stalls = 0

    def expect(self, seconds: float) -> None:
        """Note that the next turn should come within ``seconds`` (>= 0; less counts as 0)."""
        self._marks = tuple(clock() for clock in self._clocks)
        self._expected = max(0.0, seconds)

    def stalled(self) -> float:
        """Seconds the turn came late beyond what :meth:`expect` allowed, when ``slack`` or
        more; ``0.0`` otherwise, and when no :meth:`expect` came since the last call."""
        marks, self._marks = self._marks, None
        if marks is None:
            return 0.0
        waited = max(clock() - mark for clock, mark in zip(self._clocks, marks, strict=True))
        late = waited - self._expected
        if late < self.slack:
            return 0.0
        self.stalls += 1
        return late
