"""A task's home on the spread layout: the slot its own state lives in, found from its id.

On the spread layout (``spread.py``) each queue has a slot of its own (``{<ns>:q:<queue>}``).
A task id of the form ``<32 hex digits>.<base queue>`` (:func:`homed_id`, what the producer
generates there) is **homed**: its record ``t:<id>``, the record's channel ``done:<id>``,
its progress ``p:<id>`` and channel ``progress:<id>`` are under its queue's tag, beside the
queue's streams, so its common completion is one script on one shard
(:func:`complete_in`). Any other id (chosen by the caller, or made without a queue at hand)
has the home ``{<ns>}``, where every key of the namespace lived before. :meth:`HomedKeys.home`
is a pure function of the namespace and the id: every reader and writer computes the same
key, with no index. docs/architecture.md ("Redis Cluster: per-task state in the queue's
slot") says why no cross-slot step loses or doubles a task.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec

from ...limits import NOTIFY_INLINE_MAX
from ...routing import base_queue
from ..effects import Progress
from ..values import Completion
from .client import translate_errors
from .completion import encode_batch, encode_entries
from .connection import RedisConnection
from .control_state import RedisControl
from .dead_letters import RedisDeadLetters
from .handoff import Held, SpreadRecords, SpreadStateStore
from .keys import GROUP, Keys, glob_escape

__all__ = [
    "HOME_MARK",
    "HomedControl",
    "HomedDeadLetters",
    "HomedKeys",
    "HomedRecords",
    "HomedStateStore",
    "complete_in",
    "home_queue",
    "homed_id",
    "homeless",
]

#: Longest announcement of a wait (seconds): a longer wait announces itself again each time
#: it re-reads (once a second at most).
ANNOUNCE_MAX = 3600.0
#: What separates the random part of a homed id from its queue (not ``@``: a task id may
#: appear in a URL, where ``@`` ends a userinfo, and in a lock holder ``<id>@<entry>``).
HOME_MARK = "."
_HEX = frozenset("0123456789abcdef")
#: The suffixes (after the prefix) of a task's own keys, as :class:`~.keys.Keys` makes them.
_BARE = Keys("")
_T, _DONE = _BARE.record("")[3:], _BARE.done_channel("")[3:]
_P, _PC = _BARE.progress("")[3:], _BARE.progress_channel("")[3:]
_W = _BARE.waiter("")[3:]
_TN = _BARE.owner("")[3:]


def homed_id(queue: str) -> str:
    """A new task id homed on ``queue``'s slot: 128 random bits in hex, ``.``, the base
    queue of ``queue`` (``routing.base_queue``: every priority level shares the home).

    Args:
        queue: the physical queue the task is sent to.
    """
    return os.urandom(16).hex() + HOME_MARK + base_queue(queue)


def home_queue(task_id: str) -> str | None:
    """The base queue a homed id names, or ``None`` for any other id."""
    if len(task_id) < 34 or task_id[32] != HOME_MARK or not _HEX.issuperset(task_id[:32]):
        return None
    return task_id[33:]


@dataclass(frozen=True, slots=True)
class HomedKeys(Keys):
    """The state store's key names on the spread layout: a homed id's record, progress and
    their channels under its queue's tag; every other key as :class:`~.keys.Keys` makes it.
    """

    def home(self, task_id: str) -> str:
        """The key prefix of ``task_id``'s own keys: ``{<ns>:q:<queue>}:`` for a homed id,
        else the namespace's ``{<ns>}:``."""
        queue = home_queue(task_id)
        if queue is None:
            return self.prefix
        return "{" + self.namespace + ":q:" + queue + "}:"

    def home_keys(self, home: str) -> Keys:
        """The :class:`~.keys.Keys` whose prefix is ``home`` (a value of :meth:`home`)."""
        return Keys(home[1:-2])

    def queue_home(self, queue: str) -> str:
        """The home of the ids homed on the physical queue ``queue``: its streams' tag."""
        return "{" + self.namespace + ":q:" + base_queue(queue) + "}:"

    def record(self, task_id: str) -> str:
        """A task's record, in its home."""
        return self.home(task_id) + _T + task_id

    def owner(self, task_id: str) -> str:
        """The owner mark of an explicit id, beside its record in its home."""
        return self.home(task_id) + _TN + task_id

    def done_channel(self, task_id: str) -> str:
        """The channel announcing a task's record, named after its home."""
        return self.home(task_id) + _DONE + task_id

    def waiter(self, task_id: str) -> str:
        """The mark of a process waiting on a task's record, in its home."""
        return self.home(task_id) + _W + task_id

    def progress(self, task_id: str) -> str:
        """A task's latest progress, in its home."""
        return self.home(task_id) + _P + task_id

    def progress_channel(self, task_id: str) -> str:
        """The channel of a task's progress updates, named after its home."""
        return self.home(task_id) + _PC + task_id


