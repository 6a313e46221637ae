"""The operator side of a :class:`~blitzq.Queue`: dead letters (list, count, replay, purge),
purging a queue, and stats.

An :class:`Admin` belongs to one Queue and uses its broker of the running event loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import msgspec

from ..dead_letters import DeadLetter
from ..exceptions import SerializationError
from ..extensions.unique import DEFAULT_UNIQUE_TTL, broker_key
from ..routing import check_name
from ..serialization import decode_envelope, encode_envelope
from ..task import TaskHandle
from . import testmode

if TYPE_CHECKING:
    from ..queue import Queue


class Admin:
    """Dead letters, purges and stats of one Queue.

    Args:
        queue: the Queue whose broker and settings it uses.
    """

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    # ----------------------------------------------------------- dead letters
    async def dead_letters(self, limit: int = 100, offset: int = 0) -> list[DeadLetter]:
        """Dead letters, newest first.

        Args:
            limit: most entries to return.
            offset: entries to skip.
        """
        rows = await self.queue.broker.dead_letters(offset, limit)
        return [
            DeadLetter.from_fields(
                task_id, f.message, f.reason, f.error, f.task, f.queue, f.failed_at, f.kind
            )
            for task_id, f in rows
        ]

    async def dead_letter_count(self) -> int:
        """Number of stored dead letters."""
        return await self.queue.broker.dead_letter_count()

    async def retry(self, task_id: str) -> TaskHandle[Any] | None:
        """Replay a dead letter: atomically remove it and publish it again with fresh attempts.

        The message goes back where it came from: the same queue, in the mode it was
        dead-lettered in (a fast-mode list or a reliable-mode stream), whatever this Queue's
        mode; a dead letter stored before blitzq recorded its mode goes to this Queue's mode.
        A unique task claims its unique key again, for the task's ``unique_ttl`` (the default
        one when the task is not registered here); while another task holds the key, nothing
        is replayed and the dead letter stays.

        Returns:
            A handle to the replayed task; a handle with ``duplicate=True`` naming the task
            that holds the unique key (nothing replayed); or ``None`` when no such dead
            letter exists (or a concurrent replay took it first).

        Raises:
            SerializationError: the dead letter's message is malformed and cannot be replayed.
            MessageTooLarge: the message is over this Queue's ``max_message_size`` (bytes);
                the dead letter stays.
        """
        owner = self.queue
        broker = owner.broker
        fields = await broker.get_dead_letter(task_id)
        if fields is None:
            return None
        if fields.reason == "unreadable entry" and not fields.message:  # its key is no hash
            raise SerializationError(f"dead letter {task_id} is unreadable: {fields.error}")
        env = decode_envelope(fields.message)
        queue = fields.queue or env.queue
        now = time.time()
        # Every field is kept (unique key, max_age, workflow metadata, …) but the attempts,
        # which start over, and the age: a replay would otherwise expire again at once.
        replayed = msgspec.structs.replace(
            env, queue=queue, attempt=1, created_at=now, enqueued_at=now, reserved=False
        )
        data = encode_envelope(replayed, owner.max_message_size)
        unique = None
        if env.unique_key is not None:
            task = owner.tasks.get(env.task)
            ttl = task.controls.unique_ttl if task is not None else DEFAULT_UNIQUE_TTL
            unique = (broker_key(env), ttl)
        outcome = await broker.replay_dead_letter(task_id, queue, data, fields.kind, unique)
        if outcome is False:
            return None
        if testmode.after_enqueue is not None:
            await testmode.after_enqueue(owner)
        if isinstance(outcome, str):
            return TaskHandle(owner, outcome, queue, env.task, duplicate=True)
        return TaskHandle(owner, env.id, queue, env.task)

    async def purge_dead_letters(self) -> int:
        """Delete every dead letter; return how many."""
        return await self.queue.broker.purge_dead_letters()

    # ----------------------------------------------------------------- queues
    async def purge_queue(self, queue: str | None = None) -> int:
        """Delete the messages waiting in ``queue`` (default: this Queue's ``name``).

        Messages already taken by a worker are not touched. Returns how many were deleted.
        """
        name = check_name("queue name", queue or self.queue.name)
        return await self.queue.broker.purge_queue(name)

    async def stats(self, queues: Iterable[str] | None = None) -> dict[str, Any]:
        """Queue depths, schedule size, dead letters and live workers.

        Returns:
            ``{"queues": {name: {"waiting": n, "in_flight": n}}, "scheduled": n,
            "dead_letters": n, "workers": n, "stale_completions": n}``; the last counts the
            completions ever refused by fencing in this namespace (a worker that lost its
            lease, see docs/guarantees.md).
        """
        broker = self.queue.broker
        names = sorted(set(queues) if queues is not None else set(await broker.known_queues()))
        per_queue = await broker.queue_stats(names) if names else {}
        if queues is None:  # empty priority levels are noise in an overview
            per_queue = {
                q: counts
                for q, counts in per_queue.items()
                if any(counts.values()) or not q.endswith((":high", ":low"))
            }
        return {
            "queues": per_queue,
            "scheduled": await broker.scheduled_count(),
            "dead_letters": await broker.dead_letter_count(),
            "workers": len(await broker.workers()),
            "stale_completions": (await broker.counters()).get("stale_completions", 0),
        }


__all__ = ["Admin"]
