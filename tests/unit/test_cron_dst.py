"""Cron across daylight-saving changes: the policy of ``blitzq.schedules.Cron`` pinned down.

- hour field ``*``: real elapsed time (both passes of a repeated hour fire, spacing stays
  real);
- any other hour field: once per matching local wall time; a wall time inside the
  spring-forward gap fires once, at the first instant after the gap; no day is skipped.

The issue-7 inputs are checked value by value, then exhaustively from every minute of each
DST day (``next_after`` agrees with the day's list wherever it starts), then as properties over
zones and years (hypothesis).
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blitzq.schedules import Cron

UTC = dt.UTC


def day_bounds(tz: str, year: int, month: int, day: int) -> tuple[float, float]:
    """Unix times of local midnight starting the day and the next day."""
    zone = ZoneInfo(tz)
    start = dt.datetime(year, month, day, tzinfo=zone)
    end = dt.datetime.combine(start.date() + dt.timedelta(days=1), dt.time(), tzinfo=zone)
    return start.timestamp(), end.timestamp()


def runs_on(cron: Cron, tz: str, year: int, month: int, day: int) -> list[float]:
    """Occurrences in the local day ``[midnight, next midnight)``."""
    start, end = day_bounds(tz, year, month, day)
    return [t for t in cron.occurrences(start - 1e-3, end) if t < end]


def utc_hm(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, UTC).strftime("%H:%M")


def check_next_after_from_every_minute(cron: Cron, start: float, end: float) -> None:
    """``next_after(t)`` for every minute (and half-minute) ``t`` of ``[start, end)`` is the
    first occurrence of the enumerated list after ``t``."""
    runs = list(cron.occurrences(start - 7200, end))
    runs.append(cron.next_after(runs[-1] if runs else end))
    t = start
    while t < end:
        for probe in (t, t + 30.0):
            expected = runs[bisect.bisect_right(runs, probe)]
            assert cron.next_after(probe) == expected, (cron, probe)
        t += 60.0


# ------------------------------------------------------------------ the inputs
def test_hourly_in_us_pacific_fires_25_times_on_the_fall_back_day() -> None:
    """Issue 7 §5: 24 runs, 09:00Z (01:00 PST) skipped. Now both 01:00s fire."""
    cron = Cron("0 * * * *", tz="US/Pacific")
    runs = runs_on(cron, "US/Pacific", 2026, 11, 1)
    assert len(runs) == 25
    assert "08:00" in map(utc_hm, runs)  # 01:00 PDT
    assert "09:00" in map(utc_hm, runs)  # 01:00 PST
    assert {b - a for a, b in itertools.pairwise(runs)} == {3600.0}
    check_next_after_from_every_minute(cron, *day_bounds("US/Pacific", 2026, 11, 1))


def test_quarter_hourly_in_paris_has_no_75_minute_gap_on_the_fall_back_day() -> None:
    cron = Cron("*/15 * * * *", tz="Europe/Paris")
    runs = runs_on(cron, "Europe/Paris", 2026, 10, 25)
    assert len(runs) == 25 * 4
    assert {b - a for a, b in itertools.pairwise(runs)} == {900.0}
    check_next_after_from_every_minute(cron, *day_bounds("Europe/Paris", 2026, 10, 25))


def test_a_fixed_time_in_the_paris_spring_gap_fires_once_right_after_it() -> None:
    """Issue 7 §5: ``30 2 * * *`` never fired on 2026-03-29. Now once, at 01:00Z."""
    cron = Cron("30 2 * * *", tz="Europe/Paris")
    runs = runs_on(cron, "Europe/Paris", 2026, 3, 29)
    assert runs == [dt.datetime(2026, 3, 29, 1, 0, tzinfo=UTC).timestamp()]
    assert [utc_hm(t) for t in runs_on(cron, "Europe/Paris", 2026, 3, 28)] == ["01:30"]
    assert [utc_hm(t) for t in runs_on(cron, "Europe/Paris", 2026, 3, 30)] == ["00:30"]
    check_next_after_from_every_minute(cron, *day_bounds("Europe/Paris", 2026, 3, 29))


def test_daily_midnight_in_santiago_runs_on_the_spring_forward_day() -> None:
    """Issue 7 §5: ``0 0 * * *`` skipped 2026-09-06 (00:00 jumps to 01:00). Now at 01:00."""
    cron = Cron("0 0 * * *", tz="America/Santiago")
    runs = runs_on(cron, "America/Santiago", 2026, 9, 6)
    assert runs == [dt.datetime(2026, 9, 6, 4, 0, tzinfo=UTC).timestamp()]  # 01:00 -03
    for day in (5, 6, 7):
        assert len(runs_on(cron, "America/Santiago", 2026, 9, day)) == 1
    check_next_after_from_every_minute(cron, *day_bounds("America/Santiago", 2026, 9, 6))


def test_a_fixed_time_in_the_repeated_hour_fires_once_at_its_first_pass() -> None:
    cron = Cron("30 1 * * *", tz="US/Pacific")
    runs = runs_on(cron, "US/Pacific", 2026, 11, 1)
    assert [utc_hm(t) for t in runs] == ["08:30"]  # 01:30 PDT, not again at 01:30 PST
    check_next_after_from_every_minute(cron, *day_bounds("US/Pacific", 2026, 11, 1))


@pytest.mark.parametrize(
    ("expression", "tz", "date"),
    [
        ("0 * * * *", "US/Pacific", (2026, 3, 8)),
        ("*/15 * * * *", "Europe/Paris", (2026, 3, 29)),
        ("*/10 * * * *", "America/Santiago", (2026, 4, 4)),
        ("0 0 * * *", "America/Santiago", (2026, 4, 4)),
        ("0,30 2 * * *", "Europe/Paris", (2026, 3, 29)),
        ("* 2 * * *", "Europe/Paris", (2026, 3, 29)),
        ("0 */2 * * *", "US/Pacific", (2026, 11, 1)),
        ("30 2 * * 0", "Europe/Berlin", (2026, 3, 29)),
    ],
)
def test_next_after_agrees_with_the_day_from_every_minute(
    expression: str, tz: str, date: tuple[int, int, int]
) -> None:
    cron = Cron(expression, tz=tz)
    check_next_after_from_every_minute(cron, *day_bounds(tz, *date))
    runs = list(cron.occurrences(*day_bounds(tz, *date)))
    assert runs == sorted(set(runs))


def test_several_gap_times_fire_once_together() -> None:
    """``0,30 2`` and ``* 2`` on the spring day: every 02:xx is in the gap -> one run."""
    for expression in ("0,30 2 * * *", "* 2 * * *"):
        runs = runs_on(Cron(expression, tz="Europe/Paris"), "Europe/Paris", 2026, 3, 29)
        assert [utc_hm(t) for t in runs] == ["01:00"], expression


# ---------------------------------------------------------------------------- properties
#: Zones with daylight saving (one-hour shifts), including ones that change at midnight
#: (Santiago, Havana), a half-hour base offset (St John's) and the southern hemisphere.
DST_ZONES = [
    "Europe/Paris",
    "Europe/London",
    "US/Pacific",
    "America/New_York",
    "America/Santiago",
    "America/Havana",
    "America/St_Johns",
    "Australia/Sydney",
    "Pacific/Auckland",
    "Asia/Jerusalem",
]


def transitions(zone: ZoneInfo, year: int) -> list[float]:
    """Instants (to the hour) where the zone's UTC offset changes during ``year``."""
    t = dt.datetime(year, 1, 1, tzinfo=UTC).timestamp()
    end = dt.datetime(year + 1, 1, 1, tzinfo=UTC).timestamp()
    found, last = [], dt.datetime.fromtimestamp(t, zone).utcoffset()
    while t < end:
        t += 3600
        offset = dt.datetime.fromtimestamp(t, zone).utcoffset()
        if offset != last:
            found.append(t)
            last = offset
    return found


