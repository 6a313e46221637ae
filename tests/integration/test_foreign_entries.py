"""A stream entry without the message field ``m`` (another program's ``XADD {ns}:s:default *
x garbage``) is dead-lettered with an error naming the fault and the fields it holds, not
the decoder's ``Input data was truncated`` about the empty message it stood for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue
from blitzq.broker.redis.keys import Keys

from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("fields", "found"),
    [
        ({"x": "garbage"}, "fields found: 'x'"),
        ({"data": "1", "d": "2"}, "fields found: 'data', 'd'"),
        ({f"f{i}": "v" for i in range(12)}, "fields found: 'f0', 'f1'"),
    ],
    ids=["x garbage", "data and d", "twelve fields"],
)
async def test_an_entry_without_a_message_field_is_dead_lettered_saying_so(
    fields: dict[str, str],
    found: str,
    make_queue: Callable[..., Queue],
    raw_redis: Any,
    namespace: str,
) -> None:
    queue = make_queue(mode="reliable")

    @queue.task(name="foreign.ok")
    async def ok() -> str:
        return "ok"

    await raw_redis.xadd(Keys(namespace).stream(queue.name), fields)
    try:
        async with running(make_worker(queue, concurrency=2)):
            dead = await eventually(
                lambda: queue.dead_letters(limit=10), lambda rows: len(rows) >= 1
            )
            assert await (await ok.enqueue()).result(timeout=15) == "ok"  # still consuming
        [letter] = dead
        assert letter.reason == "malformed message"
        assert 'the stream entry has no message field "m"' in letter.error
        assert found in letter.error
        assert "truncated" not in letter.error
        if len(fields) > 10:
            assert letter.error.endswith(", ...")
    finally:
        await queue.close()
