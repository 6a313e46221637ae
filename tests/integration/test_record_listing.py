"""The bounded listing of task records behind the Django admin page
(:func:`blitzq.client.listing.recent_records`) on a real server: filters, the exact-id
search past the bound, and the bound itself said (``capped``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from blitzq import Queue
from blitzq.client.listing import recent_records
from blitzq.records import TaskState

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    """A Queue that writes a record at enqueue (``track_state``)."""
    q = make_queue(name="listing", track_state=True)
    yield q
    await q.close()


async def test_filters_search_and_the_bound(queue: Queue) -> None:
    first = await queue.send("list.a", [1], {})
    second = await queue.send("list.b", [2], {}, queue="mail", priority="high")
    third = await queue.send("list.a", [3], {}, queue="mail")
    ids = {first.id, second.id, third.id}

    page = await recent_records(queue.broker)
    assert {r.id for r in page.records} == ids
    assert (page.matched, page.examined, page.capped) == (3, 3, False)
    assert all(r.state is TaskState.QUEUED for r in page.records)

    mail = await recent_records(queue.broker, queue="mail")  # the level matches its queue
    assert {r.id for r in mail.records} == {second.id, third.id}
    high = await recent_records(queue.broker, queue="mail:high")
    assert [r.id for r in high.records] == [second.id]
    none = await recent_records(queue.broker, states=[TaskState.FAILED])
    assert none.records == []
    assert none.matched == 0
    prefix = await recent_records(queue.broker, search=first.id[:10])
    assert [r.id for r in prefix.records] == [first.id]
    one = await recent_records(queue.broker, limit=1)
    assert len(one.records) == 1
    assert one.matched == 3

    small = await recent_records(queue.broker, examine=2)
    assert small.capped
    assert small.examined == 2
    assert len(small.records) == 2
    for task_id in ids:  # an exact id is read directly, past the bound
        found = await recent_records(queue.broker, examine=1, search=task_id)
        assert [r.id for r in found.records] == [task_id]
