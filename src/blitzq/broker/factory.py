"""From a Queue's settings to a broker: the broker URL (:func:`resolve_url`) and the broker
made for it (:func:`make_broker`).

A :class:`~blitzq.Queue` calls these once per event loop (``Queue.broker``); the URL schemes
and which broker class serves which mode are decided here and nowhere else.
"""

from __future__ import annotations

from typing import Any, Literal

from .. import config
from ..exceptions import ConfigurationError
from . import Broker, Guarantee

#: URL schemes a Queue accepts (``valkey://`` and ``valkeys://`` are read as the redis ones).
SCHEMES = (
    "redis://", "rediss://", "unix://", "memory://", "redis+cluster://", "rediss+cluster://",
    "redis+sentinel://",
)  # fmt: skip

#: URL schemes of ``amqp_url`` (RabbitMQ).
AMQP_SCHEMES = ("amqp://", "amqps://")


def resolve_amqp_url(configured: str | None) -> str | None:
    """The RabbitMQ URL to use, if any.

    Args:
        configured: the Queue's ``amqp_url`` (or the CLI's ``--amqp-url``); ``None`` reads
            ``BLITZQ_AMQP_URL``.

    Returns:
        An ``amqp://`` or ``amqps://`` URL, or ``None`` (messages travel through Redis).

    Raises:
        ConfigurationError: any other scheme.
    """
    url = configured or config.value("amqp_url") or None
    if url is not None and not url.startswith(AMQP_SCHEMES):
        raise ConfigurationError(f"unsupported amqp_url {url!r}: use amqp:// or amqps://")
    return url


def resolve_url(configured: str | None) -> str:
    """The broker URL to use.

    Args:
        configured: the Queue's ``redis_url`` (or the CLI's ``--redis-url``); ``None`` reads
            ``BLITZQ_REDIS_URL``, and without it starts (or reuses) the embedded Valkey
            server.

    Returns:
        A ``redis://``, ``rediss://``, ``unix://``, ``memory://`` or ``redis+sentinel://``
        URL, or a Redis Cluster node's ``redis+cluster://``/``rediss+cluster://``
        (``valkey://`` and ``valkeys://`` rewritten to ``redis://`` and ``rediss://``).

    Raises:
        ConfigurationError: any other scheme.
    """
    url = configured or config.value("redis_url")
    if not url:
        from .redis.embedded import ensure_server

        url = ensure_server()
    if url.startswith("valkey://"):
        url = "redis://" + url.removeprefix("valkey://")
    elif url.startswith("valkeys://"):
        url = "rediss://" + url.removeprefix("valkeys://")
    if not url.startswith(SCHEMES):
        raise ConfigurationError(
            f"unsupported broker URL {url!r}: use redis://, rediss://, unix://, memory://, "
            "redis+cluster:// or redis+sentinel://"
        )
    return url


def make_broker(
    url: str,
    namespace: str,
    mode: Literal["reliable", "fast"],
    dead_letter_limits: dict[str, Any],
    amqp_url: str | None = None,
    max_deliveries: int = 5,
) -> Broker:
    """A new broker (its own connections) for ``url``.

    Args:
        url: a URL from :func:`resolve_url`; ``memory://[name]`` runs the same Redis code and
            Lua on this process's private Valkey server, in a namespace per name.
        namespace: the key prefix.
        mode: ``"reliable"`` (streams) or ``"fast"`` (lists).
        dead_letter_limits: ``dead_letter_cap``, ``dead_letter_ttl`` (seconds) and
            ``dead_letter_max_bytes`` of the Queue.
        amqp_url: a URL from :func:`resolve_amqp_url`: messages travel through RabbitMQ
            (:class:`~blitzq.broker.amqp.AmqpBroker`, at-least-once whatever ``mode``) and
            ``url`` keeps the state.
        max_deliveries: the Queue's ``max_deliveries`` (RabbitMQ's ``x-delivery-limit``).

    Raises:
        ConfigurationError: a bad connection parameter in the URL.
    """
    memory = url.startswith("memory://")
    if memory:  # the same Redis code and Lua, on this process's private Valkey server
        from .redis.ephemeral import ensure_server, memory_namespace

        url, namespace = ensure_server(), memory_namespace(url.removeprefix("memory://"))
    broker: Broker
    if amqp_url is not None:
        from .amqp import AmqpBroker

        broker = AmqpBroker(
            amqp_url, url, namespace, max_deliveries=max_deliveries, **dead_letter_limits
        )
    elif mode == "reliable":
        from .redis.spread import reliable_broker

        broker = reliable_broker(url, namespace, **dead_letter_limits)
    else:
        from .redis.fast import FastRedisBroker

        broker = FastRedisBroker(url, namespace, **dead_letter_limits)
    if memory:
        broker.guarantee = Guarantee.EPHEMERAL  # whatever the mode: gone with the process
    return broker


__all__ = ["AMQP_SCHEMES", "SCHEMES", "make_broker", "resolve_amqp_url", "resolve_url"]
