"""What the client can tell about a task that has no final record yet: whether it waits on
the schedule (and until when), and why a result wait may have timed out.

Both read the state store only; :class:`~blitzq.client.reading.Results` offers them as
``inspect`` (the scheduled part) and as the hint of a :class:`~blitzq.ResultTimeout`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from typing import TYPE_CHECKING

from ..exceptions import BrokerError, ResultExpired, SerializationError
from ..records import TaskRecord, TaskState
from ..routing import base_queue
from ..serialization import decode_envelope, loads

if TYPE_CHECKING:
    from ..broker import Broker

#: Seconds a result wait waits before it first asks whether its task is still known
#: anywhere (:func:`end_if_gone`); the interval doubles up to :data:`TRACE_MAX`. A wait that
#: ends within seconds (nearly all) never asks; thousands of waits gathered at once ask far
#: apart and, at most :data:`TRACES_AT_ONCE` at a time per event loop, never starve the
#: connection pool of the work they wait for (a trace searches up to 1000 stream entries).
TRACE_FIRST = 15.0
TRACE_MAX = 120.0
TRACES_AT_ONCE = 2

_tracing: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)

#: Record states (or no record) of a task that may be waiting on the schedule.
_MAY_BE_SCHEDULED = frozenset({TaskState.SCHEDULED, TaskState.RETRYING, TaskState.QUEUED})


async def inspect(broker: Broker, task_id: str) -> TaskRecord | None:
    """The task's stored record, completed from the schedule when it waits there.

    Args:
        broker: the Queue's broker of the running loop.
        task_id: the task's id.

    Returns:
        The stored record (with ``due_at`` set when the task is on the schedule; a
        ``running`` one read as ``cancelling`` while the task has a cancel mark); for a task
        on the schedule without a record, a ``scheduled`` record made from its message (task
        name, queue, attempts so far, created time, ``due_at``); ``None`` when nothing is
        known of it.

    Raises:
        BrokerError: the server cannot be reached.
        SerializationError: the stored record is not a record.
    """
    data = await broker.get_record(task_id)
    record = TaskRecord.from_bytes(data) if data is not None else None
    if record is not None and record.state is TaskState.RUNNING:
        if (
            await broker.state.control.cancel_mark(task_id) is not None
        ):  # a cancel waits for the run's end
            return dataclasses.replace(record, state=TaskState.CANCELLING)
        return record
    if record is not None and record.state not in _MAY_BE_SCHEDULED:
        return record
    entry = await broker.scheduled_entry(task_id)
    if entry is None:
        return record
    due, queue, message = entry
    if record is not None:
        return dataclasses.replace(record, due_at=due)
    try:
        envelope = decode_envelope(message)
    except SerializationError:  # listed as scheduled all the same: it is on the schedule
        return TaskRecord(id=task_id, task="", queue=queue, state=TaskState.SCHEDULED, due_at=due)
    return TaskRecord(
        id=task_id,
        task=envelope.task,
        queue=queue,
        state=TaskState.SCHEDULED,
        attempts=envelope.attempt - 1,
        enqueued_at=envelope.created_at,
        due_at=due,
    )


async def why_no_result(
    broker: Broker, namespace: str, task_id: str, queue: str | None, url: str | None = None
) -> str:
    """A hint for a result wait that timed out without any record, or ``""``.

    Args:
        broker: the Queue's broker of the running loop.
        namespace: the Queue's namespace (named in the hint).
        task_id: the task waited for.
        queue: its physical queue when the caller knows it (a handle does), else ``None``.
        url: the Queue's broker URL, when known: an embedded server's socket makes the "no
            worker" hint name its data directory (a worker started in another directory
            runs on a server of its own).

    Returns:
        ``""`` or a clause starting with ``"; "``: the task is on the schedule (due in N s);
        no worker runs in the namespace at all; or none of the live workers consumes the
        task's queue -- the usual reasons a first task "never runs". A failure to read the
        state store gives no hint (the timeout stands on its own).
    """
    try:
        entry = await broker.scheduled_entry(task_id)
        if entry is not None:
            wait = entry[0] - await broker.server_time()
            due = f"; it is scheduled, due in {wait:.1f} s" if wait > 0 else "; it is due"
            return due + await unknown_task_note(broker, entry[2], entry[1])
        workers = await broker.workers()
    except BrokerError:
        return ""
    if not workers:
        return (
            f"; no worker is running in namespace {namespace!r}: start one, e.g. "
            "`blitzq worker MODULE:QUEUE_OBJECT`" + _embedded_note(url)
        )
    if queue is None:
        return ""
    wanted = base_queue(queue)
    if _consumers(workers, wanted):
        return ""
    return (
        f"; no live worker consumes queue {wanted!r} in namespace {namespace!r} "
        f"({len(workers)} worker(s) run other queues: start one with -Q {wanted})"
    )


def _embedded_note(url: str | None) -> str:
    """For the URL of an embedded server's socket, a sentence naming its data directory
    (``""`` for any other URL): each directory's ``.blitzq`` is a server of its own."""
    if url is None or not url.startswith("unix://"):
        return ""
    from ..broker.redis.embedded import find_data_dir, socket_path_for
    from ..broker.redis.server_proc import socket_url

    data_dir = find_data_dir()
    if data_dir is None or socket_url(socket_path_for(data_dir)) != url:
        return ""
    return (
        f" on this producer's embedded server ({data_dir}); a worker started in another "
        "directory runs on an embedded server of its own: run it from this directory, or "
        "give both the same redis_url (or BLITZQ_DATA_DIR)"
    )


