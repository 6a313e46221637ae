"""Task records keep a preview of the call's arguments (blitzq.arg_preview) where a user
debugging needs them, with a real Worker on a real Redis: failed, dead-lettered, retrying;
queued, running and succeeded with track_state; never in the default success record. The
task page's lookup falls back to the dead letter, and says why when nothing has them;
``blitzq task inspect`` shows them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from click.testing import CliRunner

from blitzq import Queue, Retry
from blitzq import records as builders
from blitzq.arg_preview import MAX_PREVIEW_BYTES
from blitzq.cli import cli
from blitzq.client.task_args import dead_letter_of, task_arguments
from blitzq.records import TaskRecord, TaskState
from blitzq.serialization import dumps, loads
from tests.integration.proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(60)

_ENV: dict[str, str | None] = {"BLITZQ_REDIS_URL": None, "BLITZQ_NAMESPACE": None}


def _tasks(q: Queue, started: asyncio.Event | None = None, go: asyncio.Event | None = None) -> None:
    @q.task(name="add")
    async def add(a: int, b: int = 0) -> int:
        return a + b

    @q.task(name="fails", retries=0, dead_letter=False)
    async def fails(user: str, *, blob: bytes = b"") -> None:
        raise ValueError(f"no user {user}")

    @q.task(name="dies", retries=0)
    async def dies(order: dict[str, Any]) -> None:
        raise KeyError(order["id"])

    @q.task(name="flaky", retries=3)
    async def flaky(n: int) -> None:
        raise Retry(delay=3600)

    @q.task(name="size")
    async def size(text: str) -> int:
        return len(text)

    @q.task(name="waits")
    async def waits(label: str) -> str:
        assert started is not None
        assert go is not None
        started.set()
        await go.wait()
        return label


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    """A Queue (no track_state) with ``add``, ``fails`` (no dead letter), ``dies`` (dead
    letter) and ``flaky`` (retried an hour later)."""
    q = make_queue()
    _tasks(q)
    yield q
    await q.close()


async def final(queue: Queue, task_id: str) -> TaskRecord:
    """The task's record once it is final."""
    record = await eventually(
        lambda: queue.inspect(task_id), lambda r: r is not None and r.state.is_final
    )
    assert record is not None
    return record


async def raw_record(queue: Queue, task_id: str) -> dict[str, Any]:
    """The stored record's map."""
    data = await queue.broker.get_record(task_id)
    assert data is not None
    out = loads(data)
    assert isinstance(out, dict)
    return out


async def test_a_failed_task_keeps_its_arguments(queue: Queue) -> None:
    handle = await queue.tasks["fails"].enqueue("ada", blob=b"\x00\xff")
    async with running(make_worker(queue)):
        record = await final(queue, handle.id)
    assert record.state is TaskState.FAILED
    assert record.args == ["ada"]
    assert record.kwargs == {"blob": repr(b"\x00\xff")}  # bytes shown by their repr
    assert record.args_truncated is False
    assert await dead_letter_of(queue.broker, handle.id) is None
    shown = await task_arguments(queue.broker, record, None)
    assert shown["args_from"] == "record"
    assert shown["args_note"] is None


async def test_a_dead_lettered_task_keeps_them_and_the_dead_letter_is_the_fallback(
    queue: Queue,
) -> None:
    handle = await queue.tasks["dies"].enqueue({"id": 7, "items": ["a", "b"]})
    async with running(make_worker(queue)):
        record = await final(queue, handle.id)
    assert record.state is TaskState.DEAD_LETTERED
    assert record.args == [{"id": 7, "items": ["a", "b"]}]
    assert record.kwargs == {}
    # A record without them (written by an older blitzq, or by the broker's recovery):
    # the dead letter still has the message.
    bare = builders.failed(
        handle.id, "dies", record.queue, 1, 0.0, None, "w", "KeyError", "7", "", True
    )
    await queue.broker.set_record(handle.id, bare, 60)
    bare_record = await queue.inspect(handle.id)
    assert bare_record is not None
    assert bare_record.args is None
    letter = await dead_letter_of(queue.broker, handle.id)
    shown = await task_arguments(queue.broker, bare_record, letter)
    assert shown["args_from"] == "dead letter"
    assert shown["args"] == [{"id": 7, "items": ["a", "b"]}]
    # Once the dead letter is gone too, the note says why nothing is shown.
    await queue.purge_dead_letters()
    shown = await task_arguments(queue.broker, bare_record, None)
    assert shown["args_from"] is None
    assert shown["args"] is None
    assert "dead letter is gone" in shown["args_note"]


async def test_the_default_success_record_keeps_none_and_the_note_says_why(
    queue: Queue,
) -> None:
    handle = await queue.tasks["add"].enqueue(2, b=3)
    async with running(make_worker(queue)):
        assert await handle.result(timeout=20) == 5
    stored = await raw_record(queue, handle.id)
    assert "call" not in stored
    # Byte for byte the record the builder wrote before arguments were kept.
    assert list(stored) == [
        "id", "task", "queue", "state", "attempts", "enqueued_at", "started_at",
        "finished_at", "worker", "result",
    ]  # fmt: skip
    record = await queue.inspect(handle.id)
    assert record is not None
    assert record.args is None
    shown = await task_arguments(queue.broker, record, None)
    assert shown["args_from"] is None
    assert shown["args_note"] == (
        "a succeeded task keeps no arguments unless track_state is on (Queue(track_state=True))"
    )


