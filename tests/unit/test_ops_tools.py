"""The pure parts of the operator tools: unknown-task backoff, dead-letter filters and error
types, durations, run-time schedule encoding and validation, and the preflight verdicts."""

from __future__ import annotations

import click
import pytest

from blitzq.cli.dead_letters import Duration
from blitzq.client.dead_letter_query import DeadLetterFilter, summarize
from blitzq.dead_letters import DeadLetter
from blitzq.exceptions import ConfigurationError, SerializationError
from blitzq.preflight import Finding, _persistence, _server, exit_code
from blitzq.runtime_schedules import RuntimeSchedule
from blitzq.worker.unknown import MAX_DELAY, MIN_DELAY, defer_delay

NOW = 1_800_000_000.0


def letter(
    task: str = "t", queue: str = "q", reason: str = "failed", error: str = "", age: float = 0
) -> DeadLetter:
    return DeadLetter("id", task, queue, reason, error, NOW - age, None, None, b"")


@pytest.mark.timeout(10)
def test_the_unknown_task_backoff_grows_with_age_and_ends_with_the_grace() -> None:
    for _ in range(200):
        assert MIN_DELAY * 0.8 <= defer_delay(0.0, 300.0) <= MIN_DELAY * 1.2
        assert 15 * 0.8 <= defer_delay(30.0, 300.0) <= 15 * 1.2
        assert defer_delay(1000.0, 5000.0) <= MAX_DELAY * 1.2
        assert defer_delay(299.0, 300.0) <= 1.0  # the last check falls on the grace's end
        assert defer_delay(300.0, 300.0) == 0.05


@pytest.mark.timeout(10)
def test_error_type_is_read_from_a_failed_tasks_error_only() -> None:
    assert letter(error="ValueError: bad 1").error_type == "ValueError"
    assert letter(error="myapp.errors.Gone: x: y").error_type == "myapp.errors.Gone"
    assert letter(error="no colon here").error_type == ""
    assert letter(reason="unknown task", error="KeyError: x").error_type == ""
    assert letter(error="ValueError: x").to_dict()["error_type"] == "ValueError"


@pytest.mark.timeout(10)
def test_filters_match_every_criterion_given() -> None:
    assert DeadLetterFilter().empty
    assert DeadLetterFilter(queue="emails").matches(letter(queue="emails:high"), NOW)
    assert not DeadLetterFilter(queue="emails:low").matches(letter(queue="emails:high"), NOW)
    gone = letter(error="myapp.errors.Gone: x")
    assert DeadLetterFilter(error_type="Gone").matches(gone, NOW)
    assert DeadLetterFilter(error_type="myapp.errors.Gone").matches(gone, NOW)
    assert not DeadLetterFilter(error_type="errors").matches(gone, NOW)
    old = letter(age=7200)
    assert DeadLetterFilter(older_than=3600).matches(old, NOW)
    assert not DeadLetterFilter(newer_than=3600).matches(old, NOW)
    assert not DeadLetterFilter(task="t", reason="unknown task").matches(letter(), NOW)
    for bad in ({"task": ""}, {"queue": 3}, {"older_than": -1}, {"newer_than": float("nan")}):
        with pytest.raises(ConfigurationError):
            DeadLetterFilter(**bad)  # type: ignore[arg-type]


@pytest.mark.timeout(10)
def test_summary_groups_largest_first() -> None:
    rows = [letter("a", error="E: x"), letter("b"), letter("b", reason="unknown task")]
    summary = summarize(rows)
    assert summary["total"] == 3
    assert list(summary["by_task"].items()) == [("b", 2), ("a", 1)]
    assert summary["by_error_type"] == {"": 2, "E": 1}


@pytest.mark.timeout(10)
def test_durations_take_units() -> None:
    d = Duration()
    assert [d.convert(v, None, None) for v in ("90", "90s", "15m", "2h", "1.5d", "1w")] == [
        90.0, 90.0, 900.0, 7200.0, 129600.0, 604800.0,
    ]  # fmt: skip
    for bad in ("soon", "-5m", "1y", "inf"):
        with pytest.raises(click.BadParameter):
            d.convert(bad, None, None)


@pytest.mark.timeout(10)
def test_runtime_schedules_round_trip_and_are_checked() -> None:
    entry = RuntimeSchedule(
        "nightly", "app.report", cron="0 2 * * *", tz="Europe/Berlin", args=[1],
        kwargs={"a": "b"}, queue="reports", missed="skip", added_at=NOW,
    )  # fmt: skip
    entry.check()
    assert RuntimeSchedule.decode("nightly", entry.encode()) == entry
    assert entry.schedule().describe() == "cron 0 2 * * * (Europe/Berlin)"
    for bad in (
        RuntimeSchedule("x", "t"),  # neither cron nor every
        RuntimeSchedule("x", "t", cron="* * * * *", every=5.0),
        RuntimeSchedule("x", "t", every=5.0, tz="UTC"),
        RuntimeSchedule("x", "t", cron="not cron"),
        RuntimeSchedule("x", "t", cron="* * * * *", tz="Mars/Base"),
        RuntimeSchedule("x", "t", every=-1.0),
        RuntimeSchedule("x", "t", every=5.0, missed="sometimes"),
        RuntimeSchedule("x", "", every=5.0),
    ):
        with pytest.raises(ConfigurationError):
            bad.check()
    with pytest.raises(SerializationError):
        RuntimeSchedule.decode("x", b"\x01")


@pytest.mark.timeout(10)
def test_preflight_verdicts() -> None:
    assert _server({"server": "redis", "version": "6.0.9"})[0].status == "fail"
    assert _server({"server": "redis", "version": "7.0.15"})[0].status == "ok"
    assert _server({"server": "valkey", "version": "8.0.1"})[0].status == "ok"
    assert [f.name for f in _server({"version": "7.2.0", "role": "slave"})] == ["server", "role"]
    assert _persistence({"aof_enabled": "1", "save": ""}).status == "ok"
    assert _persistence({"aof_enabled": "0", "save": "3600 1"}).status == "ok"
    assert _persistence({"aof_enabled": "0", "save": ""}).status == "warn"
    assert _persistence({"aof_enabled": "0"}).status == "warn"
    ok, warn = Finding("a", "ok", ""), Finding("b", "warn", "")
    assert exit_code([ok, warn]) == 0
    assert exit_code([ok, Finding("eviction", "fail", "")]) == 78
    assert exit_code([Finding("connectivity", "fail", "")]) == 1
