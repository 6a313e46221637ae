"""Every form of a past ``eta`` runs at once, and the number and datetime forms agree
(user test: ``eta=0`` looked scheduled at epoch 0 while a past datetime ran at once).

A past eta -- ``0``, a Unix time before now, an aware datetime before now, ``1970-01-01``
itself -- goes through the schedule like any eta (due by the server's clock) and the next
promotion moves it to its queue: each reads ``scheduled`` with its ``due_at`` until then, and
each runs without any wait beyond a promotion. Before Unix time 0 both forms are refused with
the same words; a timedelta is refused (a time from now is ``delay=``). No timing is asserted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from blitzq import ConfigurationError, Queue, TaskState

from .proc_tasks import make_worker, running

pytestmark = pytest.mark.timeout(60)

PAST_FORMS: dict[str, Callable[[], Any]] = {
    "number 0": lambda: 0,
    "float 0.0": lambda: 0.0,
    "number past": lambda: time.time() - 3600,
    "datetime 1970": lambda: datetime(1970, 1, 1, tzinfo=UTC),
    "datetime past": lambda: datetime.now(UTC) - timedelta(hours=1),
    "datetime past, another zone": lambda: datetime(
        2001, 1, 1, tzinfo=timezone(timedelta(hours=5))
    ),
}


def _unix(value: Any) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


async def test_every_form_of_a_past_eta_runs_at_once(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue(name="etaforms", track_state=True)

    @queue.task(name="eta.echo")
    async def echo(x: str) -> str:
        return x

    etas = {name: make() for name, make in PAST_FORMS.items()}
    handles = {name: await echo.options(eta=eta).enqueue(name) for name, eta in etas.items()}
    for name, handle in handles.items():  # alike before a worker promotes them
        record = await queue.inspect(handle.id)
        assert record is not None
        assert record.state == TaskState.SCHEDULED, name
        assert record.due_at == pytest.approx(_unix(etas[name]), abs=1e-3), name
    async with running(make_worker(queue)):
        for name, handle in handles.items():
            assert await handle.result(timeout=30) == name
    await queue.close()


@pytest.mark.parametrize(
    "eta",
    [-1, -0.5, -1e9, datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)],
)
def test_before_1970_both_forms_are_refused_alike(
    make_queue: Callable[..., Queue], eta: Any
) -> None:
    task = make_queue().task(name="eta.refused")(lambda: None)
    with pytest.raises(ConfigurationError) as caught:
        task.options(eta=eta)
    assert str(caught.value) == (
        "eta must not be before 1970-01-01 00:00 UTC (Unix time 0; a later time in the past "
        f"runs at once), got {eta!r}"
    )


def test_a_timedelta_eta_points_to_delay(make_queue: Callable[..., Queue]) -> None:
    task = make_queue().task(name="eta.delta")(lambda: None)
    with pytest.raises(ConfigurationError, match="a time from now is delay="):
        task.options(eta=timedelta(seconds=-5))
    assert task.options(delay=timedelta(seconds=5)).call_options.delay == 5.0