def split_home(
    keys: HomedKeys, completions: Sequence[Completion]
) -> tuple[list[Completion], dict[str, list[tuple[Completion, Completion, Completion | None]]]]:
    """Split the completions of homed ids whose delivery (``token``) is on their own queue:
    each into a *home part* (its ack, record, requeue and progress, applied together in one
    script in the queue's slot by :func:`complete_in`) and a *namespace part* (the rest,
    without the token; ``None`` when nothing is left).

    Returns:
        The completions to apply in the namespace (the others, then the namespace parts),
        and by queue tag ``(original, home part, namespace part)`` of the split ones.
    """
    spaced: list[Completion] = []
    homes: dict[str, list[tuple[Completion, Completion, Completion | None]]] = {}
    for c in completions:
        tag = keys.queue_home(c.queue)
        if c.token is None or keys.home(c.task_id) != tag:
            spaced.append(c)
            continue
        own = tuple(op for op in c.ops if isinstance(op, Progress))
        home = Completion(
            c.queue,
            c.token,
            c.task_id,
            c.record,
            c.record_ttl,
            requeue=c.requeue,
            ops=own,
            nonce=c.nonce,
        )
        rest = replace(
            c,
            token=None,
            fence=None,
            record=None,
            requeue=None,
            ops=tuple(op for op in c.ops if op not in own),
        )
        ns = rest if _writes(rest) else None
        if ns is not None:
            spaced.append(ns)
        homes.setdefault(tag, []).append((c, home, ns))
    return spaced, homes


def homeless(c: Completion) -> bool:
    """Whether ``c`` writes namespace-wide state (a schedule entry, a dead letter, an op
    other than progress): the parts of it that are not the task's own go to ``{ns}``."""
    if c.reschedule is not None or c.dead_letter is not None:
        return True
    return any(not isinstance(op, Progress) for op in c.ops)


async def complete_in(
    conn: RedisConnection, consumer: str, home: Keys, completions: Sequence[Completion]
) -> list[Completion]:
    """Apply ``completions`` in one ``complete.lua`` call whose prefix is ``home``'s (a
    queue's tag): acks and fences of their stream entries (the queue's streams), records,
    requeues onto the same queue and progress, atomically, on the queue's shard.

    Args:
        conn: the connection of the streams transport.
        consumer: its consumer name (``transport.lease.consumer``), which fences.
        home: the keys of the queue's tag (:meth:`HomedKeys.home_keys`).
        completions: completions of queues of that tag whose own keys are homed there, with
            no namespace-wide writes (:func:`homeless` is ``False``).

    Returns:
        The stale completions (their delivery is no longer this consumer's): nothing of
        them was written.
    """
    entries, strings = encode_batch(completions, "s", home.record(""))
    if not entries:
        return []
    stale: Any = await conn.scripts.call(
        "complete",
        keys=[home.schedule, home.schedule_data, home.dead_letters],  # untouched: see homeless
        args=[
            home.prefix,
            GROUP,
            conn.dead_letter_cap,
            encode_entries(entries),
            conn.dead_letter_ttl,
            conn.dead_letter_max_bytes,
            NOTIFY_INLINE_MAX,
            consumer,
            "1",  # quiet: a record is announced only to a waiter (HomedKeys.waiter)
            "",  # a cluster: no PUBSUB NUMSUB
            *strings,  # from ARGV[STRINGS_AT]
        ],
    )
    if not stale:
        return []
    wanted = {(q.decode(), bytes(t)) for q, t in stale}
    return [c for c in completions if (c.queue, c.token or c.fence) in wanted]


