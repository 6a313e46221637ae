"""What the RabbitMQ transport tells of its queues: their counts (``queue_stats``) and
purging them (``purge_queue``).

**In flight.** RabbitMQ tells a client only how many messages of a queue are ready (a
passive ``queue.declare``); its count of unacked ones is in the management API, which
blitzq does not require. So each transport counts what it holds (:func:`holding`): the
tasks a fetch took and that are not settled (running or waiting for a slot, custody's
included), and those its consumer received that no fetch took yet (prefetched); a worker
writes both into its registration (``Worker.info()``, ``in_flight``; written again each
second its running count changed, and every maintenance interval), and :func:`queue_stats`
adds the live registrations of the other transports (:func:`held_elsewhere`) to its own
live counts: in flight what the fetches took, waiting what is ready plus what is
prefetched -- as on Redis, where a message is in flight once a fetch took it (the shared
contract, ``tests/contract``). A registration outlives a killed worker by 30 s or more, but
RabbitMQ requeues what its connection held the moment the connection closes: a registration
whose connection mark (:mod:`.liveness`) is gone counts only what it kept in custody.

**Waiting.** RabbitMQ tells how many AMQP messages are ready, not what they hold: a ready
pack (``packs.py``) counts once, so ``waiting`` is below the tasks waiting while packs wait
(:data:`COUNT_NOTE`, which the CLI and the dashboard show); prefetched tasks count one each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...exceptions import BlitzQError
from ...serialization import loads
from ..state import StateStore
from .channels import FAILURES, AmqpLink, settle, translate
from .deliveries import Consumer, Held
from .liveness import open_marks

__all__ = ["COUNT_NOTE", "held_elsewhere", "holding", "purge_queue", "queue_stats"]

#: What ``waiting`` counts on RabbitMQ (``Transport.count_note``): RabbitMQ tells only how
#: many AMQP messages are ready, and a pack's tasks (``packs.py``) are not known until a
#: consumer receives it.
COUNT_NOTE = (
    "RabbitMQ: waiting counts each ready AMQP message once, and a message of a bulk enqueue "
    "(a pack) holds up to 32 tasks by default (the producers' ?pack=), so up to that many "
    "times as many tasks may wait; what the workers prefetched counts one per task, and in "
    "flight counts tasks"
)


def holding(
    instance: str,
    consumers: Mapping[str, Consumer],
    held: Iterable[Held],
    epoch: int,
    alive: str = "",
) -> dict[str, Any]:
    """What one transport holds delivered and not settled, for a worker's registration:
    ``{"by": instance, "alive": mark, "queues": {queue: tasks}, "kept": {queue: tasks},
    "buffered": {queue: tasks}}``, per physical queue the tasks a fetch took that are
    unacked on RabbitMQ on the connection of ``epoch`` (running, or waiting for a slot;
    those of an older connection are RabbitMQ's again), those in the state store's custody
    (acked on RabbitMQ: they outlive the connection), and those its live ``consumers``
    received that no fetch took yet (one per task of a pack). ``alive``: the connection's
    mark (:mod:`.liveness`; ``""``: none yet)."""
    taken: Counter[str] = Counter()
    kept: Counter[str] = Counter()
    for h in held:
        if h.state == "custody":
            kept[h.queue] += 1
        elif h.epoch == epoch:
            taken[h.queue] += 1
    buffered = {q: len(c.buffer) for q, c in consumers.items() if c.buffer}
    return {
        "by": instance,
        "alive": alive,
        "queues": dict(taken),
        "kept": dict(kept),
        "buffered": buffered,
    }


def _counts(found: object) -> dict[str, int]:
    """A registration's per-queue counts, without what does not read as one."""
    if not isinstance(found, dict):
        return {}
    return {q: n for q, n in found.items() if isinstance(q, str) and isinstance(n, int) and n > 0}


async def held_elsewhere(
    store: StateStore | None, instance: str, link: AmqpLink | None = None
) -> tuple[Counter[str], Counter[str]]:
    """Per physical queue, the tasks the transports other than ``instance`` hold: those
    their fetches took (in custody included), and those their consumers prefetched
    (:func:`holding`), from the live workers' registrations (their ``in_flight``, as of
    their last write; one per transport, the latest, when several workers share one). A
    transport whose connection is gone (its mark, :mod:`.liveness`, checked on ``link``)
    holds only what is in custody: RabbitMQ put the rest back. A registration without the
    field (a worker of another version) or that does not read counts nothing; one without a
    mark counts all it says until it lapses.

    Raises:
        BrokerError: Redis or RabbitMQ could not be reached.
    """
    taken: Counter[str] = Counter()
    buffered: Counter[str] = Counter()
    if store is None:
        return taken, buffered
    latest: dict[str, tuple[float, dict[str, Any]]] = {}
    for raw in (await store.registry.workers()).values():
        try:
            info = loads(raw)
        except BlitzQError:
            continue
        mark = info.get("in_flight") if isinstance(info, dict) else None
        if not isinstance(mark, dict):
            continue
        by, at = mark.get("by"), info.get("heartbeat_at")
        if not isinstance(by, str) or by == instance:
            continue
        at = float(at) if isinstance(at, int | float) else 0.0
        if by not in latest or at > latest[by][0]:
            latest[by] = (at, mark)
    holders = [m for _, m in latest.values() if _held(m)]
    open_ = await open_marks(link, filter(None, map(_mark, holders))) if link else set()
    for _, mark in latest.values():
        taken.update(_counts(mark.get("kept")))
        alive = _mark(mark)
        if alive and link is not None and alive not in open_:
            continue  # its connection is gone: RabbitMQ has its unacked messages back
        taken.update(_counts(mark.get("queues")))
        buffered.update(_counts(mark.get("buffered")))
    return taken, buffered


def _held(found: dict[str, Any]) -> bool:
    """Whether a registration's ``in_flight`` tells of unacked deliveries (taken or
    prefetched): what its connection's end gives back to RabbitMQ."""
    return bool(_counts(found.get("queues")) or _counts(found.get("buffered")))


def _mark(found: dict[str, Any]) -> str:
    """The connection mark of a registration's ``in_flight`` (``""``: none)."""
    alive = found.get("alive")
    return alive if isinstance(alive, str) else ""


async def queue_stats(
    link: AmqpLink,
    consumers: Mapping[str, Consumer],
    held: Iterable[Held],
    queues: Sequence[str],
    elsewhere: tuple[Mapping[str, int], Mapping[str, int]] | None = None,
) -> dict[str, dict[str, int]]:
    """Per queue: ``waiting`` (ready messages, from a passive declaration: AMQP messages,
    a pack of several tasks (``packs.py``) once; plus the tasks prefetched by a consumer
    that no fetch took) and ``in_flight`` (tasks a fetch took and that are not settled),
    each this process's (:func:`holding`) plus the other transports' (``elsewhere``,
    :func:`held_elsewhere`). While consumers run, a message RabbitMQ dispatches as the
    counts are read may be counted twice or not at all, and another process's counts are
    as of its last registration (about a second behind): an estimate, exact when idle.

    Args:
        link: the transport's connection.
        consumers: this process's live consumers, by queue.
        held: the deliveries this process holds (fetched, not settled).
        queues: the physical queue names.
        elsewhere: per queue, the tasks other transports took and prefetched (``None``:
            none counted).

    Raises:
        BrokerError: RabbitMQ refused a count or could not be reached.
    """
    mine = holding("", consumers, held, link.epoch)
    taken, buffered = elsewhere or ({}, {})
    out: dict[str, dict[str, int]] = {}
    for queue in queues:
        consumer = consumers.get(queue)
        if consumer is not None:
            ready = await _settled_count(link, queue, consumer)
        else:
            ready = await link.message_count(queue)
        waiting = ready + mine["buffered"].get(queue, 0) + buffered.get(queue, 0)
        in_flight = mine["queues"].get(queue, 0) + mine["kept"].get(queue, 0) + taken.get(queue, 0)
        out[queue] = {"waiting": waiting, "in_flight": in_flight}
    return out


async def _settled_count(link: AmqpLink, queue: str, consumer: Consumer) -> int:
    """Ready messages of ``queue``, read on the consumer's own channel: what RabbitMQ
    dispatched to the consumer before it answered arrives first (in the buffer)."""
    try:
        ok = await consumer.raw.queue_declare(link.name(queue), passive=True)
    except FAILURES as exc:
        raise translate(exc, f"counting queue {link.name(queue)!r}") from None
    return int(ok.message_count or 0)


async def purge_queue(link: AmqpLink, consumer: Consumer | None, queue: str) -> int:
    """Delete the ready messages of ``queue`` and those this process's ``consumer`` of it
    received but nobody fetched (acked); return how many: AMQP messages (a pack counts once)
    plus the consumer's buffered tasks. Messages another worker process
    has prefetched are not purged (at most its prefetch).

    Raises:
        BrokerError: RabbitMQ refused the purge or could not be reached.
    """
    purged = await link.purge(queue)
    if consumer is not None:
        while consumer.buffer:
            await settle(consumer.buffer.popleft(), True)
            purged += 1
    return purged