@settings(max_examples=40, deadline=None)
@given(
    tz=st.sampled_from(DST_ZONES),
    year=st.integers(2024, 2032),
    hour=st.integers(0, 23),
    minute=st.integers(0, 59),
)
def test_a_daily_entry_never_skips_a_day(tz: str, year: int, hour: int, minute: int) -> None:
    zone = ZoneInfo(tz)
    cron = Cron(f"{minute} {hour} * * *", tz=tz)
    for change in transitions(zone, year):
        start, end = change - 3 * 86400, change + 3 * 86400
        runs = list(cron.occurrences(start, end))
        assert all(b > a for a, b in itertools.pairwise(runs))
        # One run per day: never two days apart, never twice in a few hours.
        for a, b in itertools.pairwise(runs):
            assert 22 * 3600 <= b - a <= 26 * 3600, (tz, hour, minute, a, b)
        assert len(runs) in (5, 6, 7)
        days = {dt.datetime.fromtimestamp(t, zone).date() for t in runs}
        assert len(days) == len(runs)  # one run per local date


@settings(max_examples=25, deadline=None)
@given(
    tz=st.sampled_from(DST_ZONES),
    year=st.integers(2024, 2032),
    step=st.sampled_from([1, 5, 10, 15, 20, 30]),
)
def test_every_n_minutes_keeps_real_spacing(tz: str, year: int, step: int) -> None:
    zone = ZoneInfo(tz)
    cron = Cron(f"*/{step} * * * *", tz=tz)
    for change in transitions(zone, year):
        runs = list(cron.occurrences(change - 2 * 3600, change + 2 * 3600))
        assert {b - a for a, b in itertools.pairwise(runs)} == {step * 60.0}, tz
        # next_after from any instant is the first run after it.
        for probe in (change - 3601.5, change - 1, change, change + 1799.25, change + 3599):
            assert cron.next_after(probe) == next(r for r in runs if r > probe)


@settings(max_examples=40, deadline=None)
@given(
    tz=st.sampled_from(DST_ZONES),
    year=st.integers(2024, 2032),
    expression=st.sampled_from(
        ["0 * * * *", "30 * * * *", "0 2 * * *", "30 1 * * *", "15 0 * * *", "0 */3 * * *"]
    ),
    offset=st.floats(-2 * 86400, 2 * 86400),
)
def test_occurrences_strictly_increase_and_next_after_is_strict(
    tz: str, year: int, expression: str, offset: float
) -> None:
    cron = Cron(expression, tz=tz)
    for change in transitions(ZoneInfo(tz), year):
        t = change + offset
        for _ in range(30):
            nxt = cron.next_after(t)
            assert nxt > t
            t = nxt
