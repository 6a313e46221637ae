"""The budget of a crashing task (worker/solo.py) and the transports' backstop."""

from __future__ import annotations

import pytest

from blitzq.broker.transport import backstop_note, delivery_backstop
from blitzq.worker.solo import solo_plan


@pytest.mark.parametrize(
    ("max_deliveries", "plan"),
    [(1, (2, 0)), (2, (2, 1)), (3, (3, 1)), (5, (3, 3)), (21, (3, 19))],
)
def test_runs_beside_others_and_alone_add_up_to_max_deliveries(
    max_deliveries: int, plan: tuple[int, int]
) -> None:
    solo_from, budget = solo_plan(max_deliveries)
    assert (solo_from, budget) == plan
    if budget:  # the runs before the first solo one, then the solo ones
        assert solo_from - 1 + budget == max_deliveries


@pytest.mark.parametrize(("max_deliveries", "backstop"), [(1, 1), (2, 20), (5, 20), (6, 24)])
def test_the_backstop_is_well_above_max_deliveries(max_deliveries: int, backstop: int) -> None:
    assert delivery_backstop(max_deliveries) == backstop


@pytest.mark.parametrize(
    ("backstop", "max_deliveries", "text"),
    [
        (1, 1, "max_deliveries=1"),
        (1, None, "max_deliveries=1"),
        (20, 5, "the backstop of 20 deliveries: 4 x max_deliveries=5, at least 20"),
        (40, 10, "the backstop of 40 deliveries: 4 x max_deliveries=10, at least 20"),
        (20, None, "the backstop of 20 deliveries: 4 x max_deliveries, at least 20"),
    ],
)
def test_the_backstop_is_named_as_such(
    backstop: int, max_deliveries: int | None, text: str
) -> None:
    """Dead letters and log lines name the number a transport stopped at as the backstop,
    not as ``max_deliveries`` (which bounds a task's runs alone, :mod:`blitzq.worker.solo`)."""
    assert backstop_note(backstop, max_deliveries) == text
