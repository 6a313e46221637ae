"""A periodic entry's name fits its occurrences' task ids, and one entry whose message cannot
be made never stops a scheduler's tick from dispatching the others.

An occurrence's task id is ``periodic:<name>:<seconds>`` (at most ``MAX_TASK_ID``
characters), so a name is refused where it is given when that id could not fit: in code
(``queue.periodic``, ``queue.add_periodic``, a task's own name by default), and at run time
(``add_schedule``, ``blitzq schedule add``). Before, a 600-character name was accepted, and
each tick of every scheduler failed at it, dispatching none of the entries after it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from blitzq import Queue
from blitzq.cli import cli
from blitzq.exceptions import ConfigurationError
from blitzq.limits import MAX_NAME, MAX_PERIODIC_NAME, MAX_TASK_ID
from blitzq.runtime_schedules import RuntimeSchedule, add_schedule
from blitzq.scheduler import Scheduler
from blitzq.schedules import Every
from blitzq.serialization import decode_envelope

pytestmark = pytest.mark.timeout(60)


def longest_occurrence_id(name: str) -> str:
    return f"periodic:{name}:{'9' * 20}"


def test_the_longest_name_gives_ids_that_fit_and_one_more_character_is_refused() -> None:
    assert len(longest_occurrence_id("n" * MAX_PERIODIC_NAME)) == MAX_TASK_ID
    queue = Queue(redis_url="redis://127.0.0.1:1/0")

    @queue.task
    async def tick() -> None: ...

    queue.add_periodic(tick, Every(60), name="n" * MAX_PERIODIC_NAME)
    with pytest.raises(ConfigurationError, match=f"at most {MAX_PERIODIC_NAME} characters"):
        queue.add_periodic(tick, Every(60), name="n" * (MAX_PERIODIC_NAME + 1))
    with pytest.raises(ConfigurationError, match=f"at most {MAX_PERIODIC_NAME} characters"):
        queue.add_periodic(tick, Every(60), name="n" * 100_000)
    # The entry's name is its task's by default: a task name that long is refused there.
    long_task = queue.task(name="t" * (MAX_PERIODIC_NAME + 1))(tick.fn)
    with pytest.raises(ConfigurationError, match="periodic task name must be at most"):
        queue.add_periodic(long_task, Every(60))
    assert set(queue.periodic_tasks) == {"n" * MAX_PERIODIC_NAME}


def test_names_are_bounded_and_an_error_quotes_them_cut() -> None:
    """A queue name, namespace or task name past MAX_NAME characters is refused, and a
    refused name is quoted cut: a 100 KB argument gives a short error."""
    queue = Queue(redis_url="redis://127.0.0.1:1/0")
    queue.task(name="t" * MAX_NAME)(lambda: None)
    for make in (
        lambda: queue.task(name="t" * (MAX_NAME + 1))(lambda: None),
        lambda: Queue("q" * 100_000, redis_url="redis://127.0.0.1:1/0"),
        lambda: Queue(redis_url="redis://127.0.0.1:1/0", namespace="n" * 100_000),
    ):
        with pytest.raises(ConfigurationError, match=f"at most {MAX_NAME} characters") as refused:
            make()
        assert len(str(refused.value)) < 200
    with pytest.raises(ConfigurationError, match="without spaces") as spaced:
        Queue("q " * 50_000, redis_url="redis://127.0.0.1:1/0")
    assert len(str(spaced.value)) < 300


async def test_a_run_time_schedule_name_too_long_is_refused(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue()
    try:
        with pytest.raises(ConfigurationError, match="schedule name must be at most"):
            await add_schedule(queue, "n" * (MAX_PERIODIC_NAME + 1), "app.tick", every=1)
        added = await add_schedule(queue, "n" * MAX_PERIODIC_NAME, "app.tick", every=1)
        assert added.name == "n" * MAX_PERIODIC_NAME
    finally:
        await queue.close()


def test_schedule_add_refuses_a_name_too_long_with_exit_2(server_url: str, namespace: str) -> None:
    common = ["--redis-url", server_url, "--namespace", namespace]
    result = CliRunner().invoke(
        cli, [*common, "schedule", "add", "n" * 600, "--task", "app.tick", "--every", "1"]
    )
    assert result.exit_code == 2, result.output
    assert f"at most {MAX_PERIODIC_NAME} characters" in result.output
    assert len(result.output) < 400  # the name is quoted cut, not whole


async def test_an_entry_whose_message_cannot_be_made_does_not_stop_the_others(
    make_queue: Callable[..., Queue],
    namespace: str,
    raw_redis: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = make_queue(max_message_size=512)

    @queue.task(name="app.tick")
    async def tick(*args: Any) -> None: ...

    seconds, _ = await raw_redis.time()
    now = float(seconds)
    # Run-time entries are dispatched in name order: the bad ones come first. One stored by
    # a release without the name check (too long), one whose arguments make a message
    # larger than the Queue's max_message_size.
    too_long = "a" * 600
    operations = queue.broker.state.operations
    await operations.set_runtime_periodic(
        too_long, RuntimeSchedule(name=too_long, task="app.tick", every=60).encode()
    )
    await add_schedule(queue, "b-too-big", "app.tick", every=60, args=["x" * 2000])
    await add_schedule(queue, "c-fine", "app.tick", every=60)
    history = "{" + namespace + "}:periodic"
    for name in (too_long, "b-too-big", "c-fine"):  # each last ran two minutes ago: one due
        await raw_redis.hset(history, name, repr(now - 120))
    scheduler = Scheduler(queue)
    try:
        with caplog.at_level(logging.WARNING, logger="blitzq"):
            assert await scheduler.tick() == 1
            assert await scheduler.tick() == 0  # nothing new due; nothing logged again
        entries = await raw_redis.xrange("{" + namespace + "}:s:default")
        ids = [decode_envelope(fields[b"m"]).id for _, fields in entries]
        assert len(ids) == 1
        assert ids[0].startswith("periodic:c-fine:")
        warned = [r.getMessage() for r in caplog.records if "not dispatched" in r.getMessage()]
        assert len(warned) == 2, warned
        assert any("b-too-big" in w and "over the limit of 512" in w for w in warned), warned
        assert any(f"at most {MAX_PERIODIC_NAME} characters" in w for w in warned), warned
        assert not [r for r in caplog.records if "tick failed" in r.getMessage()]
    finally:
        await queue.close()