async def test_with_track_state_every_record_keeps_them(make_queue: Callable[..., Queue]) -> None:
    started, go = asyncio.Event(), asyncio.Event()
    q = make_queue(track_state=True)
    _tasks(q, started, go)
    try:
        handle = await q.tasks["waits"].enqueue("first")
        queued = await q.inspect(handle.id)
        assert queued is not None
        assert queued.state is TaskState.QUEUED
        assert queued.args == ["first"]
        later = await q.tasks["add"].options(delay=3600).enqueue(1, b=2)
        scheduled = await q.inspect(later.id)
        assert scheduled is not None
        assert scheduled.state is TaskState.SCHEDULED
        assert (scheduled.args, scheduled.kwargs) == ([1], {"b": 2})
        flaky = await q.tasks["flaky"].enqueue(5)
        async with running(make_worker(q)):
            await asyncio.wait_for(started.wait(), 20)
            run = await eventually(
                lambda: q.inspect(handle.id),
                lambda r: r is not None and r.state is TaskState.RUNNING,
            )
            assert run.args == ["first"]
            go.set()
            assert await handle.result(timeout=20) == "first"
            retrying = await eventually(
                lambda: q.inspect(flaky.id),
                lambda r: r is not None and r.state is TaskState.RETRYING,
            )
        done = await q.inspect(handle.id)
        assert done is not None
        assert done.state is TaskState.SUCCEEDED
        assert done.args == ["first"]
        assert done.kwargs == {}
        assert retrying.args == [5]
        assert (await task_arguments(q.broker, done, None))["args_from"] == "record"
    finally:
        await q.close()


async def test_huge_arguments_are_cut_to_the_cap(queue: Queue) -> None:
    handle = await queue.tasks["fails"].enqueue("x" * 100_000, blob=b"\x01" * 50_000)
    async with running(make_worker(queue)):
        record = await final(queue, handle.id)
    assert record.args_truncated is True
    assert record.args is not None
    assert record.args[0].startswith("xxx")
    assert record.args[0].endswith("…")
    preview = {"args": record.args, "kwargs": record.kwargs, "truncated": True}
    encoded = json.dumps(preview, ensure_ascii=False, separators=(",", ":")).encode()
    assert len(encoded) <= MAX_PREVIEW_BYTES
    stored = await raw_record(queue, handle.id)  # the error and traceback aside: ~2 kB kept
    assert len(dumps(stored["call"])) <= MAX_PREVIEW_BYTES + 64  # not the 150 kB call


async def test_task_inspect_prints_the_arguments_and_where_they_came_from(
    queue: Queue, server_url: str, namespace: str
) -> None:
    failed = await queue.tasks["fails"].enqueue("grace")
    ok = await queue.tasks["add"].enqueue(1, b=1)
    async with running(make_worker(queue)):
        await final(queue, failed.id)
        assert await ok.result(timeout=20) == 2

    def invoke(*args: str) -> Any:
        base = ["--redis-url", server_url, "--namespace", namespace, "task", "inspect"]
        return CliRunner().invoke(cli, [*base, *args], env=_ENV, catch_exceptions=False)

    text = await asyncio.to_thread(invoke, failed.id)
    doc = json.loads((await asyncio.to_thread(invoke, failed.id, "--json")).stdout)
    plain = await asyncio.to_thread(invoke, ok.id)
    plain_doc = json.loads((await asyncio.to_thread(invoke, ok.id, "--json")).stdout)
    assert text.exit_code == 0, text.output
    rows = [line.split(None, 1) for line in text.stdout.splitlines() if len(line.split()) > 1]
    assert ["args", '["grace"]'] in [[k, v.strip()] for k, v in rows]
    assert ["kwargs", "{}"] in [[k, v.strip()] for k, v in rows]
    assert "args from  the record" in text.stdout
    assert (doc["args"], doc["kwargs"], doc["args_from"]) == (["grace"], {}, "record")
    assert doc["args_note"] is None
    assert doc["args_truncated"] is False
    assert plain_doc["args"] is None
    assert plain_doc["args_from"] is None
    assert "track_state" in plain_doc["args_note"]
    assert "not kept: a succeeded task keeps no arguments" in " ".join(plain.stdout.split())


async def test_the_preview_never_fails_a_run_over_max_result_size(
    make_queue: Callable[..., Queue],
) -> None:
    q = make_queue(track_state=True, max_result_size=1000)
    _tasks(q)
    try:
        small = await q.tasks["add"].enqueue(1, b=2)
        big = await q.tasks["size"].enqueue("x" * 5000)
        async with running(make_worker(q)):
            assert await small.result(timeout=20) == 3
            assert await big.result(timeout=20) == 5000  # not ResultTooLarge
        small_record = await q.inspect(small.id)
        big_record = await q.inspect(big.id)
    finally:
        await q.close()
    assert small_record is not None
    assert small_record.args == [1]  # fits: kept
    assert big_record is not None
    assert big_record.state is TaskState.SUCCEEDED
    assert big_record.args is None  # the preview alone would pass the limit: left out
