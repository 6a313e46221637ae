"""A bulk replay of dead letters says what it did, not what it hoped (finding F7).

``blitzq dead-letter replay --all`` used to count as ``replayed`` a message that a worker
dead-letters again at once: one with a field the worker refuses (a bad ``timeout`` stays bad
through a replay, which resets only the times and the attempt count), or a task that fails at
once. Operators read the count as "these will run". Now such a message is refused and kept
(a replay cannot make it run), and a replayed task that is a dead letter again by the time the
batch ends is counted as ``dead-lettered again``, in the API, the human output and ``--json``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

from blitzq import Queue
from blitzq.broker.redis.keys import MESSAGE_FIELD, Keys
from blitzq.cli import cli
from blitzq.cli.dead_letters import replay_summary
from blitzq.client.dead_letter_query import ReplayOutcome, replay_counts
from blitzq.exceptions import SerializationError
from blitzq.testing import eager
from tests.integration.proc_tasks import eventually, make_worker, running
from tests.integration.test_message_fields import raw_message

pytestmark = pytest.mark.timeout(60)


async def _poisoned(queue: Queue, raw_redis: Any, namespace: str) -> None:
    """Plant a message of a known task whose ``timeout`` is -1 s; let a worker dead-letter
    it (``malformed message``)."""

    @queue.task(name="ro.echo")
    async def echo(x: Any) -> Any:
        return x

    payload = raw_message("poison-1", "ro.echo", queue.name, "timeout", -1.0)
    await raw_redis.xadd(Keys(namespace).stream(queue.name), {MESSAGE_FIELD: payload})
    async with running(make_worker(queue)):
        await eventually(queue.dead_letter_count, lambda n: n == 1, 30)
    [dead] = await queue.dead_letters()
    assert (dead.id, dead.reason) == ("poison-1", "malformed message")


async def test_a_message_a_worker_would_refuse_again_is_refused_and_kept(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str
) -> None:
    queue = make_queue(name="ro")
    await _poisoned(queue, raw_redis, namespace)
    [outcome] = await queue.retry_dead_letters()
    assert outcome.outcome == "refused"  # was "replayed", and dead-lettered again at once
    assert "timeout is -1.0" in outcome.detail
    assert "dead-letter it again" in outcome.detail
    with pytest.raises(SerializationError, match=r"timeout is -1\.0"):
        await queue.retry("poison-1")
    assert [d.id for d in await queue.dead_letters()] == ["poison-1"]  # kept
    stats = await queue.stats([queue.name])
    assert stats["queues"][queue.name]["waiting"] == 0  # nothing published


async def test_the_cli_summary_counts_refused_apart(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str, server_url: str
) -> None:
    queue = make_queue(name="ro")
    await _poisoned(queue, raw_redis, namespace)
    runner = CliRunner()
    base = ["--redis-url", server_url, "--namespace", namespace, "dead-letter", "replay", "--all"]

    def invoke(*args: str) -> Any:
        return runner.invoke(cli, [*base, *args], catch_exceptions=False)

    human = await asyncio.to_thread(invoke)
    assert human.exit_code == 1, human.output
    assert "refused: poison-1" in human.stdout
    assert human.stdout.splitlines()[-1] == "1 refused (kept)"
    doc = json.loads((await asyncio.to_thread(invoke, "--json")).stdout)
    assert doc["summary"]["replayed"] == 0
    assert doc["summary"]["refused"] == 1
    assert [o["outcome"] for o in doc["outcomes"]] == ["refused"]


async def test_a_task_dead_lettered_again_before_the_batch_ends_is_counted_apart(
    make_queue: Callable[..., Queue],
) -> None:
    # The eager mode runs a replayed task before the replay returns: the batch then sees
    # that it failed again, as it sees a task a worker dead-lettered while the batch ran.
    queue = make_queue(name="ro")

    fixed = False

    @queue.task(name="ro.fails", retries=0)
    async def fails(n: int) -> None:
        raise ValueError(f"still broken {n}")

    @queue.task(name="ro.flaky", retries=0)
    async def flaky() -> int:
        if not fixed:
            raise ValueError("not yet")
        return 1

    with eager(propagate=False):
        await fails.enqueue(1)
        await flaky.enqueue()
        assert await queue.dead_letter_count() == 2
        fixed = True  # the fix of flaky is deployed; fails is still broken
        outcomes = await queue.retry_dead_letters()
        by_task = {o.task: o for o in outcomes}
        assert by_task["ro.flaky"].outcome == "replayed"
        assert by_task["ro.fails"].outcome == "dead-lettered again"  # was "replayed"
        assert by_task["ro.fails"].detail.startswith("failed: "), by_task["ro.fails"].detail
        assert "still broken 1" in by_task["ro.fails"].detail
        counts = replay_counts(outcomes)
        assert (counts["replayed"], counts["dead_lettered_again"]) == (2, 1)
        assert [d.task for d in await queue.dead_letters()] == ["ro.fails"]


def test_the_summary_line_names_the_dead_lettered_again() -> None:
    outcomes = [
        ReplayOutcome("a", "t", "q", "replayed"),
        ReplayOutcome("b", "t", "q", "dead-lettered again", "failed: ValueError: x"),
        ReplayOutcome("c", "t", "q", "refused", "malformed message: timeout is -1.0"),
        ReplayOutcome("d", "t", "q", "held", "other"),
    ]
    counts = replay_counts(outcomes)
    assert counts == {
        "replayed": 2,
        "dead_lettered_again": 1,
        "refused": 1,
        "held": 1,
        "gone": 0,
        "dry_run": 0,
    }
    assert replay_summary(counts) == (
        "replayed 2 (1 of them dead-lettered again already), 1 refused (kept), 1 held (kept)"
    )
    assert replay_summary(replay_counts([])) == "no dead letters match"
