"""The index of ended tasks (the dashboard's task list) in its packed layout, on Redis and on
the embedded Valkey: a member ``<n>:<token>`` per write in ``{ns}:ended:<queue>`` and its
notes in ``{ns}:endnotes:<queue>`` (``broker/redis/browse.py``, ``lua/recent_add.lua``).

Pages across writes of many notes (cut inside one) list every note once, newest first; the
cap keeps at least ``recent_index`` notes and drops whole writes, the notes with their
member; both keys expire ``result_ttl`` after the last write; a completion's notes
(``complete.lua``'s ``"I"`` entries) land in the same index; the earlier layout
(``{ns}:recent:<queue>``, a member per task) is listed beside it until it expires.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from blitzq import Queue
from blitzq.broker import Completion
from blitzq.broker.redis.browse import INLINE_NOTES, NOTES_PER_ENTRY
from blitzq.broker.redis.keys import Keys
from blitzq.dashboard.listing import TaskQuery, list_tasks
from blitzq.exceptions import BrokerError

pytestmark = [pytest.mark.timeout(90), pytest.mark.both_servers]


@pytest.fixture
async def queue(make_queue: Callable[..., Queue]) -> AsyncIterator[Queue]:
    """A Queue whose known queues are ``default`` and ``other`` (what workers record)."""
    q = make_queue()
    await q.broker.remember_queues(["default", "other"])
    yield q
    await q.close()


def notes(tag: str, n: int, state: str = "succeeded") -> list[str]:
    """``n`` notes ``"<state>\\n<task>\\n<id>"`` of ids ``<tag>-<i>``, in the order they ended."""
    return [f"{state}\njob.{tag}\n{tag}-{i}" for i in range(n)]


def ids(members: list[str]) -> list[str]:
    """The task ids of notes."""
    return [m.rsplit("\n", 1)[1] for m in members]


async def every_page(app: Queue, limit: int, **filters: Any) -> list[dict[str, Any]]:
    """The rows of every page of ``app``'s list of ended tasks, ``limit`` a page, following
    ``next``; ``filters`` are :class:`TaskQuery` fields."""
    rows: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await list_tasks(app, TaskQuery(limit=limit, cursor=cursor, **filters))
        rows += page["items"]
        cursor = page["next"]
        if cursor is None:
            return rows


async def held(raw: Any, keys: Keys, name: str) -> tuple[int, list[int]]:
    """The notes the index of queue ``name`` says it holds (its ``#``), and the counts of
    its members, oldest first; asserting a notes field per member and no other."""
    count = -int(await raw.zscore(keys.ended(name), "#"))
    members = [m.decode() for m in await raw.zrangebyscore(keys.ended(name), "(0", "+inf")]
    fields = sorted(f.decode() for f in await raw.hkeys(keys.ended_notes(name)))
    assert fields == sorted(members)
    return count, [int(m.split(":")[0]) for m in members]


@pytest.mark.parametrize("limit", [1, 3, 333, 500])
async def test_pages_list_every_note_once_newest_first_across_packed_writes(
    queue: Queue, limit: int
) -> None:
    browse = queue.broker.state.browse
    at = time.time() - 60
    big = notes("big", 2 * NOTES_PER_ENTRY + 500 if limit > 100 else 9)  # three members
    await browse.add_ended("default", big, at, 100_000, 600)
    await browse.add_ended("default", notes("mid", 4), at + 1, 100_000, 600)
    # The same time in two queues: the queues' order (as listed) decides, then newest first.
    await browse.add_ended("other", notes("oth", 5, "failed"), at + 2, 100_000, 600)
    await browse.add_ended("default", notes("new", 2), at + 2, 100_000, 600)
    rows = await every_page(queue, limit)
    expected = [
        *ids(notes("new", 2))[::-1],
        *ids(notes("oth", 5))[::-1],
        *ids(notes("mid", 4))[::-1],
        *ids(big)[::-1],
    ]
    assert [r["id"] for r in rows] == expected
    ats = [r["at"] for r in rows]
    assert ats == sorted(ats, reverse=True)
    assert {r["queue"] for r in rows[2:7]} == {"other"}
    assert {r["state"] for r in rows[2:7]} == {"failed"}
    assert rows[-1]["task"] == "job.big"
    # Filters on the packed notes: a state, a queue, a time range.
    failed = await every_page(queue, limit, state="failed")
    assert [r["id"] for r in failed] == ids(notes("oth", 5))[::-1]
    newer = await every_page(queue, limit, queue="default", since=at + 0.5)
    assert [r["id"] for r in newer] == [*ids(notes("new", 2))[::-1], *ids(notes("mid", 4))[::-1]]


@pytest.mark.parametrize("limit", [1, 2, 5])
async def test_writes_that_share_a_time_page_without_a_skip_or_a_repeat(
    queue: Queue, limit: int
) -> None:
    """Two writes of one queue at one time (members ordered by their random tokens) and a
    write of another queue at that time, with newer writes arriving between the pages."""
    browse = queue.broker.state.browse
    at = time.time() - 60
    await browse.add_ended("default", notes("a", 3), at, 1000, 600)
    await browse.add_ended("default", notes("b", 4), at, 1000, 600)
    await browse.add_ended("other", notes("c", 2), at, 1000, 600)
    await browse.add_ended("default", notes("old", 3), at - 1, 1000, 600)
    seen: list[str] = []
    cursor = None
    while True:
        page = await list_tasks(queue, TaskQuery(limit=limit, cursor=cursor))
        seen += [r["id"] for r in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
        await browse.add_ended("default", notes(f"later{len(seen)}", 1), at + 5, 1000, 600)
    assert len(seen) == len(set(seen)) == 12  # the newer ones come before the cursor
    rest = seen
    assert sorted(rest[:9]) == sorted(ids(notes("a", 3) + notes("b", 4) + notes("c", 2)))
    assert rest[9:] == ids(notes("old", 3))[::-1]


async def test_the_cap_keeps_the_newest_notes_dropping_whole_writes(
    queue: Queue, raw_redis: Any
) -> None:
    browse, keys = queue.broker.state.browse, Keys(queue.namespace)
    cap, at = 2500, time.time() - 600
    written: list[str] = []
    for w in range(9):
        batch = notes(f"w{w}", 700)
        written += batch
        await browse.add_ended("default", batch, at + w, cap, 600)
        count, members = await held(raw_redis, keys, "default")
        assert count == sum(members)
        if len(written) <= cap:
            assert count == len(written)
        else:
            assert cap <= count < cap + 700
        assert members[-1] == 700
    # One write past NOTES_PER_ENTRY: members of at most that many notes each.
    batch = notes("big", NOTES_PER_ENTRY * 2 + 1)
    written += batch
    await browse.add_ended("default", batch, at + 20, cap, 600)
    count, members = await held(raw_redis, keys, "default")
    assert members[-3:] == [NOTES_PER_ENTRY, NOTES_PER_ENTRY, 1]
    assert cap <= count < cap + members[0]
    assert count == sum(members)
    rows = await every_page(queue, 500)
    assert [r["id"] for r in rows] == ids(written)[::-1][:count]
    # A cap below one write's notes keeps that write whole, and nothing older.
    await browse.add_ended("default", notes("last", 50), at + 30, 10, 600)
    assert await held(raw_redis, keys, "default") == (50, [50])


async def test_both_keys_expire_result_ttl_after_the_last_write(
    queue: Queue, raw_redis: Any
) -> None:
    browse, keys = queue.broker.state.browse, Keys(queue.namespace)
    await browse.add_ended("default", notes("x", 3), time.time(), 100, 600)
    for key in (keys.ended("default"), keys.ended_notes("default")):
        assert 0 < await raw_redis.ttl(key) <= 600
    await browse.add_ended("default", notes("y", 3), time.time(), 100, 5000)
    for key in (keys.ended("default"), keys.ended_notes("default")):
        assert 600 < await raw_redis.ttl(key) <= 5000
    assert await raw_redis.exists(keys.recent("default")) == 0  # the earlier key: not written
    # Gone with their keys: nothing listed, no error.
    await raw_redis.delete(keys.ended("default"), keys.ended_notes("default"))
    assert (await list_tasks(queue, TaskQuery()))["items"] == []


async def test_a_member_whose_notes_are_gone_is_skipped(queue: Queue, raw_redis: Any) -> None:
    """A member read just before its write was trimmed (or its notes evicted) lists nothing."""
    browse, keys = queue.broker.state.browse, Keys(queue.namespace)
    at = time.time() - 10
    await browse.add_ended("default", notes("kept", 2), at, 100, 600)
    await browse.add_ended("default", notes("lost", 2), at + 1, 100, 600)
    newest = await raw_redis.zrevrangebyscore(keys.ended("default"), "+inf", "(0", 0, 1)
    await raw_redis.hdel(keys.ended_notes("default"), newest[0])
    rows = await every_page(queue, 1)
    assert [r["id"] for r in rows] == ids(notes("kept", 2))[::-1]


async def test_a_completions_notes_land_in_the_same_index(queue: Queue, raw_redis: Any) -> None:
    """What ``complete.lua``'s ``"I"`` entries write (notes riding in completions, before a
    worker's maintenance starts and during its shutdown)."""
    keys = Keys(queue.namespace)
    members = notes("done", 3)
    done = zip(ids(members), members, strict=True)
    ended = [Completion("default", None, i, ended=(m, 100, 600)) for i, m in done]
    await queue.broker.complete(ended)
    assert await held(raw_redis, keys, "default") == (3, [3])
    assert 0 < await raw_redis.ttl(keys.ended_notes("default")) <= 600
    rows = await every_page(queue, 2)
    assert [r["id"] for r in rows] == ids(members)[::-1]


async def test_the_earlier_layout_is_listed_beside_the_index(queue: Queue, raw_redis: Any) -> None:
    """An index of the earlier layout (a member per task, scored in seconds) is read while
    it lives (an upgrade: the workers before it wrote there), merged by time."""
    keys = Keys(queue.namespace)
    at = time.time() - 30
    old = notes("old", 3, "dead_lettered")
    await raw_redis.zadd(keys.recent("default"), {m: at + k / 1e6 for k, m in enumerate(old)})
    await raw_redis.expire(keys.recent("default"), 600)
    await queue.broker.state.browse.add_ended("default", notes("new", 2), at + 1, 100, 600)
    await queue.broker.state.browse.add_ended("default", notes("older", 1), at - 1, 100, 600)
    for limit in (1, 2, 10):
        rows = await every_page(queue, limit)
        assert [r["id"] for r in rows] == [
            *ids(notes("new", 2))[::-1],
            *ids(old)[::-1],
            *ids(notes("older", 1)),
        ]
    dead = await every_page(queue, 10, state="dead_lettered")
    assert [r["id"] for r in dead] == ids(old)[::-1]


async def test_a_key_of_another_type_is_refused(queue: Queue, raw_redis: Any) -> None:
    keys = Keys(queue.namespace)
    browse = queue.broker.state.browse
    await raw_redis.set(keys.ended("default"), "x")
    with pytest.raises(BrokerError):  # notes given to the script: nothing written
        await browse.add_ended("default", notes("x", 1), time.time(), 10, 60)
    assert await raw_redis.exists(keys.ended_notes("default")) == 0
    with pytest.raises(BrokerError):  # notes written beside the call: they expire
        await browse.add_ended("default", notes("y", 100), time.time(), 10, 60)
    assert await raw_redis.get(keys.ended("default")) == b"x"
    assert 0 < await raw_redis.ttl(keys.ended_notes("default")) <= 60


async def test_small_and_large_writes_list_alike(queue: Queue, raw_redis: Any) -> None:
    """Notes up to INLINE_NOTES characters go through the script, larger ones beside it."""
    browse, keys = queue.broker.state.browse, Keys(queue.namespace)
    at = time.time() - 10
    small, large = notes("s", 3), notes("l", 60)
    assert len("\n".join(small)) <= INLINE_NOTES < len("\n".join(large))
    await browse.add_ended("default", small, at, 100, 600)
    await browse.add_ended("default", large, at + 1, 100, 600)
    assert await held(raw_redis, keys, "default") == (63, [3, 60])
    rows = await every_page(queue, 7)
    assert [r["id"] for r in rows] == [*ids(large)[::-1], *ids(small)[::-1]]


@pytest.mark.parametrize("layout", ["", "?layout=slot"])
async def test_the_index_on_a_redis_cluster(redis_cluster: Any, layout: str) -> None:
    """Both writes (notes through the script, notes beside it: a pipeline of one slot) and
    the reads (pipelines of ``{ns}`` keys) on a cluster, in either layout."""
    q = Queue(redis_url=redis_cluster.url() + layout, namespace=f"idx-{uuid.uuid4().hex[:8]}")
    try:
        await q.broker.remember_queues(["default"])
        at = time.time() - 10
        await q.broker.state.browse.add_ended("default", notes("s", 2), at, 100, 60)
        await q.broker.state.browse.add_ended("default", notes("l", 60), at + 1, 100, 60)
        rows = await every_page(q, 7)
        assert [r["id"] for r in rows] == [*ids(notes("l", 60))[::-1], *ids(notes("s", 2))[::-1]]
    finally:
        await q.close()
