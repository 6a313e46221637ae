"""What a newcomer sees when a task "never runs" (issue 12, the newcomer's path).

- A result wait that times out says why when the product knows: no worker runs in the
  namespace, no live worker consumes the task's queue, or the task waits on the schedule.
- ``inspect`` of a task enqueued with a delay shows it ``scheduled`` with its due time (and
  so does ``blitzq task inspect``), with or without ``track_state``.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from blitzq import Queue, ResultTimeout, TaskState
from blitzq.cli import cli as cli_main

from .proc_tasks import eventually, make_worker, running


@pytest.fixture(params=[False, True], ids=["no-state", "track-state"])
async def queue(
    make_queue: Callable[..., Queue], request: pytest.FixtureRequest
) -> AsyncIterator[Queue]:
    """A Queue on the test server, with or without ``track_state``."""
    q = make_queue(track_state=request.param)
    yield q
    await q.close()


async def test_timeout_without_any_worker_says_to_start_one(queue: Queue) -> None:
    @queue.task(name="hint.add")
    async def add(a: int, b: int) -> int:
        return a + b

    handle = await add.enqueue(1, 2)
    with pytest.raises(ResultTimeout, match="no worker is running in namespace") as caught:
        await handle.result(timeout=0.2)
    # The README's Quick start quotes this message (in the default namespace).
    readme = " ".join((Path(__file__).parents[2] / "README.md").read_text().split())
    quoted = re.search(r"`ResultTimeout: \.\.\. ([^`]+)`", readme)
    assert quoted is not None
    assert quoted.group(1) in str(caught.value).replace(repr(queue.namespace), "'blitzq'")
    with pytest.raises(ResultTimeout, match="no worker is running in namespace"):
        await queue.get_result(handle.id, timeout=0.2)


async def test_timeout_names_the_queue_no_live_worker_consumes(queue: Queue) -> None:
    @queue.task(name="hint.mail", queue="emails")
    async def mail(to: str) -> str:
        return to

    async with running(make_worker(queue, queues=["default"], concurrency=1)):
        await eventually(queue.broker.workers, bool)  # registered
        handle = await mail.enqueue("a@example.org")
        with pytest.raises(ResultTimeout, match="no live worker consumes queue 'emails'"):
            await handle.result(timeout=0.2)
        # The priority level is the same queue for the workers: named without its suffix.
        high = await mail.options(priority="high").enqueue("b@example.org")
        with pytest.raises(ResultTimeout, match="-Q emails"):
            await high.result(timeout=0.2)


async def test_scheduled_task_is_inspected_with_its_due_time(queue: Queue) -> None:
    @queue.task(name="hint.later")
    async def later() -> None:
        return None

    now = await queue.broker.server_time()
    handle = await later.options(delay=600).enqueue()
    record = await queue.inspect(handle.id)
    assert record is not None
    assert record.state is TaskState.SCHEDULED
    assert record.task == "hint.later"
    assert record.queue == "default"
    assert record.attempts == 0
    assert record.due_at is not None
    assert now + 590 < record.due_at < now + 610
    with pytest.raises(ResultTimeout, match="it is scheduled, due in"):
        await handle.result(timeout=0.2)
    # Nothing known of an id never enqueued.
    assert await queue.inspect("never-enqueued") is None


async def test_scheduled_task_no_live_worker_knows_is_named(
    queue: Queue, server_url: str, namespace: str
) -> None:
    """A name no worker of the queue knows goes back on the schedule (a rolling deploy's
    grace), so a wait on it times out "scheduled": the hint and ``task inspect`` say the
    name is unknown to the live workers instead of only "wait"."""

    @queue.task(name="hint.known")
    async def known() -> None:
        return None

    async with running(make_worker(queue, concurrency=1)):
        await eventually(queue.broker.workers, bool)  # registered
        unknown = await queue.send("hint.nope", delay=600)
        with pytest.raises(ResultTimeout, match="it is scheduled, due in") as caught:
            await unknown.result(timeout=0.2)
        assert "no live worker that consumes queue 'default' knows a task named 'hint.nope'" in (
            str(caught.value)
        )
        args = ["--redis-url", server_url, "--namespace", namespace, "--json"]
        inspect = [*args, "task", "inspect"]
        shown = await asyncio.to_thread(CliRunner().invoke, cli_main, [*inspect, unknown.id])
        assert shown.exit_code == 0, shown.output
        assert "knows a task named 'hint.nope'" in json.loads(shown.stdout)["note"]
        # A name a live worker knows waits on its delay: no such note.
        later = await known.options(delay=600).enqueue()
        with pytest.raises(ResultTimeout, match="it is scheduled, due in") as caught:
            await later.result(timeout=0.2)
        assert "knows a task named" not in str(caught.value)
        shown = await asyncio.to_thread(CliRunner().invoke, cli_main, [*inspect, later.id])
        assert json.loads(shown.stdout)["note"] is None


def test_cli_task_inspect_shows_a_scheduled_task(
    make_queue: Callable[..., Queue], server_url: str, namespace: str
) -> None:
    queue = make_queue()

    @queue.task(name="hint.cli")
    async def later() -> None:
        return None

    handle = later.options(delay=600).enqueue_sync()
    queue.close_sync()
    args = ["--redis-url", server_url, "--namespace", namespace]
    result = CliRunner().invoke(cli_main, [*args, "--json", "task", "inspect", handle.id])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["state"] == "scheduled"
    assert doc["task"] == "hint.cli"
    assert doc["due_at"]
    text = CliRunner().invoke(cli_main, [*args, "task", "inspect", handle.id])
    assert text.exit_code == 0, text.output
    assert "scheduled" in text.output
    assert "due" in text.output


def test_sync_result_wait_without_a_worker_says_to_start_one(
    make_queue: Callable[..., Queue],
) -> None:
    """The last line of the README's main.py: ``add.enqueue_sync(1, 2).result_sync(...)``."""
    queue = make_queue()

    @queue.task(name="hint.sync_add")
    def add(a: int, b: int) -> int:
        return a + b

    try:
        with pytest.raises(ResultTimeout, match=r"no worker is running in namespace .*start one"):
            add.enqueue_sync(1, 2).result_sync(timeout=0.2)
    finally:
        queue.close_sync()


