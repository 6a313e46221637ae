"""The RabbitMQ pairing: :class:`~.transport.AmqpTransport` with the Redis state store.

:func:`AmqpBroker` makes ``Broker(AmqpTransport(...), RedisStateStore(conn, outbox=True))``
with ``conn`` a :class:`~blitzq.broker.redis.connection.RedisConnection` of kind ``"l"``:
records, results,
the schedule, dead letters and workflow/unique/lock/rate/progress state stay on Redis (or the
embedded or ``memory://`` Valkey); messages travel through RabbitMQ. The store does not ack
RabbitMQ deliveries (:meth:`~blitzq.broker.state.StateStore.acks` is ``False``), so the facade
commits a completion in Redis first and acks it on RabbitMQ after: at-least-once.

What the store itself writes into queues (promoted delays and retries, requeues, workflow
steps, replays, periodic claims) lands in the Redis lists of the namespace: the outbox that a
relay moves to RabbitMQ (see docs/architecture.md, "Adding a broker").
"""

from __future__ import annotations

from ...limits import DEFAULT_DEAD_LETTER_MAX_BYTES, DEFAULT_DEAD_LETTER_TTL
from ..facade import Broker
from ..pairing import CommitThenAck
from ..redis.connection import DEFAULT_DEAD_LETTER_CAP, RedisConnection, RedisDeadLetterLimits
from ..redis.store import RedisStateStore
from .channels import heartbeat_for
from .custody import Custody
from .transport import AmqpTransport

__all__ = ["AmqpBroker"]


def AmqpBroker(
    amqp_url: str,
    redis_url: str,
    namespace: str,
    *,
    max_deliveries: int = 5,
    prefetch: int | None = None,
    dead_letter_cap: int = DEFAULT_DEAD_LETTER_CAP,
    dead_letter_ttl: int = DEFAULT_DEAD_LETTER_TTL,
    dead_letter_max_bytes: int = DEFAULT_DEAD_LETTER_MAX_BYTES,
    visibility_timeout: float | None = None,
) -> Broker:
    """RabbitMQ delivery with the Redis state store.

    Args:
        amqp_url: ``amqp://user:password@host:port/vhost`` (``amqps://`` for TLS).
        redis_url: the state store's ``redis://``, ``rediss://`` or ``unix://`` URL.
        namespace: Redis key namespace and RabbitMQ queue-name prefix.
        max_deliveries: deliveries of one message before it is dead-lettered (>= 1).
        prefetch: unacked messages RabbitMQ sends a consumer ahead (``None``: the worker's
            free slots at its first fetch).
        dead_letter_cap: dead letters kept before the oldest are dropped.
        dead_letter_ttl: seconds a dead letter is kept.
        dead_letter_max_bytes: total bytes of dead letters kept.
        visibility_timeout: the Queue's visibility timeout (seconds): the AMQP heartbeat is
            derived from it (``channels.heartbeat_for``), so RabbitMQ takes back a frozen
            worker's deliveries after about that long; ``None``: aio-pika's 60 s heartbeat.

    Returns:
        A :class:`~blitzq.broker.Broker` whose ``transport`` is the
        :class:`~.transport.AmqpTransport` and whose ``state`` is the Redis state store
        (connection ``state.conn``, kind ``"l"``), made with its outbox: what it writes into
        queues is relayed to RabbitMQ (:mod:`blitzq.broker.outbox`), and its dead letters
        record the origin ``"s"`` (``DeadLetter.mode`` "reliable": RabbitMQ delivery is
        at-least-once).

    Raises:
        ConfigurationError: a bad query parameter in ``redis_url``.
    """
    conn = RedisConnection(
        redis_url,
        namespace,
        dead_letter_cap=dead_letter_cap,
        dead_letter_ttl=dead_letter_ttl,
        dead_letter_max_bytes=dead_letter_max_bytes,
        kind="l",
    )
    store = RedisStateStore(conn, outbox=True)
    custody = Custody(conn, store)
    heartbeat = None if visibility_timeout is None else heartbeat_for(visibility_timeout)
    transport = AmqpTransport(
        amqp_url,
        namespace,
        max_deliveries=max_deliveries,
        prefetch=prefetch,
        custody=custody,
        heartbeat=heartbeat,
    )
    custody.transport = transport
    pairing = CommitThenAck(transport, store)
    return Broker(transport, store, pairing, dead_letter_limits=RedisDeadLetterLimits(conn))
