"""From a Queue's settings to a broker: the broker URL (:func:`resolve_url`) and the broker
made for it (:func:`make_broker`).

A :class:`~blitzq.Queue` calls these once per event loop (``Queue.broker``); the URL schemes
and which broker class serves which mode are decided here and nowhere else.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from .. import config
from .._checks import check_single_options
from ..exceptions import ConfigurationError
from ..redaction import mask_url, redact
from . import Broker, Guarantee

#: URL schemes a Queue accepts (``valkey://`` and ``valkeys://`` are read as the redis ones).
SCHEMES = (
    "redis://",
    "rediss://",
    "unix://",
    "memory://",
    "redis+cluster://",
    "rediss+cluster://",
    "redis+sentinel://",
)

#: URL schemes of ``amqp_url`` (RabbitMQ).
AMQP_SCHEMES = ("amqp://", "amqps://")


#: The queue name the RabbitMQ transport keeps for the namespace's dead-letter queue
#: (``<namespace>.dead-letter``).
AMQP_RESERVED_QUEUE = "dead-letter"


def resolve_amqp_url(configured: str | None, queue: str | None = None) -> str | None:
    """The RabbitMQ URL to use, if any.

    Args:
        configured: the Queue's ``amqp_url`` (or the CLI's ``--amqp-url``); ``None`` reads
            ``BLITZQ_AMQP_URL``.
        queue: the Queue's name, refused when it is :data:`AMQP_RESERVED_QUEUE` and a URL
            is found.

    Returns:
        An ``amqp://`` or ``amqps://`` URL, or ``None`` (messages travel through Redis).

    Raises:
        ConfigurationError: any other scheme, a URL :func:`check_amqp_url` refuses, or the
            reserved queue name.
    """
    url = configured or config.value("amqp_url") or None
    if url is not None:
        check_amqp_url(url)
        if queue is not None:
            check_amqp_queue(queue)
    return url


def check_amqp_queue(queue: str) -> None:
    """Refuse the queue name the RabbitMQ transport keeps for its dead-letter queue.

    Raises:
        ConfigurationError: ``queue`` is :data:`AMQP_RESERVED_QUEUE`.
    """
    if queue == AMQP_RESERVED_QUEUE:
        raise ConfigurationError(
            f"queue name {queue!r} is reserved on RabbitMQ: <namespace>.{queue} is the "
            "namespace's dead-letter queue; use another queue name"
        )


def amqp_hosts(url: str) -> list[str]:
    """The single-host AMQP URLs an ``amqp_url`` names, in the order to try them.

    Several RabbitMQ nodes are given either as hosts separated by commas in one URL, sharing
    its user, password, vhost and options (``amqp://u:p@h1:5672,h2:5672,h3/vhost``), or as
    whole URLs separated by semicolons (``amqp://u:p@h1/vhost;amqps://u:p@h2/vhost``, as in
    Celery's broker list); both forms may be mixed. A port left out is the scheme's.

    Args:
        url: the ``amqp_url`` (one host or several).

    Returns:
        One URL per host (a one-host ``url`` is returned as is, alone).
    """
    out: list[str] = []
    for piece in (p.strip() for p in url.split(";")):
        if not piece:
            continue
        scheme, sep, rest = piece.partition("://")
        cut = len(rest)
        for mark in "/?#":
            found = rest.find(mark)
            if found != -1:
                cut = min(cut, found)
        netloc, tail = rest[:cut], rest[cut:]
        userinfo, at, hosts = netloc.rpartition("@")
        names = hosts.split(",")
        if len(names) == 1:
            out.append(piece)
            continue
        for host in names:
            out.append(f"{scheme}{sep}{userinfo}{at}{host.strip()}{tail}")
    return out


#: Largest ``?pack=`` of an ``amqp_url`` (tasks per AMQP message, ``broker/amqp/packs.py``).
AMQP_MAX_PACK = 1000


def amqp_pack(url: str) -> int | None:
    """The ``?pack=`` option of an ``amqp_url``: the most tasks a bulk publish puts in one
    AMQP message (``broker/amqp/packs.py``; ``1``: none); ``None`` when no host's URL gives
    it. Several hosts' URLs may each give it, with the same value.

    Raises:
        ConfigurationError: a ``pack=`` that is not an integer in 1-:data:`AMQP_MAX_PACK`,
            given twice in one host's URL, or with different values in two hosts' URLs (the
            message names the URL with its password masked).
    """
    found: int | None = None
    for one in amqp_hosts(url):
        check_single_options(one, "amqp_url", mask_url(url))
        for key, value in parse_qsl(one.partition("?")[2], keep_blank_values=True):
            if key != "pack":
                continue
            number = int(value) if value.strip().isdigit() else 0
            if not 1 <= number <= AMQP_MAX_PACK:
                raise ConfigurationError(
                    f"bad amqp_url {mask_url(url)!r}: pack={value!r} must be an integer from "
                    f"1 (no packs) to {AMQP_MAX_PACK}"
                )
            if found is not None and number != found:
                raise ConfigurationError(
                    f"bad amqp_url {mask_url(url)!r}: the hosts' URLs give different pack= "
                    f"values ({found} and {number}); give one"
                )
            found = number
    return found


def without_pack(url: str) -> str:
    """A one-host ``amqp_url`` without its ``pack=`` option (blitzq's, not aio-pika's)."""
    base, sep, query = url.partition("?")
    if not sep or "pack=" not in query:
        return url
    kept = [p for p in query.split("&") if p.partition("=")[0] != "pack"]
    return f"{base}?{'&'.join(kept)}" if kept else base


def check_amqp_url(url: str) -> None:
    """Refuse an AMQP URL that aio-pika could not connect with, before any connection.

    Args:
        url: ``amqp://user:password@host:port/vhost`` or ``amqps://...`` (the vhost one path
            segment, ``%2F`` for ``/``; no vhost: ``/``); several hosts as :func:`amqp_hosts`
            reads them, each checked.

    Raises:
        ConfigurationError: another scheme, no host, a port that is not an integer in
            1-65535, a vhost with an unescaped ``/``, an option given twice in one host's URL
            (``?heartbeat=10&heartbeat=30``: :func:`~blitzq._checks.repeated_option`), or a
            bad ``pack=`` (:func:`amqp_pack`); the message names the URL with its password
            masked.
    """
    hosts = amqp_hosts(url)
    if not hosts:
        raise ConfigurationError(f"bad amqp_url {mask_url(url)!r}: no host")
    for one in hosts:
        _check_one_amqp_url(one)
        check_single_options(one, "amqp_url", mask_url(url))
    amqp_pack(url)


def _check_one_amqp_url(url: str) -> None:
    shown = mask_url(url)
    if not url.startswith(AMQP_SCHEMES):
        raise ConfigurationError(f"unsupported amqp_url {shown!r}: use amqp:// or amqps://")
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigurationError(f"bad amqp_url {shown!r}: {redact(str(exc), url)}") from None
    if not parts.hostname:
        raise ConfigurationError(f"bad amqp_url {shown!r}: no host")
    if port == 0:
        raise ConfigurationError(f"bad amqp_url {shown!r}: port 0")
    if "/" in parts.path[1:] and parts.path != "//":  # aio-pika reads "//" as vhost "/"
        vhost = redact(repr(unquote(parts.path[1:])), url)  # a password's "/" cuts it here
        raise ConfigurationError(
            f"bad amqp_url {shown!r}: the vhost {vhost} has an unescaped "
            "'/' (write it as %2F, e.g. amqp://host/%2F for the default vhost)"
        )


def check_url(url: str, *, memory: bool = True) -> None:
    """Refuse a broker URL whose scheme blitzq does not speak (nothing is connected).

    Args:
        url: the URL as given (``valkey://`` and ``valkeys://`` included).
        memory: whether ``memory://`` is offered (not by the CLI: such a server is private
            to the process that starts it).

    Raises:
        ConfigurationError: another scheme (the message lists the accepted ones), or a query
            option given more than once (``?layout=slot&layout=spread``,
            ``?socket_timeout=1&socket_timeout=5``: :func:`~blitzq._checks.repeated_option`;
            the message names it).
    """
    if url.startswith((*SCHEMES, "valkey://", "valkeys://")):
        check_single_options(url, "broker URL", mask_url(url))
        return
    offered = ["redis://", "rediss://", "valkey://", "valkeys://", "unix://"]
    offered += ["memory://"] if memory else []
    offered += ["redis+cluster://", "rediss+cluster://"]
    raise ConfigurationError(
        f"unsupported broker URL {mask_url(url)!r}: use {', '.join(offered)} or redis+sentinel://"
    )


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

        url = ensure_server(keep_alive=True)  # restarted if it dies (kill -9)
    check_url(url)
    if url.startswith("valkey://"):
        url = "redis://" + url.removeprefix("valkey://")
    elif url.startswith("valkeys://"):
        url = "rediss://" + url.removeprefix("valkeys://")
    return url


def describe_connection(connection: Any) -> str:
    """Where an injected ``redis=`` connection goes, as a URL without credentials.

    Raises:
        ConfigurationError: not a ``redis.asyncio.Redis`` or ``ConnectionPool``, a Redis
            Cluster client, or one that decodes replies (:mod:`.redis.injected`).
    """
    from .redis.injected import describe_injected

    return describe_injected(connection)


def make_broker(
    url: str,
    namespace: str,
    mode: Literal["reliable", "fast"],
    dead_letter_limits: dict[str, Any],
    amqp_url: str | None = None,
    max_deliveries: int = 5,
    visibility_timeout: float | None = None,
    connection: Any = None,
    amqp_connection: Any = None,
) -> Broker:
    """A new broker (its own connections) for ``url``, or on an application's ``connection``.

    Args:
        url: a URL from :func:`resolve_url`; ``memory://[name]`` runs the same Redis code and
            Lua on this process's private Valkey server, in a namespace per name.
        namespace: the key prefix.
        mode: ``"reliable"`` (streams) or ``"fast"`` (lists).
        dead_letter_limits: ``dead_letter_cap``, ``dead_letter_ttl`` (seconds) and
            ``dead_letter_max_bytes`` of the Queue.
        amqp_url: a URL from :func:`resolve_amqp_url`: messages travel through RabbitMQ
            (:func:`~blitzq.broker.amqp.AmqpBroker`, at-least-once whatever ``mode``) and
            ``url`` keeps the state.
        max_deliveries: the Queue's ``max_deliveries`` (RabbitMQ's ``x-delivery-limit``).
        visibility_timeout: the Queue's visibility timeout in seconds (RabbitMQ's connection
            heartbeat is derived from it).
        connection: the Queue's ``redis=`` (a ``redis.asyncio.Redis`` or ``ConnectionPool``
            of the application): the broker works over its pool, never closes it, and keeps
            the one-slot layout (:mod:`.redis.injected`); ``url`` is then only its name.
        amqp_connection: the Queue's ``amqp_connection=`` (an aio-pika connection or pool of
            the application): messages are published on it through RabbitMQ, as with
            ``amqp_url`` (which then only names it), and blitzq never closes it
            (:mod:`.amqp.injected`).

    Raises:
        ConfigurationError: a bad connection parameter in the URL; ``connection`` of a kind
            :func:`.redis.injected.injected_pool` refuses, or ``amqp_connection`` of a kind
            :func:`.amqp.injected.check_amqp_connection` refuses.
    """
    memory = url.startswith("memory://")
    if memory:  # the same Redis code and Lua, on this process's private Valkey server
        from .redis.ephemeral import ensure_server, memory_namespace

        url, namespace = ensure_server(), memory_namespace(url.removeprefix("memory://"))
    if amqp_connection is not None or (connection is not None and amqp_url is not None):
        from .amqp import AmqpBroker
        from .amqp.injected import describe_amqp_connection

        clients: dict[str, Any] = {}
        if connection is not None:
            from .redis.injected import injected_client, listener_client

            clients = {
                "client": injected_client(connection),
                "listener_client": listener_client(connection),
            }
        return AmqpBroker(
            amqp_url or describe_amqp_connection(amqp_connection),
            url,
            namespace,
            max_deliveries=max_deliveries,
            visibility_timeout=visibility_timeout,
            amqp_connection=amqp_connection,
            **clients,
            **dead_letter_limits,
        )
    if connection is not None:
        from .redis.fast import FastRedisBroker
        from .redis.injected import injected_client, listener_client
        from .redis.reliable import ReliableRedisBroker

        broker_class = ReliableRedisBroker if mode == "reliable" else FastRedisBroker
        return broker_class(
            url,
            namespace,
            client=injected_client(connection),
            listener_client=listener_client(connection),
            **dead_letter_limits,
        )
    broker: Broker
    if amqp_url is not None:
        from .amqp import AmqpBroker

        broker = AmqpBroker(
            amqp_url,
            url,
            namespace,
            max_deliveries=max_deliveries,
            visibility_timeout=visibility_timeout,
            **dead_letter_limits,
        )
    elif mode == "reliable":
        from .redis.reliable import reliable_broker

        broker = reliable_broker(url, namespace, **dead_letter_limits)
    else:
        from .redis.fast import FastRedisBroker

        broker = FastRedisBroker(url, namespace, **dead_letter_limits)
    if memory:
        broker.guarantee = Guarantee.EPHEMERAL  # whatever the mode: gone with the process
    return broker


__all__ = [
    "AMQP_MAX_PACK",
    "AMQP_RESERVED_QUEUE",
    "AMQP_SCHEMES",
    "SCHEMES",
    "amqp_hosts",
    "amqp_pack",
    "check_amqp_queue",
    "check_amqp_url",
    "check_url",
    "describe_connection",
    "make_broker",
    "mask_url",
    "resolve_amqp_url",
    "resolve_url",
    "without_pack",
]
