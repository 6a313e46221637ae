"""The Redis state store's browse role: what the dashboard lists and charts.

- ``{ns}:ended:<queue>`` and ``{ns}:endnotes:<queue>``: the tasks that ended from a queue
  (written by the workers once a second, ``recent.lua``, or with a completion,
  ``complete.lua``'s ``"I"`` entries). Each write of a queue's notes is one small member
  ``<n>:<token>`` of the sorted set, scored by the write's time, and one field of the hash
  holding its notes packed (:func:`pack_notes`: at most :data:`NOTES_PER_ENTRY` a member):
  the server adds, trims and expires a member per write, and the notes' bytes never enter
  a script (Lua hashes every byte of a string it is given). Read newest first: the members
  of each queue until they hold enough notes, then their notes (HMGET), unpacked here
  (:func:`unpack_notes`). ``{ns}:recent:<queue>``, the earlier layout (a member per task),
  is read beside them while it lives (no longer written: it expires ``result_ttl`` after
  its last write);
- ``{ns}:sched`` and ``{ns}:sched:m``: the schedule, a page soonest first;
- ``{ns}:s:<queue>`` / ``{ns}:l:<queue>``: a queue's messages, a page in the order taken;
- ``{ns}:series:<slot>``: each 10 s slot's counts and gauges added by the workers
  (:mod:`blitzq.worker.series`);
- ``{ns}:periodic:paused``: the paused periodic entries (``claim_periodic.lua`` skips them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from ..state.browse import BrowseState
from .client import translate_errors
from .connection import RedisPart

__all__ = ["INLINE_NOTES", "NOTES_PER_ENTRY", "RedisBrowse", "pack_notes", "unpack_notes"]

#: Most notes one member of ``{ns}:ended:<queue>`` holds: a page cut inside a member reads
#: its notes whole again (about 55 bytes a note); the script's work is per member.
NOTES_PER_ENTRY = 1000
#: Notes (characters) of a member that ``recent.lua`` is given itself; larger ones are
#: written beside the call (:meth:`RedisBrowse.add_ended`). Lua hashes every byte of a
#: string it is given (about 7 instructions a byte): below this, that costs the server less
#: than the separate write's commands.
INLINE_NOTES = 1024
#: Members of a queue's index read per round (small: ``<n>:<token>``).
_READ = 64


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def pack_notes(members: Sequence[str], now: float) -> list[str]:
    """The entries of the index of ended tasks that note ``members``
    (``"<state>\\n<task>\\n<id>"``, in the order they ended) at ``now`` (Unix seconds):
    ``[score, member, notes, score, member, notes, ...]``, one per :data:`NOTES_PER_ENTRY`
    notes: the score ``now`` in whole microseconds plus k for the k-th (a later chunk of one
    write lists as newer; an integer score is stored as one in a small sorted set, whose
    inserts then compare without parsing a decimal), the member ``"<n>:<token>"`` (n its
    notes, token 16 random hex digits), its notes joined by ``"\\n"``. Task names and ids
    hold no newline (:func:`~blitzq.routing.check_task_id`)."""
    out: list[str] = []
    micros = round(now * 1_000_000)
    for k, start in enumerate(range(0, len(members), NOTES_PER_ENTRY)):
        chunk = members[start : start + NOTES_PER_ENTRY]
        out += [str(micros + k), f"{len(chunk)}:{os.urandom(8).hex()}", "\n".join(chunk)]
    return out


def _micros(t: float) -> int:
    """The least whole number of microseconds ``s`` with ``s / 1e6 >= t`` (the reader's
    time of a score is ``s / 1e6``: a bound in seconds made exactly a bound on scores)."""
    s = math.floor(t * 1_000_000)
    while (s - 1) / 1_000_000 >= t:
        s -= 1
    while s / 1_000_000 < t:
        s += 1
    return s


def unpack_notes(notes: bytes | str | None) -> list[str]:
    """The notes of one member (its field of ``{ns}:endnotes:<queue>``, :func:`pack_notes`),
    newest first (``[]`` for ``None``: gone meanwhile)."""
    if not notes:
        return []
    parts = _text(notes).split("\n")
    out = ["\n".join(parts[i : i + 3]) for i in range(0, len(parts) - 2, 3)]
    out.reverse()
    return out


def _count(member: bytes | str) -> int:
    """The notes a member of the index holds (``0`` for the ``#`` count)."""
    head, sep, _ = _text(member).partition(":")
    return int(head) if sep and head.isdigit() else 0


class RedisBrowse(RedisPart, BrowseState):
    """The ``browse`` role of :class:`~.store.RedisStateStore` (module docstring).

    Args:
        conn: the store's connection.
    """

    @translate_errors
    async def ended_tasks(
        self, queues: Sequence[str], before: float | None, after: float | None, limit: int
    ) -> list[tuple[float, str, str]]:
        """See :meth:`BrowseState.ended_tasks`: per queue, the newest members of
        ``{ns}:ended:<queue>`` (pipelined ZREVRANGEBYSCOREs of 64) until they hold ``limit``
        notes or run out, and in the first round the newest ``limit`` of the earlier
        layout's ``{ns}:recent:<queue>``; then the members' notes (one pipelined HMGET per
        queue). The notes of one member share its time; rows sharing a time come in a fixed
        order (by queue as given, then the index's order, newest note first, then the
        earlier layout's)."""
        if not queues or limit <= 0:
            return []
        # The earlier layout's scores are seconds; the index's whole microseconds (> 0: its
        # '#' count is scored minus the notes held).
        top = "+inf" if before is None else f"({before!r}"
        bottom = "-inf" if after is None else repr(after)
        high = "+inf" if before is None else f"({_micros(before)}"
        low = "(0" if after is None or after <= 0 else str(_micros(after))
        # Per queue: its members read, newest first, with their times.
        members: dict[str, list[tuple[bytes, float]]] = {q: [] for q in queues}
        noted = dict.fromkeys(queues, 0)
        # Per queue still read: the upper bound, and the members read already at it (the
        # bound is inclusive after the first round: members may share a score).
        reading: dict[str, tuple[str, set[bytes]]] = {q: (high, set()) for q in queues}
        legacy: list[list[tuple[bytes, float]]] = []
        while reading:
            async with self.client.pipeline(transaction=False) as pipe:
                for q, (bound, seen) in reading.items():
                    pipe.zrevrangebyscore(
                        self.keys.ended(q), bound, low, 0, _READ + len(seen), withscores=True
                    )
                if not legacy:  # the first round
                    for q in queues:
                        pipe.zrevrangebyscore(
                            self.keys.recent(q), top, bottom, 0, limit, withscores=True
                        )
                answers = await pipe.execute()
            if not legacy:
                legacy = answers[len(reading) :]
            going: dict[str, tuple[str, set[bytes]]] = {}
            for (q, (bound, seen)), answer in zip(reading.items(), answers, strict=False):
                last, at_last = (int(bound), set(seen)) if seen else (None, set())
                for member, score in answer:
                    if member in seen or noted[q] >= limit:
                        continue
                    micros = int(score)
                    members[q].append((member, micros / 1_000_000))
                    noted[q] += _count(member)
                    if micros != last:
                        last, at_last = micros, set()
                    at_last.add(member)
                if last is not None and len(answer) >= _READ + len(seen) and noted[q] < limit:
                    going[q] = (str(last), at_last)
            reading = going
        # (time, queue's place, source: 0 this index / 1 the earlier layout, place, queue, note)
        rows: list[tuple[float, int, int, int, str, str]] = []
        async with self.client.pipeline(transaction=False) as pipe:
            for q in queues:
                if members[q]:
                    pipe.hmget(self.keys.ended_notes(q), [m for m, _ in members[q]])
            notes = iter(await pipe.execute())
        for i, q in enumerate(queues):
            if members[q]:
                k = 0
                for (_, at), packed in zip(members[q], next(notes), strict=True):
                    for note in unpack_notes(packed):
                        rows.append((at, i, 0, k, q, note))
                        k += 1
            rows += [
                (float(score), i, 1, k, q, _text(member))
                for k, (member, score) in enumerate(legacy[i])
            ]
        rows.sort(key=lambda r: (-r[0], r[1], r[2], r[3]))
        return [(at, q, note) for at, _, _, _, q, note in rows[:limit]]

    @translate_errors
    async def add_ended(
        self, queue: str, members: Sequence[str], now: float, cap: int, ttl: int
    ) -> None:
        """See :meth:`BrowseState.add_ended`: the notes packed (:func:`pack_notes`), and
        ``recent.lua`` adds their members and trims. Notes over :data:`INLINE_NOTES` bytes
        are written first, without the script (HSET, and an EXPIRE should the script refuse):
        a string given to the script costs the server a hash of every byte."""
        if not members:
            return
        entries = pack_notes(members, now)
        index, notes_key = self.keys.ended(queue), self.keys.ended_notes(queue)
        large = {
            entries[i + 1]: entries[i + 2]
            for i in range(0, len(entries), 3)
            if len(entries[i + 2]) > INLINE_NOTES
        }
        if large:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.hset(notes_key, mapping=large)
                pipe.expire(notes_key, ttl)
                await pipe.execute()
            for i in range(0, len(entries), 3):
                if entries[i + 1] in large:
                    entries[i + 2] = ""
        await self.scripts.call("recent", keys=[index, notes_key], args=[cap, ttl, *entries])

    @translate_errors
    async def scheduled_tasks(
        self, after: float | None, limit: int
    ) -> list[tuple[float, str, bytes]]:
        """See :meth:`BrowseState.scheduled_tasks` (a ZRANGEBYSCORE and an HMGET)."""
        low = "-inf" if after is None else f"({after!r}"
        ids = await self.client.zrangebyscore(
            self.keys.schedule, low, "+inf", start=0, num=limit, withscores=True
        )
        if not ids:
            return []
        names = [_text(m) for m, _ in ids]
        data = await self.client.hmget(self.keys.schedule_data, names)
        return [
            (float(due), name, d or b"") for (_, due), name, d in zip(ids, names, data, strict=True)
        ]

    @translate_errors
    async def waiting_messages(self, queue: str, offset: int, limit: int) -> list[bytes]:
        """See :meth:`BrowseState.waiting_messages`: a stream's entries (XRANGE) or a list's
        items (LRANGE), whichever the queue's key holds."""
        stream, lst = self.keys.stream(queue), self.keys.list(queue)
        if await self.client.exists(stream):
            entries = await self.client.xrange(stream, "-", "+", count=offset + limit)
            out = []
            for _, fields in entries[offset:]:
                message = fields.get(b"m")
                if message is not None:
                    out.append(bytes(message))
            return out
        items = await self.client.lrange(lst, offset, offset + limit - 1)
        return [bytes(i) for i in items]

    @translate_errors
    async def add_sample(
        self, slot: int, counts: Mapping[str, int], gauges: Mapping[str, int], ttl: int
    ) -> None:
        """See :meth:`BrowseState.add_sample` (one pipelined transaction)."""
        key = self.keys.series(slot)
        async with self.client.pipeline(transaction=True) as pipe:
            for name, n in counts.items():
                if n:
                    pipe.hincrby(key, name, n)
            if gauges:
                pipe.hset(key, mapping=dict(gauges))
            pipe.expire(key, ttl)
            await pipe.execute()

    @translate_errors
    async def samples(self, slots: Sequence[int]) -> list[dict[str, int]]:
        """See :meth:`BrowseState.samples` (one pipelined HGETALL per slot)."""
        async with self.client.pipeline(transaction=False) as pipe:
            for slot in slots:
                pipe.hgetall(self.keys.series(slot))
            answers = await pipe.execute()
        out = []
        for raw in answers:
            fields: dict[str, int] = {}
            for k, v in raw.items():
                try:
                    fields[_text(k)] = int(v)
                except ValueError:
                    continue
            out.append(fields)
        return out

    @translate_errors
    async def paused_periodic(self) -> set[str]:
        """See :meth:`BrowseState.paused_periodic` (one SMEMBERS)."""
        return {_text(m) for m in await self.client.smembers(self.keys.periodic_paused)}

    @translate_errors
    async def set_periodic_paused(self, name: str, paused: bool) -> bool:
        """See :meth:`BrowseState.set_periodic_paused` (SADD or SREM)."""
        key = self.keys.periodic_paused
        changed = await (self.client.sadd(key, name) if paused else self.client.srem(key, name))
        return bool(changed)
