"""The dashboard's task list (:func:`list_tasks`): tasks by state, filtered, a page at a time.

Where each state comes from, and so what can be listed:

- **ended** (``succeeded``, ``failed``, ``dead_lettered``, ``cancelled``; ``recent`` is all
  of them): the index of ended tasks each queue keeps (``Queue(recent_index=10_000)``: the
  newest that many per physical queue, expiring ``result_ttl`` after the last write),
  written by the workers with each completion, whatever ``store_results`` and
  ``track_state`` say. With ``recent_index=0`` nothing ended is listed (a task is still
  found by its id on its page, while its record lives). Arguments show where a record
  keeps them (a failure, a dead letter, ``track_state``).
- **scheduled**: the schedule itself (delays, ``eta``, retries' backoff), soonest first.
- **queued**: the messages in each queue, in the order they are taken (a reliable-mode
  queue's include those a worker took and has not acknowledged yet).
- **running**: what the live workers register they run (their oldest 20 each).

Filters (queue, task name, id prefix or text in the arguments, a time range) are applied
while reading; one call reads at most :data:`SCAN` entries, and says so (``next`` still set)
when it stopped there before filling the page. Cursors are opaque strings.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..arg_preview import preview
from ..exceptions import ConfigurationError, SerializationError
from ..records import TaskRecord
from ..routing import base_queue, levels
from ..serialization import decode_envelope
from .data import workers_doc

if TYPE_CHECKING:
    from ..queue import Queue

__all__ = ["ENDED", "SCAN", "STATES", "TaskQuery", "list_tasks"]

#: The states a task list can be asked for.
STATES = (
    "recent",
    "queued",
    "scheduled",
    "running",
    "succeeded",
    "failed",
    "dead_lettered",
    "cancelled",
)
#: The states the index of ended tasks holds.
ENDED = frozenset({"succeeded", "failed", "dead_lettered", "cancelled"})
#: Most entries one listing reads to fill its page.
SCAN = 2000
_CHUNK = 200


@dataclass(frozen=True)
class TaskQuery:
    """What a task list shows.

    Attributes:
        state: one of :data:`STATES`.
        queue: a queue (a base name also matches its priority levels), or ``None``.
        task: the exact task name, or ``None``.
        text: an id prefix, or a text found in the arguments (case-insensitive), or ``None``.
        since, until: the time range (Unix seconds): when it ended, is due, was enqueued or
            started, by state.
        limit: most rows (1 to 500).
        cursor: where the previous page stopped (its ``next``), or ``None``.

    Raises:
        ConfigurationError: an unknown state, a limit out of range.
    """

    state: str = "recent"
    queue: str | None = None
    task: str | None = None
    text: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 50
    cursor: str | None = None

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ConfigurationError(f"state must be one of {', '.join(STATES)}")
        if not 1 <= self.limit <= 500:
            raise ConfigurationError("limit must be in [1, 500]")

    def keeps(self, task: str, queue: str, at: float | None) -> bool:
        """Whether a row of ``task`` from physical ``queue`` at ``at`` passes the queue,
        task and time filters."""
        if self.task and task != self.task:
            return False
        if self.queue and self.queue not in (queue, base_queue(queue)):
            return False
        if at is not None:
            if self.since is not None and at < self.since:
                return False
            if self.until is not None and at >= self.until:
                return False
        return True

    def finds(self, task_id: str, call: dict[str, Any] | None) -> bool:
        """Whether the text filter finds ``task_id`` (by prefix) or the arguments ``call``
        (``{"args", "kwargs"}``, or ``None`` when unknown)."""
        if not self.text:
            return True
        if task_id.startswith(self.text):
            return True
        if call is None:
            return False
        shown = json.dumps([call.get("args"), call.get("kwargs")], ensure_ascii=False)
        return self.text.lower() in shown.lower()


def _row(
    task_id: str, task: str, queue: str, state: str, at: float | None, call: Any = None
) -> dict[str, Any]:
    return {
        "id": task_id,
        "task": task,
        "queue": queue,
        "state": state,
        "at": at,
        "args": None if call is None else call.get("args"),
        "kwargs": None if call is None else call.get("kwargs"),
    }


async def _physical(queue: Queue, q: TaskQuery) -> list[str]:
    if q.queue:
        return [q.queue] if q.queue.endswith((":high", ":low")) else levels(q.queue)
    return sorted(await queue.broker.known_queues())


def _tie_cursor(cursor: str | None, start: float | None) -> tuple[float | None, int | None]:
    """Where a page of a time-ordered list (ended tasks, newest first; scheduled tasks,
    soonest first) starts: ``(start, None)`` for the first page (the entries past
    ``start``), ``(at, None)`` from a cursor of a time alone (an older page's), or
    ``(at, k)`` from a cursor ``"<at>:<k>"``: the entries at ``at`` but the first ``k`` of
    them (shown already), then those past it. Entries share a time (ended tasks written in
    one batch, tasks enqueued together with one delay), so a cursor of the time alone would
    skip the rest of a group a page cut. Raises ValueError for a cursor that is neither."""
    if not cursor:
        return start, None
    at, sep, count = cursor.partition(":")
    if not sep:
        return float(at), None
    skip = int(count)
    if skip < 0:
        raise ValueError(cursor)
    return float(at), skip


def _drop_shown(entries: list[Any], at: float | None, skip: int | None) -> list[Any]:
    """``entries`` (time first) without the first ``skip`` at time ``at``: shown already."""
    dropped = 0
    while skip and dropped < min(skip, len(entries)) and entries[dropped][0] == at:
        dropped += 1
    return entries[dropped:]


async def _ended(queue: Queue, q: TaskQuery) -> dict[str, Any]:
    broker = queue.broker
    names = await _physical(queue, q)
    top, skip = _tie_cursor(q.cursor, q.until)
    wanted = ENDED if q.state == "recent" else frozenset({q.state})
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    scanned = 0
    while scanned < SCAN:
        want = _CHUNK + (skip or 0)
        bound = top if skip is None or top is None else math.nextafter(top, math.inf)
        raw = await broker.state.browse.ended_tasks(names, bound, q.since, want)
        chunk = _drop_shown(raw, top, skip)
        # Each entry's place as a cursor: its time and how many entries at that time (in the
        # store's order) are shown up to it, counting those an earlier page showed.
        tie_at, tie_count = (top, skip or 0) if skip else (None, 0)
        candidates = []
        for at, physical, member in chunk:
            tie_at, tie_count = (at, tie_count + 1) if at == tie_at else (at, 1)
            state, _, rest = member.partition("\n")
            task, _, task_id = rest.partition("\n")
            if task_id in seen or state not in wanted or not q.keeps(task, physical, at):
                continue
            seen.add(task_id)
            row = _row(task_id, task, physical, state, at)
            row["_cursor"] = f"{at!r}:{tie_count}"
            candidates.append(row)
        if q.text:
            candidates = await _with_calls(queue, q, candidates)
        for row in candidates:
            rows.append(row)
            if len(rows) >= q.limit:
                return await _ended_page(queue, rows, row["_cursor"], scanned + len(chunk))
        scanned += len(chunk)
        if len(raw) < want:
            return await _ended_page(queue, rows, None, scanned)
        top, skip = tie_at, tie_count
    return await _ended_page(queue, rows, None if top is None else f"{top!r}:{skip or 0}", scanned)


async def _ended_page(
    queue: Queue, rows: list[dict[str, Any]], cursor: str | None, scanned: int
) -> dict[str, Any]:
    for row in rows:
        row.pop("_cursor", None)
    await _fill_calls(queue, rows)
    return {"items": rows, "next": cursor, "scanned": scanned}


async def _fill_calls(queue: Queue, rows: list[dict[str, Any]]) -> None:
    """Set the arguments of the page's ``rows`` whose record keeps a preview of them (one
    MGET for the page)."""
    unknown = [r for r in rows if r["args"] is None]
    if not unknown:
        return
    for row, data in zip(
        unknown, await queue.broker.get_records([r["id"] for r in unknown]), strict=True
    ):
        record = _record(data)
        if record is not None and record.args is not None:
            row.update(args=record.args, kwargs=record.kwargs or {})


def _record(data: bytes | None) -> TaskRecord | None:
    if data is None:
        return None
    try:
        return TaskRecord.from_bytes(data)
    except SerializationError:
        return None


async def _with_calls(
    queue: Queue, q: TaskQuery, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``rows`` the text filter finds, reading the records of those its id prefix does not
    (their argument previews)."""
    unsure = [r for r in rows if not r["id"].startswith(q.text or "")]
    calls: dict[str, dict[str, Any]] = {}
    for row, data in zip(
        unsure, await queue.broker.get_records([r["id"] for r in unsure]), strict=True
    ):
        record = _record(data)
        if record is not None and record.args is not None:
            calls[row["id"]] = {"args": record.args, "kwargs": record.kwargs or {}}
    out = []
    for row in rows:
        call = calls.get(row["id"])
        if q.finds(row["id"], call):
            if call is not None:
                row.update(call)
            out.append(row)
    return out