class HomedRecords(SpreadRecords):
    """The records role with homed ids: a homed id's record and progress are read and
    written in its home, a wait on its record announces itself there.

    Args:
        conn: the store's connection, whose ``keys`` are :class:`HomedKeys`.
        kind: the store's write kind.
        held: the transport's check of held deliveries (see :class:`SpreadRecords`).
    """

    keys: HomedKeys

    def __init__(self, conn: RedisConnection, kind: str, held: Held) -> None:
        super().__init__(conn, kind, held)
        self.announce = self.announce_wait  # a wait on a homed record announces itself

    @translate_errors
    async def announce_wait(self, task_id: str, seconds: float) -> None:
        """Mark in its home that this process waits ``seconds`` on ``task_id``'s record, so
        that its completion publishes it (a homed completion publishes a record only to an
        announced waiter: ``complete.lua``, ARGV[9]). Nothing for an unhomed id."""
        keys = self.keys
        if keys.home(task_id) != keys.prefix:
            wait = max(1, int(min(seconds, ANNOUNCE_MAX) * 1000) + 1000)
            await self.client.set(keys.waiter(task_id), b"1", px=wait)

    async def keep_running(self, task_ids: Sequence[str], ttl: int) -> int:
        """See :meth:`.RedisRecords.keep_running`: one call per home."""
        kept = 0
        for group in _by_home(self.keys, task_ids).values():
            kept += await super().keep_running(group, ttl)
        return kept

    async def get_records(self, task_ids: Sequence[str]) -> list[bytes | None]:
        """See :meth:`.RedisRecords.get_records`: one read per home, in ``task_ids``' order."""
        found: dict[str, bytes | None] = {}
        for group in _by_home(self.keys, task_ids).values():
            found.update(zip(group, await super().get_records(group), strict=True))
        return [found[task_id] for task_id in task_ids]

    @translate_errors
    async def reset_tasks(
        self, task_ids: Sequence[str], owners: Mapping[str, str] | None = None, ttl: int = 0
    ) -> None:
        """See :meth:`.RedisRecords.reset_tasks`: the records, progress, cancel marks and
        owner marks of each home (one MULTI/EXEC per home), then the namespace's cancel
        marks."""
        keys = self.keys
        for home, group in _by_home(keys, task_ids).items():
            at = keys.home_keys(home)
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.execute_command(
                    "DEL", *(keys.record(i) for i in group), *(keys.progress(i) for i in group)
                )
                pipe.zrem(at.revoked, *group)
                for i in group:
                    if owners and i in owners:
                        pipe.set(keys.owner(i), owners[i], ex=max(1, ttl))
                await pipe.execute()
        await self.client.zrem(keys.revoked, *task_ids)

    @translate_errors
    async def record_ids(self, limit: int) -> tuple[list[str], bool]:
        """See :meth:`.RedisRecords.record_ids`: the namespace's records, then the homed ones
        (SCAN ``{<ns>:q:*}:t:*``)."""
        ids, more = await super().record_ids(limit)
        if more:
            return ids, more
        pattern = glob_escape("{" + self.keys.namespace + ":q:") + "*" + glob_escape("}:" + _T)
        async for key in self.client.scan_iter(match=pattern + "*", count=1000):
            if len(ids) >= limit:
                return ids, True
            text = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
            ids.append(text.partition("}:" + _T)[2])
        return ids, False


class HomedControl(RedisControl):
    """The control role with homed ids: a homed task's cancel is written in its home too
    (:meth:`cancel`)."""

    keys: HomedKeys

    @translate_errors
    async def cancel(self, task_id: str, record: bytes, ttl: int, announce: bool = True) -> str:
        """See :meth:`.RedisControl.cancel`; a homed id in two steps (docs/architecture.md):
        the namespace's (``revoke.lua``: off the schedule, or marked and announced), then the
        home's (``cancel.lua`` there: its mark and the cancelled record unless it runs)."""
        keys = self.keys
        home = keys.home(task_id)
        if home == keys.prefix:
            return await super().cancel(task_id, record, ttl, announce)
        state = _state(await self.client.get(keys.record(task_id)))
        if state in FINAL:
            return "finished"
        now = repr(time.time())
        spaced = await self.scripts.call(
            "revoke",
            keys=[keys.schedule, keys.schedule_data, keys.revoked],
            args=[
                keys.prefix,
                task_id,
                now,
                ttl,
                "1" if state == "running" else "0",
                "1" if announce else "0",
            ],
        )
        at = keys.home_keys(home)
        answer = await self.scripts.call(
            "cancel",
            keys=[at.schedule, at.schedule_data, at.revoked, at.record(task_id)],
            args=[at.prefix, task_id, now, ttl, record, "1" if announce else "0"],
        )
        if spaced in (b"scheduled", "scheduled"):
            return "scheduled"
        return answer.decode() if isinstance(answer, bytes) else str(answer)


