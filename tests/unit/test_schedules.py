"""Schedules (Every, Cron across DST), periodic registration, and missed-run policies.

Pure computations: no broker is touched (``Scheduler.due`` decides what to dispatch; the
integration tests check that the broker then dispatches it exactly once).
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
from collections.abc import Callable
from zoneinfo import ZoneInfo

import pytest

from blitzq import ConfigurationError, Queue, SerializationError
from blitzq.runtime_schedules import RuntimeSchedule
from blitzq.scheduler import PeriodicTask, Scheduler, build_message
from blitzq.schedules import CRON_ALIASES, Cron, Every
from blitzq.serialization import decode_envelope

BERLIN = ZoneInfo("Europe/Berlin")
UTC = dt.UTC


def berlin(*args: int, fold: int = 0) -> float:
    """Unix time of a Europe/Berlin wall time."""
    return dt.datetime(*args, tzinfo=BERLIN, fold=fold).timestamp()  # type: ignore[misc]


def utc(*args: int) -> float:
    return dt.datetime(*args, tzinfo=UTC).timestamp()  # type: ignore[misc]


def local(ts: float) -> str:
    """A Unix time as Europe/Berlin wall time with its UTC offset."""
    return dt.datetime.fromtimestamp(ts, BERLIN).isoformat()


# ---------------------------------------------------------------- Every
def test_every_is_aligned_to_the_epoch_whatever_the_start() -> None:
    every = Every(60)
    assert every.next_after(utc(2026, 5, 1, 12, 0, 17)) == utc(2026, 5, 1, 12, 1)
    assert every.next_after(utc(2026, 5, 1, 12, 0, 59, 999000)) == utc(2026, 5, 1, 12, 1)
    # Two schedulers started at different moments compute identical occurrences.
    a = list(Every(60).occurrences(utc(2026, 5, 1, 12, 0, 3), utc(2026, 5, 1, 12, 5)))
    b = list(Every(60).occurrences(utc(2026, 5, 1, 12, 0, 41), utc(2026, 5, 1, 12, 5)))
    assert a == b == [utc(2026, 5, 1, 12, m) for m in range(1, 6)]
    assert all(t % 60 == 0 for t in a)


def test_every_next_after_is_strict_and_occurrences_are_half_open() -> None:
    every = Every(10)
    assert every.next_after(100.0) == 110.0
    assert every.next_after(99.999) == 100.0
    assert list(every.occurrences(100.0, 130.0)) == [110.0, 120.0, 130.0]
    assert list(every.occurrences(100.0, 100.0)) == []


def test_every_offset_shifts_occurrences() -> None:
    quarter_past = Every(dt.timedelta(hours=1), offset=dt.timedelta(minutes=15))
    assert quarter_past.next_after(utc(2026, 5, 1, 12, 0)) == utc(2026, 5, 1, 12, 15)
    assert quarter_past.next_after(utc(2026, 5, 1, 12, 15)) == utc(2026, 5, 1, 13, 15)
    assert all((t - 900) % 3600 == 0 for t in quarter_past.occurrences(0, 86400 * 3))
    assert Every(60, offset=5).describe() == "every 60s +5s"


def test_every_latest_returns_the_newest_occurrences_oldest_first() -> None:
    every = Every(60)
    assert every.latest(0, 600, 3) == [480.0, 540.0, 600.0]
    assert every.latest(0, 630, 100) == [60.0 * k for k in range(1, 11)]
    assert every.latest(600, 659, 5) == []
    assert every.latest(700, 600, 5) == []  # an empty interval (clock behind)
    # A year of one-second occurrences costs nothing: arithmetic, no enumeration.
    assert Every(1).latest(0, 365 * 86400, 2) == [365 * 86400 - 1.0, 365 * 86400.0]


@pytest.mark.parametrize("bad", [0, 0.5, -1, float("nan"), float("inf")])
def test_every_refuses_intervals_under_one_second(bad: float) -> None:
    with pytest.raises(ConfigurationError):
        Every(bad)


# ---------------------------------------------------------------- Cron
def test_cron_in_utc() -> None:
    cron = Cron("*/5 * * * *")
    assert cron.tz == "UTC"
    assert cron.next_after(utc(2026, 5, 1, 12, 3, 10)) == utc(2026, 5, 1, 12, 5)
    assert cron.next_after(utc(2026, 5, 1, 12, 5)) == utc(2026, 5, 1, 12, 10)  # strictly after
    assert cron.next_after(utc(2026, 5, 1, 12, 4, 59, 500000)) == utc(2026, 5, 1, 12, 5)
    assert list(cron.occurrences(utc(2026, 5, 1, 23, 50), utc(2026, 5, 2, 0, 5))) == [
        utc(2026, 5, 1, 23, 55),
        utc(2026, 5, 2, 0, 0),
        utc(2026, 5, 2, 0, 5),
    ]
    assert Cron("@daily").next_after(utc(2026, 5, 1, 12)) == utc(2026, 5, 2)


def test_cron_follows_the_zone_wall_clock_in_winter_and_summer() -> None:
    cron = Cron("0 9 * * *", tz="Europe/Berlin")
    winter = cron.next_after(utc(2026, 1, 10))
    summer = cron.next_after(utc(2026, 7, 10))
    assert winter == utc(2026, 1, 10, 8)  # 09:00 CET = 08:00 UTC
    assert summer == utc(2026, 7, 10, 7)  # 09:00 CEST = 07:00 UTC
    assert cron.describe() == "cron 0 9 * * * (Europe/Berlin)"


def test_cron_fires_a_wall_time_missing_in_spring_right_after_the_gap() -> None:
    # Last Sunday of March 2026 (29th): 02:00 CET jumps to 03:00 CEST; 02:30 never happens,
    # so the daily 02:30 runs once, at the first instant after the jump.
    cron = Cron("30 2 * * *", tz="Europe/Berlin")
    runs = list(cron.occurrences(berlin(2026, 3, 27, 12), berlin(2026, 3, 31, 12)))
    assert [local(t) for t in runs] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
        "2026-03-31T02:30:00+02:00",
    ]
    half_hourly = Cron("*/30 * * * *", tz="Europe/Berlin")
    runs = list(half_hourly.occurrences(berlin(2026, 3, 29, 1, 0), berlin(2026, 3, 29, 4, 0)))
    assert [local(t) for t in runs] == [
        "2026-03-29T01:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-29T03:30:00+02:00",
        "2026-03-29T04:00:00+02:00",
    ]
    # Consecutive occurrences are 30 real minutes apart across the jump.
    assert runs[1] - runs[0] == 1800


def test_cron_fires_a_fixed_repeated_wall_time_once_and_wildcard_hours_in_both_passes() -> None:
    # Last Sunday of October 2026 (25th): 03:00 CEST falls back to 02:00 CET; 02:30 happens twice.
    cron = Cron("30 2 * * *", tz="Europe/Berlin")
    runs = list(cron.occurrences(berlin(2026, 10, 23, 12), berlin(2026, 10, 27, 12)))
    assert [local(t) for t in runs] == [
        "2026-10-24T02:30:00+02:00",
        "2026-10-25T02:30:00+02:00",  # the first 02:30 only
        "2026-10-26T02:30:00+01:00",
        "2026-10-27T02:30:00+01:00",
    ]
    half_hourly = Cron("*/30 * * * *", tz="Europe/Berlin")
    runs = list(half_hourly.occurrences(berlin(2026, 10, 25, 1, 0), berlin(2026, 10, 25, 3, 30)))
    assert [local(t) for t in runs] == [
        "2026-10-25T01:30:00+02:00",
        "2026-10-25T02:00:00+02:00",
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:00:00+01:00",  # the hour again, in real time
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
        "2026-10-25T03:30:00+01:00",
    ]
    assert {b - a for a, b in itertools.pairwise(runs)} == {1800.0}


def test_cron_next_after_from_inside_the_repeated_hour_moves_forward() -> None:
    half_hourly = Cron("*/30 * * * *", tz="Europe/Berlin")
    second_pass = berlin(2026, 10, 25, 2, 15, fold=1)  # 02:15 CET, after the first 02:30
    assert local(half_hourly.next_after(second_pass)) == "2026-10-25T02:30:00+01:00"
    first_pass = berlin(2026, 10, 25, 2, 15, fold=0)
    assert local(half_hourly.next_after(first_pass)) == "2026-10-25T02:30:00+02:00"
    late_first_pass = berlin(2026, 10, 25, 2, 45, fold=0)  # 02:45 CEST: next is 02:00 CET
    assert local(half_hourly.next_after(late_first_pass)) == "2026-10-25T02:00:00+01:00"
    # The newest occurrence at or before a second-pass time is that pass's 02:00.
    assert local(half_hourly.latest(0, second_pass, 1)[0]) == "2026-10-25T02:00:00+01:00"
    daily = Cron("30 2 * * *", tz="Europe/Berlin")  # a fixed time: the first pass only
    assert local(daily.next_after(second_pass)) == "2026-10-26T02:30:00+01:00"


def test_cron_latest_counts_back_across_days() -> None:
    daily = Cron("0 3 * * *", tz="Europe/Berlin")
    found = daily.latest(berlin(2026, 3, 1), berlin(2026, 4, 1), 3)
    assert [local(t) for t in found] == [
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T03:00:00+02:00",
        "2026-03-31T03:00:00+02:00",
    ]
    assert daily.latest(berlin(2026, 3, 31, 4), berlin(2026, 4, 1, 2), 3) == []


@pytest.mark.parametrize(
    ("expression", "tz"),
    [("not a cron", None), ("61 * * * *", None), ("0 0 30 2 *", None), ("* * * * *", "Mars/Base")],
)
def test_cron_refuses_bad_expressions_and_zones(expression: str, tz: str | None) -> None:
    with pytest.raises(ConfigurationError):
        Cron(expression, tz=tz)


# ------------------------------------------------------- registration
@pytest.fixture
def queue() -> Queue:
    # No broker is touched in these tests; the URL only has to be valid.
    return Queue(redis_url="redis://127.0.0.1:1/0", namespace="unit-periodic")


def test_periodic_decorator_registers_a_task_and_a_periodic_entry(queue: Queue) -> None:
    @queue.periodic(Every(300), args=(1,), kwargs={"b": 2}, missed="run_all", name="sums.add")
    async def add(a: int, b: int) -> int:
        return a + b

    assert queue.get_task("sums.add") is add
    entry = queue.periodic_tasks["sums.add"]
    assert entry.task is add
    assert entry.schedule == Every(300)
    assert (entry.args, dict(entry.kwargs), entry.missed) == ((1,), {"b": 2}, "run_all")
    assert entry.target_queue() == "default"
    assert entry.task_id(1_800_000_300.0) == "periodic:sums.add:1800000300"


def test_periodic_accepts_cron_strings_with_tz_and_seconds(queue: Queue) -> None:
    @queue.periodic("0 9 * * 1-5", tz="Europe/Berlin", queue="reports")
    def report() -> None: ...

    @queue.periodic(dt.timedelta(minutes=1))
    def minutely() -> None: ...

    entries = {e.task.fn: e for e in queue.periodic_tasks.values()}
    assert entries[report.fn].schedule == Cron("0 9 * * 1-5", tz="Europe/Berlin")
    assert entries[report.fn].target_queue() == "reports"
    assert report.queue == "reports"
    assert entries[minutely.fn].schedule == Every(60)


def test_add_periodic_runs_one_task_on_several_schedules(queue: Queue) -> None:
    @queue.task(name="ping")
    async def ping(target: str) -> None: ...

    queue.add_periodic(ping, Every(60), args=("a",), name="ping-a")
    queue.add_periodic(ping, Cron("0 * * * *"), args=("b",), name="ping-b", queue="other")
    assert sorted(queue.periodic_tasks) == ["ping-a", "ping-b"]
    assert queue.periodic_tasks["ping-b"].target_queue() == "other"

    @queue.task(name="pong")
    async def pong() -> None: ...

    with pytest.raises(ConfigurationError, match="already registered"):
        queue.add_periodic(pong, Every(60), name="ping-a")


@pytest.mark.parametrize(
    "options",
    [
        {"schedule": Every(60), "tz": "Europe/Berlin"},  # tz only applies to cron strings
        {"schedule": Every(60), "missed": "sometimes"},
        {"schedule": Every(60), "priority": "urgent"},
        {"schedule": "every minute"},
        {"schedule": [60]},
    ],
)
def test_periodic_refuses_bad_options(queue: Queue, options: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        queue.periodic(**options)(lambda: None)  # type: ignore[arg-type]


def test_periodic_refuses_non_plain_arguments_at_registration(queue: Queue) -> None:
    with pytest.raises(SerializationError):
        queue.periodic(Every(60), args=(object(),), name="bad")(lambda x: None)


def test_priority_is_kept_and_applied_only_when_supported(queue: Queue) -> None:
    @queue.periodic(Every(60), priority="high", name="urgent")
    async def urgent() -> None: ...

    entry = queue.periodic_tasks["urgent"]
    assert entry.priority == "high"
    expected = "default:high"
    assert entry.target_queue() == expected


def test_the_message_is_a_normal_envelope_with_the_occurrence_id(queue: Queue) -> None:
    @queue.periodic(Every(60), args=(1, "x"), kwargs={"k": [1, 2]}, name="job")
    async def job(a: int, b: str, k: list[int]) -> None: ...

    entry = queue.periodic_tasks["job"]
    env = decode_envelope(build_message(queue, entry, 1_800_000_060.0, 1_800_000_060.2))
    assert env.id == "periodic:job:1800000060"
    assert (env.task, env.queue, env.args, env.kwargs) == (
        "job",
        "default",
        [1, "x"],
        {"k": [1, 2]},
    )
    assert env.attempt == 1


# ---------------------------------------------------- missed-run policies
def _entry(queue: Queue, missed: str, schedule: Every | Cron | None = None) -> PeriodicTask:
    fn: Callable[[], None] = lambda: None  # noqa: E731
    task = queue.task(name=f"t-{missed}")(fn)
    return queue.add_periodic(task, schedule or Every(60), missed=missed)  # type: ignore[arg-type]


T0 = utc(2026, 5, 1, 12, 0)


def test_no_history_dispatches_nothing_missed_and_starts_from_now(queue: Queue) -> None:
    scheduler = Scheduler(queue)
    entry = _entry(queue, "run_all")
    assert scheduler.due(entry, None, T0 + 30) == []  # 12:00 happened before we first looked
    assert scheduler.due(entry, None, T0 + 59) == []
    assert scheduler.due(entry, None, T0 + 61) == [T0 + 60]  # the first one after first sight


def test_run_once_dispatches_only_the_newest_missed_occurrence(queue: Queue) -> None:
    entry = _entry(queue, "run_once")
    assert Scheduler(queue).due(entry, T0, T0 + 60) == [T0 + 60]
    assert Scheduler(queue).due(entry, T0, T0 + 10 * 60 + 5) == [T0 + 600]


def test_run_all_dispatches_each_missed_occurrence_up_to_the_cap(queue: Queue) -> None:
    entry = _entry(queue, "run_all")
    assert Scheduler(queue).due(entry, T0, T0 + 10 * 60 + 5) == [T0 + 60 * k for k in range(1, 11)]
    capped = Scheduler(queue, max_catch_up=100).due(entry, T0, T0 + 86400)
    assert capped == [T0 + 86400 - 60 * k for k in range(99, -1, -1)]  # the newest 100


def test_skip_dispatches_only_an_occurrence_due_now(queue: Queue) -> None:
    entry = _entry(queue, "skip")
    scheduler = Scheduler(queue, poll_interval=1.0, grace=1.0)
    assert scheduler.due(entry, T0, T0 + 60.5) == [T0 + 60]  # on time
    assert scheduler.due(entry, T0, T0 + 62.0) == [T0 + 60]  # within poll_interval + grace
    assert scheduler.due(entry, T0, T0 + 62.5) == []  # late: dropped
    assert scheduler.due(entry, T0, T0 + 3600 + 0.3) == [T0 + 3600]  # after downtime: only now


def test_a_clock_stepped_back_restarts_from_the_moment_it_is_seen(queue: Queue) -> None:
    """Issue 7 §5: ``Every`` fell silent for the length of a backward step (1 h step = 1 h).

    A stored last occurrence later than the broker's now means its clock went back: the
    entry restarts from the moment that is seen and keeps its real-time spacing.
    """
    for missed in ("run_once", "run_all", "skip"):
        entry = _entry(queue, missed)
        scheduler = Scheduler(queue)
        last = T0 + 3600  # dispatched, then the clock went back an hour
        assert scheduler.due(entry, last, T0 + 0.5) == []  # nothing before the step is seen
        assert scheduler.due(entry, last, T0 + 59) == []
        assert scheduler.due(entry, last, T0 + 60.5) == [T0 + 60], missed  # next one fires
        # Once that is claimed the stored value is T0 + 60 and all is as usual.
        assert scheduler.due(entry, T0 + 60, T0 + 120.5) == [T0 + 120]
        # A scheduler that first sees the step later restarts from then.
        late = Scheduler(queue)
        assert late.due(entry, last, T0 + 90) == []
        assert late.due(entry, last, T0 + 120.5) == [T0 + 120]
        # A small step back (a few seconds) is waited out: T0 + 60 is not dispatched twice.
        small = Scheduler(queue)
        assert small.due(entry, T0 + 60, T0 + 57) == []
        assert small.due(entry, T0 + 60, T0 + 60.2) == []
        assert small.due(entry, T0 + 60, T0 + 120.2) == [T0 + 120]


def test_every_10_keeps_firing_across_a_one_hour_step_back(queue: Queue) -> None:
    entry = queue.add_periodic(queue.task(name="t-ten")(lambda: None), Every(10))
    scheduler = Scheduler(queue)
    last, fired = T0, []
    for tick in range(1, 200):  # ticks every 0.5 s of real time
        real = T0 + tick * 0.5
        now = real if real < T0 + 30 else real - 3600  # the clock steps back 1 h at T0+30
        for occurrence in scheduler.due(entry, last, now):
            last = occurrence
            fired.append(real)
    gaps = [b - a for a, b in itertools.pairwise(fired)]
    assert len(fired) == 8  # T0+10, +20, (the step at T0+30), +40, ... +90 of real time
    assert max(gaps) <= 20.0, gaps  # no silence: the first run after the step within 10 s


def test_a_forward_step_fires_at_most_one_catch_up(queue: Queue) -> None:
    entries = {missed: _entry(queue, missed) for missed in ("run_once", "run_all", "skip")}
    for entry in entries.values():
        assert Scheduler(queue).due(entry, T0, T0 + 3600.5, jumped=True) == [T0 + 3600]
    # Not a step (downtime): run_all catches up on everything.
    assert len(Scheduler(queue).due(entries["run_all"], T0, T0 + 3600.5)) == 60


def test_skip_logs_a_dropped_occurrence_once(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 7 §5: "skipping missed occurrence" was logged on every tick until the next slot."""
    entry = _entry(queue, "skip")
    scheduler = Scheduler(queue, poll_interval=1.0, grace=1.0)
    with caplog.at_level(logging.INFO, logger="blitzq.scheduler"):
        for tick in range(100):  # the newest missed occurrence is T0 + 60 all along
            assert scheduler.due(entry, T0, T0 + 65 + tick * 0.5) == []
        assert scheduler.due(entry, T0, T0 + 121.0) == [T0 + 120]  # the next slot, on time
        assert scheduler.due(entry, T0 + 120, T0 + 185.0) == []  # the one after, missed
    skipped = [r for r in caplog.records if "skipping missed occurrence" in r.getMessage()]
    assert len(skipped) == 2, [r.getMessage() for r in skipped]


