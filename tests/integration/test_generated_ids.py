"""Generated task ids on a real server: what a producer writes when the caller chooses no id
(24 characters a-z2-7, a MessagePack fixstr right after the array header) is run by a worker,
found by its id (record, ``inspect``, ``get_result``), in both modes; a workflow's id and its
steps' ids have the same form."""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue, chain
from blitzq.broker.redis.keys import MESSAGE_FIELD, Keys

from .proc_tasks import make_worker, running

pytestmark = pytest.mark.timeout(60)

ALPHABET = set(string.ascii_lowercase + "234567")


def generated(task_id: str) -> bool:
    """Whether ``task_id`` has the generated form."""
    return len(task_id) == 24 and set(task_id) <= ALPHABET


@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_a_generated_id_travels_as_a_fixstr_and_the_task_is_found_by_it(
    make_queue: Callable[..., Queue], raw_redis: Any, namespace: str, mode: str
) -> None:
    queue = make_queue(name="genid", mode=mode)

    @queue.task(name="genid.double")
    async def double(x: int = 1) -> int:
        return 2 * x

    one = await double.enqueue()
    many = await double.enqueue_many([(2,), (3,)])
    handles = [one, *many]
    assert all(generated(h.id) for h in handles)
    assert len({h.id for h in handles}) == 3
    keys = Keys(namespace)
    if mode == "reliable":
        raw = [f[MESSAGE_FIELD] for _, f in await raw_redis.xrange(keys.stream("genid"))]
    else:
        raw = await raw_redis.lrange(keys.list("genid"), 0, -1)
    assert len(raw) == 3
    # [array header, fixstr header (0xa0 + 24), the 24 characters, the task name, ...]
    assert {(m[1], m[2:26].decode()) for m in raw} == {(0xB8, h.id) for h in handles}
    try:
        async with running(make_worker(queue)):
            assert [await h.result(timeout=30) for h in handles] == [2, 4, 6]
        for h in handles:
            record = await queue.inspect(h.id)
            assert record is not None
            assert record.id == h.id
            assert record.state.value == "succeeded"
        assert await queue.get_result(one.id, timeout=5) == 2
    finally:
        await queue.close()


async def test_batches_take_generated_ids_beside_chosen_ones(
    make_queue: Callable[..., Queue],
) -> None:
    """``enqueue_many`` of a generator (ids made 64 at a time: a second block here) and
    ``send_many`` give every item without a ``task_id`` its own generated id."""
    queue = make_queue(name="genidmany")

    @queue.task(name="genidmany.one")
    async def one(x: int) -> int:
        return x

    many = await one.enqueue_many((x,) for x in range(100))
    chosen = await one.enqueue_many([((1,), {}, {"task_id": "mine-1"}), (2,)])
    sent = await queue.send_many(
        [("genidmany.one", [3], None), ("genidmany.one", [4], None, {"task_id": "mine-2"})]
    )
    ids = [h.id for h in [*many, *chosen, *sent]]
    assert [i for i in ids if not generated(i)] == ["mine-1", "mine-2"]
    assert len(set(ids)) == 104
    try:
        async with running(make_worker(queue)):
            assert [await h.result(timeout=30) for h in [*chosen, *sent]] == [1, 2, 3, 4]
    finally:
        await queue.close()


async def test_a_workflow_and_its_steps_get_generated_ids(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(name="genidwf")

    @queue.task(name="genidwf.add")
    async def add(x: int, y: int = 1) -> int:
        return x + y

    flow = await queue.apply(chain(add.s(1), add.s()))
    assert generated(flow.id)
    steps = [h.id for h in await flow.children()]
    assert len(steps) == 2
    assert all(generated(s) for s in steps)
    try:
        async with running(make_worker(queue)):
            assert await flow.get(timeout=30) == 3
    finally:
        await queue.close()
