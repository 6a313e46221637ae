"""A bounded listing of stored task records, for inspection pages (the Django admin view).

Records live in Redis under ``{ns}:t:<id>`` until ``result_ttl``; there is no index of them.
:func:`recent_records` finds them by scanning those keys, reads at most ``examine`` of them
(MGET in chunks), filters and sorts them newest first. Its cost grows with the records kept,
so it belongs on a page a person opens, never on a hot path; what it lists is only what has
a record: with ``store_results=False`` and no ``track_state`` a task has none until it fails.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..exceptions import SerializationError
from ..records import TaskRecord, TaskState
from ..routing import base_queue
from . import lookup

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["RecordPage", "recent_records"]

#: Records :func:`recent_records` reads at most by default.
EXAMINE = 5000


@dataclasses.dataclass(frozen=True)
class RecordPage:
    """What :func:`recent_records` found.

    Attributes:
        records: the matching records, newest first (by the latest of finished, started
            and enqueued time), at most the ``limit`` asked for.
        matched: how many examined records matched the filters (may exceed ``len(records)``).
        examined: how many records were read.
        capped: more records exist than were read (the listing is then a sample, not
            the newest overall).
    """

    records: list[TaskRecord]
    matched: int
    examined: int
    capped: bool


def _moment(record: TaskRecord) -> float:
    return record.finished_at or record.started_at or record.enqueued_at or 0.0


def _fits(
    record: TaskRecord, states: frozenset[TaskState], queue: str | None, search: str | None
) -> bool:
    if states and record.state not in states:
        return False
    if queue and queue not in (record.queue, base_queue(record.queue)):
        return False
    return not search or record.id.startswith(search)


async def recent_records(
    broker: Broker,
    *,
    limit: int = 100,
    examine: int = EXAMINE,
    states: Iterable[TaskState] = (),
    queue: str | None = None,
    search: str | None = None,
) -> RecordPage:
    """The stored records of a namespace, filtered, newest first.

    Args:
        broker: the Queue's broker of the running loop.
        limit: records returned at most (>= 1).
        examine: records read at most (>= 1); past it the page says ``capped``.
        states: only records in these states (empty: all).
        queue: only records of this queue (a logical name also matches its priority
            levels, ``emails`` matches ``emails:high``).
        search: a task id or the start of one; an exact id is read directly, so it is
            found even past ``examine``.

    Raises:
        BrokerError: the broker could not be reached.
        NotImplementedError: a broker that cannot list its records.
    """
    wanted = frozenset(states)
    search = (search or "").strip() or None
    ids, capped = await broker.record_ids(max(1, examine))
    found: dict[str, TaskRecord] = {}
    for data in await broker.get_records(ids):
        if data is None:  # expired between the scan and the read
            continue
        try:
            record = TaskRecord.from_bytes(data)
        except SerializationError:
            continue
        found[record.id] = record
    if search and search not in found:
        try:
            exact = await lookup.inspect(broker, search)
        except SerializationError:
            exact = None
        if exact is not None:
            found[exact.id] = exact
    matching = [r for r in found.values() if _fits(r, wanted, queue, search)]
    matching.sort(key=_moment, reverse=True)
    return RecordPage(matching[: max(1, limit)], len(matching), len(ids), capped)
