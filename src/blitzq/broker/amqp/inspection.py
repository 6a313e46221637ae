"""What the RabbitMQ transport tells of its queues: their counts (``queue_stats``) and
purging them (``purge_queue``), from RabbitMQ's passive declarations and this process's own
consumers (what they received that no fetch took yet)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .channels import FAILURES, AmqpLink, settle, translate
from .deliveries import Consumer, Held

__all__ = ["purge_queue", "queue_stats"]


async def queue_stats(
    link: AmqpLink,
    consumers: Mapping[str, Consumer],
    held: Iterable[Held],
    queues: Sequence[str],
) -> dict[str, dict[str, int]]:
    """Per queue: ``waiting`` (ready messages, from a passive declaration) and
    ``in_flight`` (the deliveries this process holds: tasks). Waiting counts AMQP messages
    -- a pack of several tasks (``packs.py``) once -- plus, one per task, what this
    process's consumer received but nobody fetched yet; another process's are in neither
    count. While a consumer runs, a message RabbitMQ dispatches to it as the count is read may
    be counted twice or not at all: an estimate, exact when idle.

    Args:
        link: the transport's connection.
        consumers: this process's live consumers, by queue.
        held: the deliveries this process holds (fetched, not settled).
        queues: the physical queue names.

    Raises:
        BrokerError: RabbitMQ refused a count or could not be reached.
    """
    in_flight: dict[str, int] = {}
    for h in held:
        in_flight[h.queue] = in_flight.get(h.queue, 0) + 1
    out: dict[str, dict[str, int]] = {}
    for queue in queues:
        consumer = consumers.get(queue)
        if consumer is not None:
            waiting = await _settled_count(link, queue, consumer) + len(consumer.buffer)
        else:
            waiting = await link.message_count(queue)
        out[queue] = {"waiting": waiting, "in_flight": in_flight.get(queue, 0)}
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