def _consumers(workers: dict[str, bytes], wanted: str) -> list[dict[str, object]]:
    """The registrations in ``workers`` (raw, by worker id) of the workers that consume
    base queue ``wanted``; unreadable ones are left out."""
    found = []
    for raw in workers.values():
        try:
            info = loads(raw)
        except SerializationError:
            continue
        if isinstance(info, dict) and wanted in (info.get("queues") or ()):
            found.append(info)
    return found


async def unknown_task_note(broker: Broker, message: bytes, queue: str) -> str:
    """Why a scheduled message may never run: no live worker that consumes its queue knows
    its task's name (each one that takes it puts it back on the schedule for a worker that
    knows it, and dead-letters it ``unknown_task_grace`` seconds after its first enqueue:
    see :mod:`blitzq.worker.unknown`).

    Args:
        broker: the Queue's broker of the running loop.
        message: the scheduled message (an encoded envelope).
        queue: the physical queue it goes to when due.

    Returns:
        ``""`` (the message cannot be decoded, no live worker consumes the queue, one of them
        knows the task, or one registered without its task names) or a clause starting with
        ``"; "`` naming the task.

    Raises:
        BrokerError: the server cannot be reached.
    """
    try:
        task = decode_envelope(message).task
    except SerializationError:
        return ""
    wanted = base_queue(queue)
    consumers = _consumers(await broker.workers(), wanted)
    if not consumers:
        return ""
    for info in consumers:
        names = info.get("tasks")
        if not isinstance(names, list) or task in names:
            return ""
    return (
        f"; no live worker that consumes queue {wanted!r} knows a task named {task!r} "
        f"({len(consumers)} worker(s)): a worker puts such a message back on the schedule "
        "for a worker that knows it, and dead-letters it ('unknown task') "
        "unknown_task_grace (default 300 s) after its enqueue; check the task's name"
    )


async def end_if_gone(
    broker: Broker,
    task_id: str,
    queue: str,
    seen: TaskRecord | None,
    result_ttl: int,
    age: float | None = None,
) -> None:
    """End a result wait that found no record when its task is known nowhere any more:
    ``broker.state.records.trace_task`` (one atomic look: no record, not on the schedule, no
    message in its physical ``queue``) says ``False``. A wait asks it only of a task known to exist
    (sent by the caller, or ``seen``: the last record the wait read), every
    :data:`TRACE_FIRST` s doubling to :data:`TRACE_MAX` s, :data:`TRACES_AT_ONCE` at a time
    per event loop; a store that cannot tell
    (``None``) or cannot be reached ends nothing: the wait goes on to its timeout.

    ``age``: seconds since the caller sent the task, when it did (``None``: unknown).

    Raises:
        ResultExpired: the task is known nowhere; the message names ``result_ttl`` (s), and
            for a task sent less than ``result_ttl`` ago says that the server lost its data,
            the task was purged (a record lives ``result_ttl`` from its write, after the
            send), or a fast-mode task was lost with its worker.
    """
    loop = asyncio.get_running_loop()
    gate = _tracing.get(loop)
    if gate is None:
        gate = _tracing[loop] = asyncio.Semaphore(TRACES_AT_ONCE)
    try:
        async with gate:
            known = await broker.state.records.trace_task(task_id, queue)
    except BrokerError:
        return
    if known is not False:
        return
    before = f" (it was {seen.state.value} when this wait read it)" if seen is not None else ""
    if age is not None and age < result_ttl:
        why = (
            f"it was sent {age:.1f} s ago, less than result_ttl ({result_ttl} s), so its "
            "record did not expire: the server lost its data (a restart without persistence, "
            "a flush, an eviction under its maxmemory-policy), or an operator purged it "
            "(queue purge), unless the workers keep records for a shorter result_ttl; or, "
            "for a fast-mode task (at most once), the worker running it died before "
            "writing its record"
        )
    else:
        why = f"records expire result_ttl ({result_ttl} s) after they are written"
    raise ResultExpired(
        task_id,
        f"no result can arrive for task {task_id}: its record is gone{before} and it is "
        f"neither scheduled nor in queue {queue!r}; {why}",
    )