async def _scheduled(queue: Queue, q: TaskQuery) -> dict[str, Any]:
    since = None if q.since is None else q.since - 1e-6
    after, skip = _tie_cursor(q.cursor, since)
    rows: list[dict[str, Any]] = []
    scanned = 0
    while scanned < SCAN:
        want = _CHUNK + (skip or 0)
        bound = after if skip is None or after is None else math.nextafter(after, -math.inf)
        raw = await queue.broker.state.browse.scheduled_tasks(bound, want)
        tie_at, tie_count = (after, skip or 0) if skip else (None, 0)
        for due, task_id, data in _drop_shown(raw, after, skip):
            scanned += 1
            tie_at, tie_count = (due, tie_count + 1) if due == tie_at else (due, 1)
            if q.until is not None and due >= q.until:
                return {"items": rows, "next": None, "scanned": scanned}
            head, _, message = data.partition(b"\n")
            physical = head[1:].decode(errors="replace")
            try:
                env = decode_envelope(message)
            except SerializationError:
                continue
            call = preview(env.args, env.kwargs)
            if q.keeps(env.task, physical, due) and q.finds(task_id, call):
                rows.append(_row(task_id, env.task, physical, "scheduled", due, call))
                if len(rows) >= q.limit:
                    return {"items": rows, "next": f"{due!r}:{tie_count}", "scanned": scanned}
        if len(raw) < want:
            return {"items": rows, "next": None, "scanned": scanned}
        after, skip = tie_at, tie_count
    cursor = None if after is None else f"{after!r}:{skip or 0}"
    return {"items": rows, "next": cursor, "scanned": scanned}


