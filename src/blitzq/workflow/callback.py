"""The bytes of a chord callback's message: where the members' results go, and editing it.

A chord member's completion carries the callback's message in two pieces (``ChordMember``
``head`` and ``tail``): the broker fires the callback with ``head`` + the array of the
members' results + ``tail`` (``splice`` 1), or ``head`` as it is (``splice`` 0, an immutable
callback). The pieces are made by encoding the message with a unique placeholder argument
(:func:`marker`) and cutting it out (:func:`split`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import msgspec

from ..broker.effects import ChordMember
from ..exceptions import SerializationError
from ..serialization import Envelope, decode_envelope, dumps, encode_envelope


def array_header(n: int) -> bytes:
    """MessagePack header of an array of ``n`` items."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 65536:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def marker() -> bytes:
    """A fresh placeholder argument marking where a chord's results go in its callback."""
    return b"\x00blitzq-chord-results:" + uuid.uuid4().bytes


def split(data: bytes, placeholder: bytes, size: int) -> tuple[bytes, bytes]:
    """``head`` and ``tail`` of a callback message ``data`` holding ``placeholder`` as the
    argument the ``size`` results replace."""
    encoded = dumps(placeholder)
    at = data.find(encoded)
    if at < 0:  # pragma: no cover - the marker is always encoded as is
        raise SerializationError("could not place the chord results in the callback")
    return data[:at] + array_header(size), data[at + len(encoded) :]


def rewrite_chord_callback(
    op: ChordMember, change: Callable[[Envelope], Envelope], max_size: int
) -> ChordMember:
    """``op`` with the message of the chord callback it may fire replaced by
    ``change(envelope)`` (for a finisher that edits the callback's headers, say); ``op``
    itself when it fires no callback (a group ending the workflow).

    Raises:
        MessageTooLarge: the changed message is over ``max_size`` bytes.
    """
    if not op.queue:
        return op
    if not op.splice:
        env = change(decode_envelope(op.head + op.tail))
        return msgspec.structs.replace(op, head=encode_envelope(env, max_size), tail=b"")
    header = array_header(op.size)
    if not op.head.endswith(header):  # pragma: no cover - built by the engine's chord_op
        raise SerializationError("not a chord callback message")
    placeholder = marker()
    env = change(decode_envelope(op.head[: -len(header)] + dumps(placeholder) + op.tail))
    head, tail = split(encode_envelope(env, max_size), placeholder, op.size)
    return msgspec.structs.replace(op, head=head, tail=tail)


__all__ = ["array_header", "marker", "rewrite_chord_callback", "split"]
