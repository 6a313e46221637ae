"""Messages naming a task this worker does not know: left for a worker that does.

During a rolling deploy, new producers enqueue a task that the old workers still running
do not have. Such a worker must not dead-letter the message at once: it puts it back on the
schedule (not spending an attempt: the message's ``attempt`` is unchanged) so that the
promoter returns it to its queue, where a worker that knows the task can take it. It does so
for ``unknown_task_grace`` seconds (a :class:`~blitzq.worker.Worker` option, default 300),
measured from the message's ``created_at`` (its first enqueue; a replayed dead letter starts
a fresh grace). Past the grace the message is dead-lettered with reason ``"unknown task"``.

The delay before each return grows with the message's age: half its age, at least
:data:`MIN_DELAY` and at most :data:`MAX_DELAY` seconds, with +-20 % jitter, and never past
the end of the grace (so the last check happens when the grace ends). A fresh message thus
comes back after about 1 s, one that has waited a minute after about 30 s.
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

import msgspec

from ..broker import Completion, Delivery
from ..serialization import Envelope, encode_envelope
from .limiter import Slots

if TYPE_CHECKING:
    from .runner import Runner

logger = logging.getLogger("blitzq.worker")

#: Shortest and longest wait (seconds) before an unknown task comes back to its queue.
MIN_DELAY = 1.0
MAX_DELAY = 30.0


def defer_delay(age: float, grace: float) -> float:
    """Seconds to wait before an unknown task ``age`` seconds old comes back, within
    ``grace`` (both in seconds): see the module docstring (jitter included)."""
    delay = min(MAX_DELAY, max(MIN_DELAY, age / 2)) * random.uniform(0.8, 1.2)
    return max(0.05, min(delay, grace - age))


def unknown_task(runner: Runner, d: Delivery, env: Envelope, slots: Slots) -> None:
    """Defer ``env`` (a delivery holding one slot of ``slots``) for a worker that knows its
    task, or dead-letter it once the worker's ``unknown_task_grace`` has passed."""
    from .admission import reject

    grace = runner.worker.unknown_task_grace
    now = time.time()
    age = max(0.0, now - env.created_at)
    error = f"no task named {env.task!r} is registered in this worker"
    if age >= grace:
        if grace > 0:
            error += f" (nor in any worker that took it within {grace:g} s)"
        reject(runner, d, "unknown task", error, slots, env.id, env.task)
        return
    delay = defer_delay(age, grace)
    logger.warning(
        "task %s (%s) is unknown here: back on the schedule in %.1f s for a worker that "
        "knows it (dead-lettered %.0f s after its enqueue)",
        env.id, env.task, delay, grace,
    )  # fmt: skip
    again = msgspec.structs.replace(env, enqueued_at=now)
    data = encode_envelope(again, max(runner.max_message_size, len(d.payload) * 2))
    runner.flusher.add(Completion(d.queue, d.token, env.id, reschedule=data, delay=delay))
    slots.release()