class HomedDeadLetters(RedisDeadLetters):
    """The dead-letter role with homed ids: a replay deletes a homed task's record in its
    home (:meth:`replay_dead_letter`)."""

    keys: HomedKeys

    async def replay_dead_letter(
        self,
        task_id: str,
        queue: str,
        message: bytes,
        kind: str = "",
        unique: tuple[str, float] | None = None,
        failed_at: float | None = None,
    ) -> bool | str:
        """See :meth:`.RedisDeadLetters.replay_dead_letter`; a homed id's record is deleted
        in its home first (the replay deletes ``{ns}``'s), so the task starts afresh."""
        if self.keys.home(task_id) != self.keys.prefix:
            await self._unlink(self.keys.record(task_id))
        return await super().replay_dead_letter(task_id, queue, message, kind, unique, failed_at)

    @translate_errors
    async def _unlink(self, key: str) -> None:
        """DEL one key."""
        await self.client.delete(key)


class HomedStateStore(SpreadStateStore):
    """The spread layout's state store with homed ids (see the module docstring): a homed
    id's record and progress are written and read in its home, everything else in ``{ns}``.
    Its own part is :meth:`complete`; the homed reads and writes of one role are that role's
    (:class:`HomedRecords`, :class:`HomedControl`, :class:`HomedDeadLetters`).

    Args:
        conn: the store's connection, whose ``keys`` are :class:`HomedKeys`.
        held: the transport's check of held deliveries (see :class:`SpreadStateStore`).
    """

    keys: HomedKeys

    def __init__(self, conn: RedisConnection, held: Held) -> None:
        super().__init__(conn, held)
        self.records = HomedRecords(conn, self.kind, held)
        self.control = HomedControl(conn, self.kind)
        self.dead_letter_box = HomedDeadLetters(conn, self.kind)

    def counts(self, completion: Completion) -> bool:
        """``False``: a homed id's record is written in its queue's slot, apart from
        ``{ns}:stats`` (another slot on a Redis Cluster), so its run is counted through the
        worker's registrations (see :meth:`StateStore.counts`)."""
        return False

    async def complete(self, completions: Sequence[Completion]) -> list[Completion]:
        """See :meth:`RedisStateStore.complete`: the namespace part first (everything but the
        records and progress of homed ids, one ``complete.lua`` call in ``{ns}``), then each
        home's part (those records and progress, one call per home). Tokens are not acked
        here (the pairing acks after both: hold, commit, ack).

        Returns:
            The stale completions of the namespace part (fenced ones, as the Redis store
            returns them).
        """
        keys = self.keys
        spaced: list[Completion] = []
        homes: dict[str, list[Completion]] = {}
        originals: dict[int, Completion] = {}
        for c in completions:
            home = keys.home(c.task_id)
            own = [op for op in c.ops if isinstance(op, Progress)]
            if home == keys.prefix or (c.record is None and not own):
                spaced.append(c)
                continue
            homes.setdefault(home, []).append(
                Completion(
                    c.queue, None, c.task_id, c.record, c.record_ttl, ops=tuple(own), nonce=c.nonce
                )
            )
            rest = replace(c, record=None, ops=tuple(op for op in c.ops if op not in own))
            if _writes(rest):
                originals[id(rest)] = c
                spaced.append(rest)
        stale = await super().complete(spaced) if spaced else []
        for home, parts in homes.items():
            # No token in these parts (the pairing acks): the consumer name fences nothing.
            await complete_in(self.conn, "", keys.home_keys(home), parts)
        return [originals.get(id(c), c) for c in stale]


def _by_home(keys: HomedKeys, task_ids: Sequence[str]) -> dict[str, list[str]]:
    """``task_ids`` grouped by home (in their order within a group)."""
    groups: dict[str, list[str]] = {}
    home = keys.home
    for task_id in task_ids:
        groups.setdefault(home(task_id), []).append(task_id)
    return groups


#: Record states no cancel changes (``cancel.lua``'s "finished").
FINAL = frozenset({"succeeded", "failed", "dead_lettered", "cancelled", "expired"})


def _state(raw: bytes | None) -> Any:
    """The ``state`` of a stored record (``None``: none, or unreadable)."""
    if raw is None:
        return None
    try:
        record = msgspec.msgpack.decode(raw)
    except msgspec.DecodeError:
        return None
    return record.get("state") if isinstance(record, dict) else None


def _writes(c: Completion) -> bool:
    """Whether ``c`` still writes or acks anything."""
    return bool(
        c.token is not None
        or c.fence is not None
        or c.record is not None
        or c.reschedule is not None
        or c.dead_letter is not None
        or c.requeue is not None
        or c.ops
    )