def test_no_worker_hint_on_the_embedded_server_names_its_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each directory's ``.blitzq`` is an embedded server of its own (a user test: a worker
    started in another directory never sees this producer's tasks): the hint says so."""
    from blitzq.broker.redis import embedded

    project = tmp_path / "producer-dir"
    project.mkdir()
    for name in ("BLITZQ_REDIS_URL", "BLITZQ_DATA_DIR", "BLITZQ_NAMESPACE", "BLITZQ_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(project)
    queue = Queue(namespace="hint-embedded")  # no URL: this directory's embedded server
    try:

        @queue.task(name="hint.embedded_add")
        def add(a: int, b: int) -> int:
            return a + b

        with pytest.raises(ResultTimeout) as caught:
            add.enqueue_sync(1, 2).result_sync(timeout=0.2)
        text = str(caught.value)
        assert "no worker is running in namespace 'hint-embedded'" in text
        assert f"embedded server ({(project / '.blitzq').resolve()})" in text
        assert "another directory" in text
    finally:
        queue.close_sync()
        embedded.stop_server(project / ".blitzq")


async def test_no_worker_hint_on_a_server_url_says_nothing_of_embedded_servers(
    queue: Queue,
) -> None:
    @queue.task(name="hint.url_add")
    async def add(a: int, b: int) -> int:
        return a + b

    handle = await add.enqueue(1, 2)
    with pytest.raises(ResultTimeout) as caught:
        await handle.result(timeout=0.2)
    assert "no worker is running" in str(caught.value)
    assert "embedded server" not in str(caught.value)
