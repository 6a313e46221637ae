"""The encoding of a batch of completions for ``lua/complete.lua``.

:func:`encode_batch` turns the :class:`~blitzq.broker.values.Completion` values of a batch
(and their typed effects, encoded by :func:`~blitzq.broker.effects.encode_op`) into the entries
that travel as one MessagePack argument; :meth:`~.store.RedisStateStore.complete` sends
them in one script call. Building a handful of arguments per completion in redis-py cost
more than the whole server-side work; so does a Python call per record, which the ``"R"``
entry (a run of plain successes) avoids. The strings of an ``"R"`` entry (entry ids, then
each record key followed by its record: the pairs one ``MSET`` takes) travel as arguments of
their own after the fixed ones (from :data:`STRINGS_AT`): the server's Lua makes each
argument a string once, hashing every byte, where a string inside the MessagePack argument
would be made twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from ..effects import encode_op
from ..values import Completion
from .browse import pack_notes

__all__ = [
    "GUARD_TTL",
    "STRINGS_AT",
    "encode_batch",
    "encode_entries",
    "guard_unfenced",
    "runs_of",
]

#: The position (1-based, Lua's ``ARGV``) of the first of a batch's strings: ``complete.lua``
#: takes 10 arguments before them.
STRINGS_AT = 11

#: Seconds the guards of a batch stay marked applied (``{ns}:cg:<batch>``) when the batch's
#: first try failed: a later try of its completions (the worker's retry, or a try still
#: buffered in the server from a connection that timed out) within that time applies nothing.
#: The mark of a batch whose first try was answered is deleted by the next batch instead.
GUARD_TTL = 86400

_batch_encoder = msgspec.msgpack.Encoder()

#: The entries of a batch as the one MessagePack argument of ``complete.lua``.
encode_entries = _batch_encoder.encode


def _lua_bytes(data: bytes) -> msgspec.Raw:
    """``data`` as a MessagePack *str*: the ``cmsgpack`` in Redis/Valkey Lua rejects *bin*.

    Lua strings are byte strings, so the bytes arrive unchanged.
    """
    n = len(data)
    if n < 256:
        return msgspec.Raw(b"\xd9" + n.to_bytes(1, "big") + data)
    if n < 65536:
        return msgspec.Raw(b"\xda" + n.to_bytes(2, "big") + data)
    return msgspec.Raw(b"\xdb" + n.to_bytes(4, "big") + data)


_EMPTY = msgspec.Raw(b"\xa0")


def _lua_op(op: tuple[Any, ...]) -> list[Any]:
    """A completion op with its bytes items made Lua-readable (see :func:`_lua_bytes`)."""
    return [
        _lua_bytes(item)
        if isinstance(item, bytes)
        else _lua_op(item)
        if isinstance(item, tuple)
        else item
        for item in op
    ]


def guard_unfenced(completions: Sequence[Completion], kind: str) -> str | None:
    """Give a guard to each completion of ``completions`` that needs one and has none yet.

    A completion needs one when nothing fences it (a list completion, the outbox's, or one
    without a token or fence in a stream store: ``kind`` is the store's write kind) and it
    has effects a second application would repeat (a requeue, a reschedule, a dead letter,
    ops such as a workflow's next step): see *Idempotence* in
    :class:`~blitzq.broker.values.Completion`. The guards given now share one new batch id
    (one mark per batch, not per completion, while nothing is retried); a completion that
    already has one keeps it (a retry: its tries share it).

    Returns:
        The batch id of the guards given now, or ``None`` when none was given.
    """
    fresh: list[Completion] = []
    streams = kind == "s"
    for c in completions:
        if c.guard is not None or (
            c.requeue is None and c.reschedule is None and c.dead_letter is None and not c.ops
        ):
            continue
        if streams and (c.token is not None or c.fence is not None):
            continue
        fresh.append(c)
    if not fresh:
        return None
    batch, size = os.urandom(12).hex(), len(fresh)
    for index, c in enumerate(fresh):
        c.guard = (batch, index, size)
    return batch


def runs_of(tags: bytearray, fenced: bool) -> tuple[int, int, str]:
    """The runs an ``"R"`` or ``"A"`` entry ends (``complete.lua`` adds them to
    ``{ns}:stats`` ``processed`` / ``failed``, less its stale ones): the number that
    succeeded, that failed, and the tally of each (``tags``: ``b"0"`` none, ``b"1"``
    succeeded, ``b"2"`` failed, one byte per completion, in order), sent only when the entry
    can have stale completions (``fenced``: stream entries) and its completions differ (the
    script then subtracts the stale ones' own), else ``""``.
    """
    succeeded, failed = tags.count(49), tags.count(50)
    if not fenced or succeeded == len(tags) or failed == len(tags) or succeeded + failed == 0:
        return succeeded, failed, ""
    return succeeded, failed, tags.decode()


def encode_batch(
    completions: Sequence[Completion], kind: str, record_head: str, forget: Sequence[str] = ()
) -> tuple[list[Any], list[str | bytes]]:
    """The entries of ``completions`` for ``complete.lua``, in the batch's order, and the
    strings its ``"R"`` entries name (the script's arguments from :data:`STRINGS_AT`).

    Args:
        completions: the batch.
        kind: the store's write kind (``"s"``, ``"l"`` or ``"o"``): only with ``"s"`` are
            tokens stream entries that the script acks and fences.
        record_head: the record key of the empty id (``Keys.record("")`` of the script's
            prefix): an ``"R"`` entry names each record by its key, which the script would
            otherwise make by concatenation, one Lua string more a task.
        forget: batch ids of guards applied by a first try that was answered (no other try
            of them exists): a ``"G"`` entry deletes their marks.

    Returns:
        The entries and the strings. ``"R"`` entries (a run of completions of one queue and
        TTL that only ack and store a record, of generated ids: no ``nonce``; its entry ids,
        then its record keys each followed by its record, are in the strings, the entry gives
        where), ``"C"`` entries
        (any other completion), ``"A"`` entries (acks without a record, per queue) and
        ``"I"`` entries (the tasks that ended, per queue: their
        :attr:`~blitzq.broker.values.Completion.ended` notes, packed by
        :func:`~.browse.pack_notes`) and a ``"G"`` entry (the guards to forget); no entries
        when there is nothing to apply.
    """
    entries: list[Any] = []
    strings: list[str | bytes] = []

    def run_entry(queue: str, ttl: int, fenced: bool) -> tuple[Any, ...]:
        # {"R", queue, ttl, at, nids, n, succeeded, failed, tags[, "o"]}: ARGV[at...] the
        # ids (or fences), then each record key followed by its record (the pairs MSET takes).
        at = STRINGS_AT + len(strings)
        strings.extend(ids)
        pairs: list[str | bytes] = [b""] * (2 * len(recs))
        pairs[0::2] = [record_head + task_id for task_id in task_ids]
        pairs[1::2] = recs
        strings.extend(pairs)
        runs = runs_of(run_tags, bool(ids))  # outbox fences can be stale as entry ids can
        if fenced:
            return ("R", queue, ttl, at, len(ids), len(task_ids), *runs, "o")
        return ("R", queue, ttl, at, len(ids), len(task_ids), *runs)

    acks: dict[str, list[bytes]] = {}
    ack_tags: dict[str, bytearray] = {}
    # A run of consecutive completions that only ack and store a record (the common
    # success), of one queue and TTL: sent as one "R" entry, in its place in the batch
    # (a task's "running" record must not land after its final one). In the outbox's kind
    # ("o", RabbitMQ) a run's completions all have a fence (checked against the takes of
    # redeliveries), or none has.
    run_key: tuple[str, int, bool] | None = None
    ids: list[bytes] = []
    task_ids: list[str] = []
    recs: list[bytes] = []
    run_tags = bytearray()  # the tally of each, as "0" / "1" / "2" (see runs_of)
    seen: set[bytes] = set()
    # Only stream entries are acked (and fenced) here; a token of a list completion or of
    # a separate transport (acked by the facade afterwards) is not this store's to touch.
    streams = kind == "s"
    outbox = kind == "o"
    ended: dict[str, tuple[int, int, list[str]]] = {}
    for c in completions:
        if c.ended is not None:
            member, cap, ttl = c.ended
            ended.setdefault(c.queue, (cap, ttl, []))[2].append(member)
        if c.reschedule is None and c.dead_letter is None and c.requeue is None and not c.ops:
            token, record = c.token, c.record
            if not record:
                if token is not None and streams:
                    acks.setdefault(c.queue, []).append(token)
                    ack_tags.setdefault(c.queue, bytearray()).append(48 + c.tally)
                continue
            fence = c.fence if outbox else None
            if (
                (c.fence is None or outbox)
                and c.nonce is None
                and (token is not None or not streams)
            ):
                key = (c.queue, c.record_ttl, fence is not None)
                entry_id = token if token is not None and streams else fence
                # A second completion of one delivery starts a new entry, so that it is
                # found stale after the first acked and deleted it (as a "C" entry is).
                if key != run_key or (entry_id is not None and entry_id in seen):
                    if run_key is not None:
                        entries.append(run_entry(*run_key))
                    run_key, ids, task_ids, recs, seen = key, [], [], [], set()
                    run_tags = bytearray()
                if entry_id is not None:
                    ids.append(entry_id)
                    seen.add(entry_id)
                task_ids.append(c.task_id)
                recs.append(record)
                run_tags.append(48 + c.tally)
                continue
        if run_key is not None:
            entries.append(run_entry(*run_key))
            run_key = None
        d = c.dead_letter
        entries.append(
            (
                "C",
                kind,
                c.queue,
                _lua_bytes(c.token) if c.token and streams else _EMPTY,
                c.task_id,
                _lua_bytes(c.record) if c.record else _EMPTY,
                c.record_ttl,
                _lua_bytes(c.reschedule) if c.reschedule else _EMPTY,
                float(c.delay),
                (_lua_bytes(d.message), d.reason, d.error, d.task, d.queue, d.failed_at)
                if d
                else _EMPTY,
                _lua_bytes(c.requeue) if c.requeue else _EMPTY,
                [_lua_op(encode_op(op)) for op in c.ops] if c.ops else _EMPTY,
                _lua_bytes(c.fence) if c.fence else _EMPTY,
                *(c.guard or ("", 0, 0)),
                GUARD_TTL,
                c.nonce or "",
                c.tally,
            )
        )
    if run_key is not None:
        entries.append(run_entry(*run_key))
    for queue, tokens in acks.items():
        tags = runs_of(ack_tags[queue], True)
        entries.append(("A", queue, [t.decode() for t in tokens], *tags))
    if ended:
        now = time.time()
        for queue, (cap, ttl, members) in ended.items():
            entries.append(("I", queue, cap, ttl, pack_notes(members, now)))
    if forget and entries:
        entries.append(("G", list(forget)))
    return entries, strings