def test_cron_policies_across_the_spring_gap(queue: Queue) -> None:
    entry = _entry(queue, "run_all", Cron("30 2 * * *", tz="Europe/Berlin"))
    due = Scheduler(queue).due(entry, berlin(2026, 3, 27, 12), berlin(2026, 3, 30, 12))
    assert [local(t) for t in due] == [
        "2026-03-28T02:30:00+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-30T02:30:00+02:00",
    ]


def test_scheduler_refuses_bad_settings(queue: Queue) -> None:
    with pytest.raises(ConfigurationError):
        Scheduler(queue, poll_interval=0)
    with pytest.raises(ConfigurationError):
        Scheduler(queue, max_catch_up=0)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 0 * * * 5", "6 fields, a cron expression has exactly 5"),
        ("* * * * * */5", "6 fields"),
        ("0 0 1 1 * 0 2030", "7 fields"),
        ("0 0 * *", "4 fields"),
        ("", "0 fields"),
        ("@reboot", "the shorthands are @annually, @daily"),
        ("@every 5m", "2 fields"),
    ],
)
def test_cron_takes_exactly_five_fields_or_a_shorthand(expression: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        Cron(expression)


@pytest.mark.parametrize("alias", [*sorted(CRON_ALIASES), "@HOURLY", " @daily "])
def test_cron_shorthands_are_accepted(alias: str) -> None:
    assert Cron(alias).next_after(utc(2026, 5, 1, 12, 30)) > utc(2026, 5, 1, 12, 30)


def test_every_cron_entrance_refuses_a_sixth_field(queue: Queue) -> None:
    @queue.task(name="six")
    async def six() -> None: ...

    with pytest.raises(ConfigurationError, match="6 fields"):
        queue.add_periodic(six, "0 0 * * * 5", name="six")
    with pytest.raises(ConfigurationError, match="6 fields"):
        queue.add_periodic(six, Cron("0 0 * * * 5"), name="six")

    with pytest.raises(ConfigurationError, match="6 fields"):

        @queue.periodic("0 0 * * * 5", name="seconds")
        async def seconds() -> None: ...

    with pytest.raises(ConfigurationError, match="6 fields"):
        RuntimeSchedule("rt", "six", cron="0 0 * * * 5").check()
    assert queue.periodic_tasks == {}
