"""The RabbitMQ transport (aio-pika) and its pairing with the Redis state store.

``transport.py`` (:class:`AmqpTransport`: publish with confirms, consume with manual acks),
``channels.py`` (the connection, channels and quorum-queue declarations), ``closing.py`` (a
connection the server closed: one warning, fetches woken), ``custody.py``
(long-held deliveries kept by the state store; RabbitMQ's dead letters drained into the
store's) and ``broker.py`` (:func:`AmqpBroker`: the factory of the pairing a ``Queue(amqp_url=...)``
uses).
Needs the ``amqp`` extra (``pip install -e '.[amqp]'`` in the checkout: aio-pika).
"""

from __future__ import annotations

from .broker import AmqpBroker
from .transport import AmqpTransport

__all__ = ["AmqpBroker", "AmqpTransport"]
