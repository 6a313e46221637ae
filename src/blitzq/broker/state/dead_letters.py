"""The dead-letter role of the state seam: list, read, count, replay and purge dead letters.
Used by the admin client and the CLI (workers dead-letter through :meth:`StateStore.complete`).
:class:`DeadLetterLimits` is the bounds a store keeps them within, settable on a running
broker (``Broker.dead_letter_limits``).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Protocol

from ..values import DeadLetterFields

__all__ = ["DeadLetterLimits", "DeadLetterState"]


class DeadLetterLimits(Protocol):
    """The bounds of a store's dead letters, each settable while the broker runs.

    Attributes:
        cap: dead letters kept before the oldest are dropped.
        ttl: seconds a dead letter is kept.
        max_bytes: total bytes of dead letters kept before the oldest are dropped.
    """

    cap: int
    ttl: int
    max_bytes: int


class DeadLetterState(abc.ABC):
    """Dead letters (module docstring)."""

    @abc.abstractmethod
    async def dead_letters(self, offset: int, limit: int) -> list[tuple[str, DeadLetterFields]]:
        """Dead letters, newest first, as ``(task_id, fields)``."""

    @abc.abstractmethod
    async def get_dead_letter(self, task_id: str) -> DeadLetterFields | None:
        """One dead letter, or ``None``."""

    @abc.abstractmethod
    async def dead_letter_count(self) -> int:
        """Number of stored dead letters."""

    @abc.abstractmethod
    async def replay_dead_letter(
        self,
        task_id: str,
        queue: str,
        message: bytes,
        kind: str = "",
        unique: tuple[str, float] | None = None,
        failed_at: float | None = None,
    ) -> bool | str:
        """Atomically remove a dead letter and publish ``message`` to ``queue``.

        Args:
            task_id: the dead letter's task id.
            queue: physical queue to publish to.
            message: the encoded message.
            kind: ``"s"`` (stream) or ``"l"`` (list) to publish to; ``""``: the broker's own.
            unique: ``(unique key, ttl seconds)`` of a unique task: the key is claimed for
                ``task_id`` in the same atomic step, unless another task holds it.
            failed_at: the failure time (Unix seconds) of the dead letter the caller read;
                ``None``: whichever is stored. A dead letter of ``task_id`` stored since
                (replayed by another caller, failed again) is not the one read: it stays.

        Returns ``True`` when replayed; ``False`` (and publishes nothing) when the dead letter
        no longer exists or is not the one that failed at ``failed_at``, so concurrent
        replays of one dead letter publish it once; or the id (str) of another task holding
        the unique key, in which case nothing changed (the dead letter stays).
        """

    @abc.abstractmethod
    async def purge_dead_letters(self) -> int:
        """Delete all dead letters; return how many."""

    async def delete_dead_letters(self, task_ids: Sequence[str]) -> int:
        """Delete the dead letters of ``task_ids`` (a filtered purge); return how many
        existed."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete single dead letters")
