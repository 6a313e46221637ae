"""Unique tasks: a call equal to one still pending is not enqueued twice.

``@queue.task(unique=True)`` gives each call a key: the SHA-256 of the MessagePack encoding
of ``[task name, args, sorted kwargs]`` (as :mod:`blitzq.serialization` encodes them, each
dict's keys sorted), or the
per-call ``task.options(unique_key="...")``. At enqueue the queue's filter
(:func:`unique_filter`) gives each message its key; the producer then claims the keys of the
batch and writes the messages it claimed in one atomic broker step per batch chunk
(``SET NX`` per key and the message's write together,
:meth:`~blitzq.broker.state.ControlState.enqueue_unique`), so a claim never stands without
its message: an enqueue whose reply was lost left both or neither, and its retry either
enqueues the task or is the duplicate of a task that really is queued. A claimed key holds
the new task's id; a call whose key is already held publishes nothing and its handle points
at the holder (``handle.duplicate is True``); a key held by the call's own id (a retry with
the same ``task_id=``) writes nothing again and is not a duplicate.

The key is freed (only while it still holds this task's id):

- ``unique_until="start"``: by a start check, as the task starts (after its lock, if any);
- ``unique_until="completion"``: by a finisher, atomically with the ack of the final
  completion (succeeded, failed, dead-lettered, cancelled, expired);
- in any case after ``unique_ttl`` seconds (plus the delay of a delayed call), so a crashed
  worker or a lost message never keeps it forever.

The options are declared by the built-in middleware :class:`Unique`.
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from ..broker import Completion
from ..broker.effects import UniqueRelease
from ..exceptions import ConfigurationError
from ..options import Option, positive_seconds
from ..serialization import dumps, encode_envelope
from .middleware import Middleware

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ..options import TaskOptions
    from ..seams import QueueSettings
    from ..serialization import Envelope
    from ..task import Task
    from ..worker.execution import Job
    from .middleware import Outgoing, WorkerContext

#: Default seconds a unique key is held at most (a crashed run cannot keep it longer).
DEFAULT_UNIQUE_TTL = 3600.0


def _until(label: str, value: Any) -> str:
    if value not in ("start", "completion"):
        raise ConfigurationError(f"{label} must be 'start' or 'completion', got {value!r}")
    return str(value)


def _ttl(label: str, value: Any) -> float:
    return positive_seconds(label, value) or DEFAULT_UNIQUE_TTL


class Unique(Middleware):
    """Built-in middleware of the ``unique``, ``unique_until`` and ``unique_ttl`` options
    (see the module docstring)."""

    task_options: ClassVar[Mapping[str, Option]] = {
        "unique": Option(False, lambda label, value: bool(value)),
        "unique_until": Option("completion", _until),
        "unique_ttl": Option(DEFAULT_UNIQUE_TTL, _ttl),
    }

    def setup_task(self, task: Task[Any, Any], options: TaskOptions) -> None:
        """Add the key's release (at start or with the final completion) to a unique task,
        and the claiming enqueue filter to its queue (once)."""
        if not options.get("unique"):
            return
        if options.get("unique_until") == "start":
            task.checks.append(release_at_start)
        task.finishers.append(release_when_final)
        filters = task.owner.enqueue_filters
        if unique_filter not in filters:
            filters.append(unique_filter)


def canonical_key(name: str, args: list[Any], kwargs: dict[str, Any]) -> str:
    """SHA-256 hex digest of ``[name, args, sorted kwargs]`` in blitzq's MessagePack, every
    dict's keys in sorted order: equal calls have one key, whatever order a dict argument's
    keys were inserted in (``{"a": 1, "b": 2}`` and ``{"b": 2, "a": 1}``).

    Raises:
        SerializationError: an argument is not plain data.
    """
    call = [name, list(args), sorted(kwargs.items())]
    return hashlib.sha256(dumps(call, sort_keys=True)).hexdigest()


def broker_key(env: Envelope) -> str:
    """The broker-side unique key of a message: ``<task>:<unique key>``."""
    return f"{env.task}:{env.unique_key}"


async def unique_filter(queue: QueueSettings, batch: list[Outgoing]) -> None:
    """Enqueue filter: give each message of a unique task its key (``Outgoing.unique``).

    Nothing is claimed here: the producer claims the keys and writes the messages in one
    broker step (``Broker.enqueue_unique``) once every filter has seen the batch, so no
    claim stands for a message that a later filter refused or that was never written.

    Raises:
        ConfigurationError: a ``unique_key`` for a task not registered with ``unique=True``.
        SerializationError: an argument is not plain data (the key is a digest of them).
    """
    now = time.time()
    for out in batch:
        env = out.envelope
        task = out.task
        if task is None or not task.controls.get("unique"):
            if env.unique_key is not None:
                raise ConfigurationError(
                    f"unique_key= needs a task registered with unique=True ({env.task})"
                )
            continue
        if env.unique_key is None:
            env = out.envelope = msgspec.structs.replace(
                env, unique_key=canonical_key(env.task, env.args, env.kwargs)
            )
            out.data = encode_envelope(env, queue.max_message_size)
        ttl: float = task.controls.get("unique_ttl")
        if out.due is not None:
            ttl += max(0.0, out.due - now)
        out.unique = (broker_key(env), ttl)


def _release_op(env: Envelope) -> UniqueRelease:
    return UniqueRelease(broker_key(env), env.id)


async def release_at_start(worker: WorkerContext, job: Job) -> Completion | None:
    """Start check of ``unique_until="start"``: free the key as the task starts.

    The release travels with the next group commit (no extra round trip here), fenced by
    the delivery: a worker that lost the lease frees nothing.
    """
    env, d = job.envelope, job.delivery
    if env.unique_key is not None:
        worker.write(Completion(d.queue, None, env.id, ops=(_release_op(env),), fence=d.token))
    return None


def release_when_final(
    job: Job, completion: Completion, final: bool, error: BaseException | None
) -> Completion:
    """Finisher: free the key atomically with the final completion of the task."""
    env = job.envelope
    if final and env.unique_key is not None:
        completion.ops = (*completion.ops, _release_op(env))
    return completion
