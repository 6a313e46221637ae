"""The Redis state store's dead letters: list, read, count, replay and purge.

A dead letter is a hash ``{ns}:dead:<task id>`` indexed by the sorted set ``{ns}:dead`` (by
time); the cap, TTL and byte bound are applied by the scripts that write and trim them.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.exceptions import ResponseError

from ...limits import CHUNK_ITEMS, CHUNK_WRITES
from .. import DeadLetterFields
from ..state import DeadLetterState
from .client import translate_errors
from .connection import RedisPart
from .replicas import enqueuing

#: ``reason`` of a dead-letter entry whose key holds another type than a hash.
UNREADABLE_DEAD_LETTER = "unreadable entry"


def _unreadable_dead_letter() -> DeadLetterFields:
    """The fields shown for a dead-letter entry whose key is not a hash (reading it gave
    ``WRONGTYPE``): marked :data:`UNREADABLE_DEAD_LETTER`, with an empty message."""
    return DeadLetterFields(
        message=b"",
        reason=UNREADABLE_DEAD_LETTER,
        error="the dead-letter key is not a hash (planted or damaged); purge it",
        task="",
        queue="",
        failed_at=0.0,
        kind="",
    )


class RedisDeadLetters(RedisPart, DeadLetterState):
    """Dead letters (the ``dead_letter_box`` role of :class:`~.store.RedisStateStore`).

    Args:
        conn: the store's connection (its dead-letter cap, TTL and byte bound).
        kind: the store's write kind: a replay in outbox mode (``"o"``) goes to the queue's
            outbox.
    """

    @staticmethod
    def _dead_letter_fields(raw: dict[bytes, bytes]) -> DeadLetterFields | None:
        if not raw:
            return None
        try:  # a planted or damaged entry must not break listing the others
            failed_at = float(raw.get(b"failed_at", b"0") or 0)
        except ValueError:
            failed_at = 0.0
        return DeadLetterFields(
            message=raw.get(b"message", b""),
            reason=raw.get(b"reason", b"").decode(errors="replace"),
            error=raw.get(b"error", b"").decode(errors="replace"),
            task=raw.get(b"task", b"").decode(errors="replace"),
            queue=raw.get(b"queue", b"").decode(errors="replace"),
            failed_at=failed_at,
            kind=raw.get(b"kind", b"").decode(errors="replace"),
        )

    @translate_errors
    async def dead_letters(self, offset: int, limit: int) -> list[tuple[str, DeadLetterFields]]:
        """Dead letters, newest first (those past their retention TTL are gone).

        Read in chunks of :data:`~blitzq.limits.CHUNK_ITEMS` ids (one range read and one
        pipeline of reads each), so no single call's reply grows with ``limit``.
        """
        out: list[tuple[str, DeadLetterFields]] = []
        position, end = offset, offset + max(0, limit)
        while position < end:
            count = min(CHUNK_ITEMS, end - position)
            ids = await self.client.zrevrange(
                self.keys.dead_letters, position, position + count - 1
            )
            if not ids:
                break
            async with self.client.pipeline(transaction=False) as pipe:
                for raw_id in ids:
                    pipe.hgetall(self.keys.dead_letter(raw_id.decode(errors="replace")))
                # An entry of the wrong type (a planted or damaged key) is marked, not fatal.
                rows = await pipe.execute(raise_on_error=False)
            for raw_id, row in zip(ids, rows, strict=True):
                if isinstance(row, ResponseError) and "WRONGTYPE" not in str(row):
                    raise row
                fields = (
                    _unreadable_dead_letter()
                    if isinstance(row, ResponseError)
                    else self._dead_letter_fields(row)
                )
                if fields is not None:  # None: expired meanwhile
                    out.append((raw_id.decode(errors="replace"), fields))
            position += len(ids)
            if len(ids) < count:
                break
        return out

    @translate_errors
    async def get_dead_letter(self, task_id: str) -> DeadLetterFields | None:
        """One dead letter, or ``None``; an entry whose key is not a hash (planted or damaged)
        comes back marked ``reason="unreadable entry"`` with an empty message."""
        try:
            raw = await self.client.hgetall(self.keys.dead_letter(task_id))
        except ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            return _unreadable_dead_letter()
        return self._dead_letter_fields(raw)

    @translate_errors
    async def dead_letter_count(self) -> int:
        """Number of stored dead letters (expired ones are dropped first, one script)."""
        keys = self.keys
        left = await self.scripts.call(
            "trim_dead",
            keys=[keys.dead_letters],
            args=[keys.prefix, self.dead_letter_cap, self.dead_letter_max_bytes],
        )
        return int(left)

    @translate_errors
    @enqueuing
    async def replay_dead_letter(
        self,
        task_id: str,
        queue: str,
        message: bytes,
        kind: str = "",
        unique: tuple[str, float] | None = None,
        failed_at: float | None = None,
    ) -> bool | str:
        """Atomically remove the dead letter and publish ``message`` (compare-and-delete) to
        the stream (``kind`` "s") or list ("l", ``""``: this broker's mode) of ``queue`` (a
        store in outbox mode: to its outbox, whatever ``kind`` says),
        claiming the ``unique`` key in the same script, only while it is the one that failed
        at ``failed_at``; see :meth:`DeadLetterState.replay_dead_letter`.
        """
        key, ttl = unique if unique is not None else ("", 0.0)
        done = await self.scripts.call(
            "replay",
            keys=[self.keys.dead_letters],
            args=[
                self.keys.prefix,
                task_id,
                kind if kind in ("s", "l") and self.kind != "o" else self.kind,
                queue,
                message,
                key,
                max(1, int(ttl * 1000)),
                "" if failed_at is None else repr(float(failed_at)),
            ],
        )
        if isinstance(done, bytes | str):
            return done.decode() if isinstance(done, bytes) else done
        return bool(done)

    @translate_errors
    async def purge_dead_letters(self) -> int:
        """Delete every dead letter, :data:`~blitzq.limits.CHUNK_WRITES` per script call.

        Returns how many were deleted (those added meanwhile may be deleted too).
        """
        keys = self.keys
        stored = int(await self.client.zcard(keys.dead_letters))
        removed = 0
        while removed < stored:
            n = int(
                await self.scripts.call(
                    "purge_dead", keys=[keys.dead_letters], args=[keys.prefix, CHUNK_WRITES]
                )
            )
            if n == 0:
                break
            removed += n
        return removed

    @translate_errors
    async def delete_dead_letters(self, task_ids: Sequence[str]) -> int:
        """Delete the dead letters of ``task_ids``, :data:`~blitzq.limits.CHUNK_WRITES` per
        script call (``lua/drop_dead.lua``); return how many were still there."""
        keys = self.keys
        removed = 0
        for start in range(0, len(task_ids), CHUNK_WRITES):
            chunk = list(task_ids[start : start + CHUNK_WRITES])
            removed += int(
                await self.scripts.call(
                    "drop_dead", keys=[keys.dead_letters], args=[keys.prefix, *chunk]
                )
            )
        return removed
