"""Stream entries as deliveries: the message field ``m`` and the delivery count ``d`` that
``recover.lua`` writes, and the dead letter's words for an entry without a message (one
reading for the streams transport's fetches and the handed-over entries of ``handed.py``).
"""

from __future__ import annotations

from ..transport import Delivery, MalformedDelivery
from .keys import MESSAGE_FIELD


def entry_delivery(queue: str, entry_id: bytes, fields: list[bytes]) -> Delivery:
    """A Delivery from a stream entry's fields ("m" the message, "d" the delivery count).

    An entry without "m" gives a :class:`~blitzq.broker.transport.MalformedDelivery` whose
    ``fault`` names the fields it holds (the worker's dead letter says so). A "d" that is no
    int >= 1 (recover.lua writes 2 and up; anything else was planted) gives
    ``deliveries`` 0, which the worker dead-letters as a malformed message; a huge one is
    clipped to 1,000,000 (past any ``max_deliveries``: dead-lettered as exceeded).
    """
    if len(fields) == 2 and fields[0] == MESSAGE_FIELD:
        return Delivery(queue, entry_id, fields[1], 1)
    payload, deliveries = None, 1
    for j in range(0, len(fields) - 1, 2):
        if fields[j] == MESSAGE_FIELD:
            payload = fields[j + 1]
        elif fields[j] == b"d":
            raw = fields[j + 1]
            deliveries = min(int(raw), 1_000_000) if raw.isdigit() else 0
    if payload is None:
        return MalformedDelivery.of(queue, entry_id, deliveries, missing_message(fields))
    return Delivery(queue, entry_id, payload, deliveries)


def missing_message(fields: list[bytes]) -> str:
    """The dead letter's error for a stream entry without the message field ``m``, naming
    the fields it holds (at most 10, each cut to 40 characters)."""
    names = [f[:40].decode("utf-8", "replace") for f in fields[0:20:2]]
    more = ", ..." if len(fields) > 20 else ""
    found = ", ".join(repr(n) for n in names) + more if names else "none"
    return (
        f'the stream entry has no message field "m" (not written by blitzq?); fields found: {found}'
    )
