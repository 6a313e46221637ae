"""The rate cap of ``retry_dead_letters`` / ``blitzq dead-letter replay --all --rate``:
:class:`~blitzq.client.dead_letter_query.Pacer` on a clock the test drives."""

from __future__ import annotations

import pytest

from blitzq.client.dead_letter_query import Pacer

pytestmark = pytest.mark.timeout(10)


class Clock:
    """Monotonic seconds that move only when slept on or stalled."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(round(seconds, 9))
        self.now += seconds


async def test_calls_start_one_interval_apart() -> None:
    clock = Clock()
    pace = Pacer(4.0, clock, clock.sleep)
    starts = []
    for _ in range(4):
        await pace.wait()
        starts.append(clock.now)
        clock.now += 0.05  # the replay itself
    assert starts == [100.0, 100.25, 100.5, 100.75]
    assert clock.slept == [0.2, 0.2, 0.2]


async def test_no_burst_after_a_slow_call() -> None:
    clock = Clock()
    pace = Pacer(10.0, clock, clock.sleep)
    await pace.wait()
    clock.now += 3.0  # a stall of 30 intervals
    starts = []
    for _ in range(3):
        await pace.wait()
        starts.append(clock.now)
    assert starts == pytest.approx([103.0, 103.1, 103.2])  # no catching up: still 10/s
