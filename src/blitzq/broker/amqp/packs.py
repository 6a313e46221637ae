"""Packs: several tasks of one bulk publish in one AMQP message (the RabbitMQ transport).

**Why.** The RabbitMQ node spends about 24 us of CPU per confirmed persistent message on a
quorum queue (``bench/README.md``, "Bulk enqueue on RabbitMQ"): one AMQP message per task
cannot bulk-enqueue at half the Redis transport's rate on a small machine. A *pack* carries
up to :data:`DEFAULT_MAX_PACK` tasks' messages in one AMQP message, so the node's cost is
shared by them.

**When.** Only a publish of many messages to one physical queue packs
(:meth:`~.transport.AmqpTransport.publish` with ``len(messages) >= 2 * SPREAD``: a
``enqueue_many``'s batch for one queue, or the outbox relay's batch): the pack size is
:func:`pack_size` = ``min(max_pack, n // SPREAD)``, so a batch still yields at least
:data:`SPREAD` messages that RabbitMQ can spread over consumers (a batch of fewer than 128
packs nothing). A physical queue is the whole routing of a blitzq message on RabbitMQ (one
queue per priority level; delayed tasks wait in the state store's schedule, not here), so the
tasks of one publish share it. A hand-back, a custody recovery and a single enqueue are one
message per task, as before. ``?pack=N`` in the ``amqp_url`` sets ``max_pack``
(``?pack=1``: no packs; :func:`blitzq.broker.factory.amqp_pack`).

**Format.** The body is :data:`MAGIC` (its first byte ``0xc1`` is never used by MessagePack,
so a worker that does not know packs fails to decode it as an envelope and dead-letters it as
malformed, with the whole pack in the dead letter -- never misreads it), then for each task
a 4-byte big-endian length and the task's message. The message carries the AMQP header
:data:`PACK_HEADER` (the format version, 1), which is what a worker looks for.

**Receipt.** A pack delivered for the first time is split into its tasks at the consumer
(``deliveries.py``): each task is a delivery of its own to the worker (its own token, heartbeat,
completion, custody hand-over), counted as one slot of the worker's concurrency; the tasks not
fetched yet wait in the consumer's buffer. The AMQP message is acked once every task of it is
settled -- its completion committed, or handed back, or handed to custody (:class:`Pack`). A
pack delivered again (a worker died, or its channel closed, before every task was settled) is
not run as it is: its tasks whose completion the state store already committed are dropped
(``redelivered.py``), the others are published again one message each, marked as delivered
once, and the pack is acked (:meth:`~.transport.AmqpTransport._split`). From there on each
task has a delivery count of its own: a poison task crashing its worker is dead-lettered
alone, and the tasks delivered with it run once. A pack that RabbitMQ dead-letters itself is
split by the dead-letter drain (``custody.py``): each task not committed is published again
alone, marked as delivered once, or, with ``max_deliveries=1``, becomes a dead letter.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from ..factory import AMQP_MAX_PACK

__all__ = [
    "DEFAULT_MAX_PACK",
    "MAGIC",
    "MAX_PACK",
    "PACK_BYTES",
    "PACK_HEADER",
    "SPREAD",
    "Pack",
    "decode",
    "encode",
    "is_pack",
    "pack_size",
    "packed",
]

#: AMQP header marking a pack; its value is the format version.
PACK_HEADER = "x-blitzq-pack"
#: Format version of the packs this module writes.
VERSION = 1
#: First bytes of a pack's body (``0xc1`` is never a MessagePack byte: not an envelope).
MAGIC = b"\xc1bq-pack\x01"
#: Tasks per AMQP message at most, unless the URL's ``?pack=`` says otherwise.
DEFAULT_MAX_PACK = 32
#: Bytes of task messages a pack holds at most (RabbitMQ refuses messages over its
#: ``max_message_size``, 16 MiB by default since 4.0; a pack stays far below it).
PACK_BYTES = 1 << 20
#: Largest ``?pack=`` accepted.
MAX_PACK = AMQP_MAX_PACK
#: A packed publish yields at least this many AMQP messages (RabbitMQ spreads messages, not
#: tasks, over consumers: a small batch in a few packs would load one worker).
SPREAD = 64

_LENGTH = struct.Struct(">I")


def pack_size(count: int, max_pack: int) -> int:
    """Tasks per pack for a publish of ``count`` messages to one queue: ``min(max_pack,
    count // SPREAD)``; 1 or less means no packs (fewer than ``2 * SPREAD`` messages, or
    ``max_pack`` 1)."""
    return min(max_pack, count // SPREAD)


def encode(bodies: Sequence[bytes]) -> bytes:
    """The body of a pack of ``bodies`` (task messages, in order); see the module
    docstring."""
    length = _LENGTH.pack
    parts = [MAGIC]
    for body in bodies:
        parts.append(length(len(body)))
        parts.append(body)
    return b"".join(parts)


def packed(messages: Sequence[bytes], size: int) -> list[bytes]:
    """``messages`` in packs of ``size``, in order; a pack is closed early once it holds
    :data:`PACK_BYTES` of messages (large tasks travel in smaller packs, a message that
    large alone), and the last one holds what is left."""
    out: list[bytes] = []
    group: list[bytes] = []
    held = 0
    for message in messages:
        if group and (len(group) == size or held + len(message) > PACK_BYTES):
            out.append(encode(group))
            group, held = [], 0
        group.append(message)
        held += len(message)
    if group:
        out.append(encode(group))
    return out


def decode(body: bytes) -> list[bytes] | None:
    """The task messages of a pack's ``body``, in order; ``None`` when it is not a
    well-formed pack (the worker then dead-letters the body as a malformed message)."""
    if not body.startswith(MAGIC):
        return None
    out: list[bytes] = []
    at, end = len(MAGIC), len(body)
    unpack_from = _LENGTH.unpack_from
    while at < end:
        if at + 4 > end:
            return None
        (size,) = unpack_from(body, at)
        at += 4
        if at + size > end:
            return None
        out.append(body[at : at + size])
        at += size
    return out or None


def is_pack(headers: Mapping[str, object] | None) -> bool:
    """Whether a message with the AMQP ``headers`` is a pack."""
    return headers is not None and PACK_HEADER in headers


class Pack:
    """The tasks of one received pack not settled yet: its AMQP message is acked when the
    last one is (:meth:`settled`).

    Args:
        left: the pack's task count.
    """

    __slots__ = ("left",)

    def __init__(self, left: int) -> None:
        self.left = left

    def settled(self) -> bool:
        """Count one task settled; whether it was the last (then ack the message)."""
        self.left -= 1
        return self.left == 0
