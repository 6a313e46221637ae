"""The stall detection of watchdogs (``stall_clock.py``, ``worker/peers.py``,
``worker/stalls.py``) and the supervisor's answer to a pause of its own: no worker judged.

Clocks are driven by hand: a SIGSTOP advances the monotonic and the boot clock alike, a
suspend only the boot clock; the lateness of a turn is the larger of the two.
"""

from __future__ import annotations

import math
import sys
import time

import pytest

from blitzq.stall_clock import HEARTBEAT_SLACK, StallClock, heartbeat_slack, host_clocks
from blitzq.worker.peers import PeerGrace
from blitzq.worker.stalls import StallWatch
from blitzq.worker.supervisor import Supervisor


class Clocks:
    """Two hand-driven clocks (seconds), as monotonic and boot time."""

    def __init__(self) -> None:
        self.mono = self.boot = 100.0

    def pass_(self, seconds: float, *, suspended: bool = False) -> None:
        """``seconds`` pass; while suspended, the monotonic clock stands still."""
        self.boot += seconds
        if not suspended:
            self.mono += seconds


def test_stall_clock_measures_the_lateness_of_a_turn_on_either_clock() -> None:
    c = Clocks()
    clock = StallClock(1.0, clocks=(lambda: c.mono, lambda: c.boot))
    assert clock.stalled() == 0.0  # nothing expected yet
    clock.expect(0.5)
    c.pass_(1.4)  # late by 0.9 s: within the slack
    assert clock.stalled() == 0.0
    clock.expect(0.5)
    c.pass_(45.5)  # SIGSTOP: both clocks ran
    assert clock.stalled() == pytest.approx(45.0)
    assert clock.stalled() == 0.0  # answered once per expect
    clock.expect(1.0)
    c.pass_(600.0, suspended=True)  # suspend: only the boot clock ran
    assert clock.stalled() == pytest.approx(599.0)
    assert clock.stalls == 2
    with pytest.raises(ValueError, match="slack"):
        StallClock(0.0)
    with pytest.raises(ValueError, match="clock"):
        StallClock(1.0, clocks=())


def test_peer_grace_waits_one_interval_after_a_pause() -> None:
    c = Clocks()
    grace = PeerGrace(3.0, 1.0, clock=StallClock(0.75, clocks=(lambda: c.mono,)))
    grace.sleeping(1.0)
    c.pass_(1.2)
    grace.woke()
    assert grace.may_judge()  # a turn a little late is no pause
    grace.sleeping(1.0)
    c.pass_(45.0)
    grace.woke()
    assert not grace.may_judge()  # the round right after the pause
    grace.paused_at -= 1.0  # one interval later
    assert grace.may_judge()


def test_peer_grace_follows_the_stall_watch() -> None:
    """A pause in the middle of a round: the maintenance sleep was on time, but the stall
    watch noticed a stall, or has not had its turn since the loop stalled."""
    watch = StallWatch(3.0)
    grace = PeerGrace(3.0, 1.0, watch)
    assert grace.may_judge()
    watch.ticked_at -= 10.0  # the watch's turn is overdue: the loop just stalled
    assert not grace.may_judge()
    watch.ticked_at = time.monotonic()
    assert watch.woke(0.75, 10.0)  # now it noticed
    assert not grace.may_judge()
    watch.noticed_at -= 1.0  # an interval later
    assert grace.may_judge()


def test_stall_watch_notes_when_it_noticed_a_stall() -> None:
    watch = StallWatch(2.0)
    assert watch.noticed_at == -math.inf
    assert not watch.woke(0.5, 1.0)
    assert watch.noticed_at == -math.inf
    before = time.monotonic()
    assert watch.woke(0.5, 10.0)
    assert watch.noticed_at >= before


def test_heartbeat_slack_stays_below_a_quarter_of_the_timeout() -> None:
    assert heartbeat_slack(None) == HEARTBEAT_SLACK
    assert heartbeat_slack(30.0) == HEARTBEAT_SLACK
    assert heartbeat_slack(8.0) == 2.0
    assert heartbeat_slack(0.5) == 0.25


def test_host_clocks_include_a_clock_that_runs_during_suspend() -> None:
    clocks = host_clocks()
    assert clocks[0] is time.monotonic
    assert len(clocks) == 2


def test_a_paused_supervisor_gives_every_worker_a_fresh_grace(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The deadlines the pause overran are not judged: beats are due a full timeout after
    the resume, and a stop's SIGKILL deadline moves by the pause."""
    sup = Supervisor([sys.executable, "-c", "pass"], workers=2, heartbeat_timeout=2.0)
    now = 1000.0
    for slot in sup.slots:
        slot.beat_at, slot.beating = now - 45.0, True  # silent for the whole pause
    sup._kill_at = now - 40.0
    sup._groups = {4242: now - 44.0}
    with caplog.at_level("WARNING", logger="blitzq.supervisor"):
        sup._resumed(45.0, now)
    assert [sup._beat_deadline(slot) for slot in sup.slots] == [now + 2.0] * 2
    assert sup._kill_at == now + 5.0
    assert sup._groups == {4242: now + 1.0}
    [warned] = [r.getMessage() for r in caplog.records]
    assert warned.startswith("supervisor was paused for 45.0 s")
    assert sup.stall.slack == heartbeat_slack(2.0)


def test_the_autoscaler_counts_no_idle_time_over_a_pause() -> None:
    from blitzq.worker.autoscale import Autoscaler, AutoscaleSettings, Sample

    scaler = Autoscaler(AutoscaleSettings(minimum=1, maximum=3, idle=30.0, min_age=0.0))
    started = {11: 0.0, 12: 1.0}
    quiet = Sample(waiting=0, busy={11: False, 12: False})
    assert scaler.decide(100.0, started, quiet).remove == ()  # idle from 100
    scaler.paused(45.0)  # the host paused from about 100 to 145
    assert scaler.decide(146.0, started, quiet).remove == ()  # idle 1 s, not 46 s
    assert scaler.decide(176.0, started, quiet).remove == (12,)
