"""The autoscaler's decisions (:mod:`blitzq.worker.autoscale`): bounds, up on backlog and
latency, down on idle processes, cooldown, minimum age, the setpoint's range check.

Pure logic on a given clock; the supervisor that applies the decisions is tested end to end
in ``tests/reliability/test_process_control.py``.
"""

from __future__ import annotations

import pytest

from blitzq.exceptions import ConfigurationError
from blitzq.worker.autoscale import (
    HARD_CAP,
    Autoscaler,
    AutoscaleSettings,
    Sample,
    check_range,
    parse_range,
)

SETTINGS = AutoscaleSettings(1, 4, cooldown=5.0, idle=10.0, min_age=20.0, backlog=10, latency=3.0)


def test_range_checks_and_parsing() -> None:
    assert check_range(1, 1) is None
    assert check_range(2, HARD_CAP) is None
    assert "at least 1" in str(check_range(0, 3))
    assert "above the maximum" in str(check_range(3, 2))
    assert "hard cap" in str(check_range(1, HARD_CAP + 1))
    assert parse_range("2,8") == (2, 8)
    assert parse_range(" 3 , 4 ") == (3, 4)
    for bad in ("", "3", "a,b", "1,2,3", "0,2", "5,2"):
        with pytest.raises(ConfigurationError):
            parse_range(bad)


def test_bounds_come_first_whatever_the_cooldown() -> None:
    scaler = Autoscaler(SETTINGS)
    assert scaler.decide(0.0, {}, Sample()).add == 1
    # A setpoint raises the minimum: the missing processes are added at once.
    assert scaler.decide(0.1, {1: 0.0}, Sample(setpoint=(3, 4))).add == 2
    # A lower maximum removes the youngest processes at once.
    started = {1: 0.0, 2: 1.0, 3: 2.0}
    decision = scaler.decide(0.2, started, Sample(setpoint=(1, 1)))
    assert decision.remove == (3, 2)
    # An invalid setpoint (written by hand) is ignored.
    assert scaler.bounds(Sample(setpoint=(5, 2))) == (1, 4)


def test_backlog_and_latency_add_processes_with_a_cooldown() -> None:
    scaler = Autoscaler(SETTINGS)
    one = {1: 0.0}
    decision = scaler.decide(100.0, one, Sample(waiting=35))
    assert decision.add == 3  # ceil(35 / 10) = 4 processes wanted
    assert "35 waiting" in decision.reason
    assert scaler.decide(102.0, one, Sample(waiting=35)).add == 0  # cooling down
    assert scaler.decide(106.0, one, Sample(waiting=10)).add == 0  # 10 per process: enough
    assert scaler.decide(106.0, one, Sample(waiting=1, oldest_age=4.0)).add == 1  # too late
    two = {1: 0.0, 2: 106.0}
    assert scaler.decide(120.0, two, Sample(waiting=500)).add == 2  # up to the maximum only


def test_an_idle_old_process_is_removed_never_below_the_minimum() -> None:
    scaler = Autoscaler(SETTINGS)
    started = {1: 0.0, 2: 50.0, 3: 55.0}
    idle = Sample(busy={1: False, 2: False, 3: True})
    assert scaler.decide(60.0, started, idle).remove == ()  # idle since 60 only
    assert scaler.decide(69.0, started, idle).remove == ()
    # Waiting messages end the idle period.
    assert scaler.decide(70.0, started, Sample(waiting=1, busy=idle.busy)).remove == ()
    assert scaler.decide(71.0, started, idle).remove == ()
    decision = scaler.decide(81.0, started, idle)
    assert decision.remove == (2,)  # the youngest idle one; 3 is busy
    assert scaler.decide(83.0, {1: 0.0, 3: 55.0}, idle).remove == ()  # cooling down
    # Too young to be removed.
    young = Autoscaler(SETTINGS)
    assert young.decide(0.0, {1: 0.0, 2: 0.0}, Sample(busy={1: False, 2: False})).remove == ()
    assert young.decide(15.0, {1: 0.0, 2: 0.0}, Sample(busy={1: False, 2: False})).remove == ()
    # Idle past the window since 10 s: removed once 20 s old (the minimum age), not before.
    assert young.decide(19.9, {1: 0.0, 2: 0.0}, Sample(busy={1: False, 2: False})).remove == ()
    assert young.decide(20.0, {1: 0.0, 2: 0.0}, Sample(busy={1: False, 2: False})).remove != ()
    # At the minimum nothing is removed.
    alone = Autoscaler(SETTINGS)
    alone.decide(0.0, {1: 0.0}, Sample(busy={1: False}))
    assert alone.decide(100.0, {1: 0.0}, Sample(busy={1: False})).remove == ()
