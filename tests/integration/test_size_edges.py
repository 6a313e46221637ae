"""The size limits at their exact edge: what the user gave is what is counted.

``max_result_size`` counts the value the task returned (a ``bytes`` result its length, a
``str`` its UTF-8 length), not the record's own fields: a task returning exactly 8 MiB of
bytes under the default limit succeeds (it was refused as "8388802 bytes over 8388608").
``max_message_size`` counts the whole encoded message (what crosses the broker and what the
receiving worker checks before decoding): a message of exactly the limit is published and
runs, one byte more is refused at enqueue with an error that says what the limit counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from blitzq import MessageTooLarge, Queue, TaskFailed
from blitzq.limits import DEFAULT_MAX_RESULT_SIZE

from .proc_tasks import make_worker, running

pytestmark = pytest.mark.timeout(90)

LIMIT = 10_000


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


async def test_a_result_of_exactly_the_limit_is_stored_and_one_byte_more_is_refused(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(mode=mode, max_result_size=LIMIT)

    @queue.task(name="edge.blob", retries=2)
    async def blob(n: int, kind: str) -> Any:
        return b"b" * n if kind == "bytes" else "\u00e9" * (n // 2) if kind == "utf8" else "s" * n

    try:
        async with running(make_worker(queue, concurrency=4)):
            for kind in ("bytes", "str", "utf8"):
                exact = await blob.enqueue(LIMIT, kind)
                over = await blob.enqueue(LIMIT + (2 if kind == "utf8" else 1), kind)
                value = await exact.result(timeout=20)
                assert len(value if kind == "bytes" else value.encode()) == LIMIT, kind
                with pytest.raises(TaskFailed) as info:
                    await over.result(timeout=20)
                assert info.value.error_type == "blitzq.exceptions.ResultTooLarge"
                size = LIMIT + (2 if kind == "utf8" else 1)
                assert (info.value.error or "").startswith(
                    f"result of {size} bytes is over the limit of {LIMIT} bytes "
                    "(max_result_size counts the encoded value the task returned)"
                ), info.value.error
                record = await queue.inspect(over.id)
                assert record is not None
                assert record.attempts == 1  # not retried
    finally:
        await queue.close()


async def test_exactly_8_mib_of_bytes_fits_the_default_limit(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(mode=mode)

    @queue.task(name="edge.eight")
    async def eight(extra: int) -> bytes:
        return b"\0" * (DEFAULT_MAX_RESULT_SIZE + extra)

    try:
        async with running(make_worker(queue)):
            exact, over = await eight.enqueue(0), await eight.enqueue(1)
            assert len(await exact.result(timeout=60)) == DEFAULT_MAX_RESULT_SIZE
            with pytest.raises(TaskFailed) as info:
                await over.result(timeout=60)
            assert f"result of {DEFAULT_MAX_RESULT_SIZE + 1} bytes" in (info.value.error or "")
    finally:
        await queue.close()


async def test_a_message_of_exactly_max_message_size_runs_and_one_byte_more_is_refused(
    make_queue: Callable[..., Queue], mode: str
) -> None:
    queue = make_queue(mode=mode, max_message_size=LIMIT)

    @queue.task(name="edge.arg")
    async def arg(data: bytes) -> int:
        return len(data)

    # The envelope's own bytes (id, names, times) at this size, learnt from the error.
    with pytest.raises(MessageTooLarge) as probe:
        await arg.enqueue(b"a" * LIMIT)
    overhead = probe.value.size - LIMIT
    with pytest.raises(MessageTooLarge) as refused:
        await arg.enqueue(b"a" * (LIMIT - overhead + 1))
    assert (refused.value.size, refused.value.limit) == (LIMIT + 1, LIMIT)
    assert str(refused.value) == (
        f"message of {LIMIT + 1} bytes is over the limit of {LIMIT} bytes "
        "(max_message_size counts the whole encoded message: arguments and envelope)"
    )
    exact = await arg.enqueue(b"a" * (LIMIT - overhead))
    stats = await queue.stats([queue.name])
    assert stats["queues"][queue.name]["waiting"] == 1  # only the exact one was published
    try:
        async with running(make_worker(queue)):
            # The receiving worker's check agrees: not dead-lettered as "message too large".
            assert await exact.result(timeout=20) == LIMIT - overhead
        assert await queue.dead_letters(limit=10) == []
    finally:
        await queue.close()