async def _queued(queue: Queue, q: TaskQuery) -> dict[str, Any]:
    names = await _physical(queue, q)
    index, offset = 0, 0
    if q.cursor:
        left, _, right = q.cursor.partition(":")
        index, offset = int(left), int(right)
    rows: list[dict[str, Any]] = []
    scanned = 0
    while index < len(names) and len(rows) < q.limit and scanned < SCAN:
        physical = names[index]
        messages = await queue.broker.state.browse.waiting_messages(physical, offset, _CHUNK)
        for data in messages:
            scanned += 1
            offset += 1
            try:
                env = decode_envelope(data)
            except SerializationError:
                continue
            call = preview(env.args, env.kwargs)
            at = env.enqueued_at or None
            if q.keeps(env.task, physical, at) and q.finds(env.id, call):
                rows.append(_row(env.id, env.task, physical, "queued", at, call))
                if len(rows) >= q.limit:
                    break
        if len(messages) < _CHUNK and len(rows) < q.limit:
            index, offset = index + 1, 0
    more = index < len(names)
    return {"items": rows, "next": f"{index}:{offset}" if more else None, "scanned": scanned}


async def _running(queue: Queue, q: TaskQuery) -> dict[str, Any]:
    rows = []
    for worker in await workers_doc(queue):
        for run in worker.get("running_tasks") or []:
            task_id, task = str(run.get("id")), str(run.get("task"))
            physical, started = str(run.get("queue")), run.get("started_at")
            if q.keeps(task, physical, started) and q.finds(task_id, None):
                row = _row(task_id, task, physical, "running", started)
                row["worker"] = worker["id"]
                rows.append(row)
    rows.sort(key=lambda r: r["at"] or 0.0, reverse=True)
    return {"items": rows[: q.limit], "next": None, "scanned": len(rows)}


async def list_tasks(queue: Queue, q: TaskQuery) -> dict[str, Any]:
    """One page of the task list (module docstring: where each state comes from).

    Returns:
        ``{"state", "items": [{"id", "task", "queue", "state", "at", "args", "kwargs"}, …],
        "next": cursor or None, "scanned": n, "index": n}``; ``at`` is when the task ended,
        is due, was enqueued or started (Unix seconds; by ``state``), ``args`` / ``kwargs``
        a preview where known (else ``None``), ``index`` the Queue's ``recent_index``.

    Raises:
        ConfigurationError: a cursor that is not one of this state's.
        BrokerError: the broker could not be reached.
    """
    try:
        if q.state == "scheduled":
            doc = await _scheduled(queue, q)
        elif q.state == "queued":
            doc = await _queued(queue, q)
        elif q.state == "running":
            doc = await _running(queue, q)
        else:
            doc = await _ended(queue, q)
    except ValueError:
        raise ConfigurationError(f"not a cursor of the {q.state} list: {q.cursor!r}") from None
    doc["state"] = q.state
    doc["index"] = queue.recent_index
    return doc
