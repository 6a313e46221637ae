"""Checks of what crosses the broker, beyond its decoding (:mod:`blitzq.serialization`).

- :func:`envelope_fault`: a received message's times and numbers, checked once by the worker
  when it decodes the message (a bad one is dead-lettered as ``malformed message``);
- :func:`value_size`: the size of an encoded value that ``max_result_size`` counts (what the
  task returned, not the MessagePack header around it nor the record's own fields).
"""

from __future__ import annotations

import math
from typing import Final

from .limits import MAX_ATTEMPT, MAX_CLOCK_AHEAD, MAX_SECONDS
from .serialization import Envelope


def envelope_fault(env: Envelope, now: float) -> str | None:
    """What makes a decoded envelope's times or numbers unusable, or ``None`` when they are
    all usable. The worker checks every message here, once, before anything reads them: a
    message failing it is dead-lettered as ``malformed message`` with this text (which names
    the field) instead of waiting, retrying or timing out on a value that never settles.

    Args:
        env: the decoded message.
        now: the worker's clock, Unix seconds.

    Returns:
        ``None``, or the first bad field, its value and its allowed range:

        - ``created_at``, ``enqueued_at``: finite Unix seconds, >= 0 and at most
          :data:`~blitzq.limits.MAX_CLOCK_AHEAD` seconds past ``now`` (0 is an unknown time);
        - ``attempt``: an int from 1 to :data:`~blitzq.limits.MAX_ATTEMPT`;
        - ``timeout``, ``max_age``: ``None``, or finite seconds > 0 and at most
          :data:`~blitzq.limits.MAX_SECONDS` (what :class:`~blitzq.options.CallOptions`
          accepts from a producer).
    """
    latest = now + MAX_CLOCK_AHEAD
    # NaN fails every comparison, so each line below refuses it along with the range.
    if (
        0.0 <= env.created_at <= latest
        and 0.0 <= env.enqueued_at <= latest
        and 1 <= env.attempt <= MAX_ATTEMPT
        and env.timeout is None
        and env.max_age is None
    ):
        return None  # the common message: no per-call timeout or max_age
    for name in ("created_at", "enqueued_at"):
        value = getattr(env, name)
        if not math.isfinite(value) or value < 0.0:
            return f"{name} is {value!r}: not a finite Unix time >= 0"
        if value > latest:
            return (
                f"{name} is {value!r}: {value - now:.0f} s ahead of this worker's clock "
                f"(at most {MAX_CLOCK_AHEAD:g} s ahead is accepted)"
            )
    if not 1 <= env.attempt <= MAX_ATTEMPT:
        return f"attempt is {env.attempt!r}: not an attempt number from 1 to {MAX_ATTEMPT}"
    for name in ("timeout", "max_age"):
        value = getattr(env, name)
        if value is not None and not 0.0 < value <= MAX_SECONDS:
            return f"{name} is {value!r}: not a finite number of seconds > 0 and <= {MAX_SECONDS}"
    return None


#: Bytes of the outermost MessagePack type-and-length header, by its first byte, for the
#: types that have one (str, bin, array, map, ext); any other value has none.
_HEADER_BYTES: Final = {
    **dict.fromkeys(range(0x80, 0xC0), 1),  # fixmap, fixarray, fixstr
    **dict.fromkeys((0xC4, 0xD9), 2),  # bin 8, str 8
    **dict.fromkeys((0xC5, 0xDA, 0xDC, 0xDE), 3),  # bin 16, str 16, array 16, map 16
    **dict.fromkeys((0xC6, 0xDB, 0xDD, 0xDF), 5),  # bin 32, str 32, array 32, map 32
    **dict.fromkeys(range(0xD4, 0xD9), 2),  # fixext 1..16
    0xC7: 3,  # ext 8
    0xC8: 4,  # ext 16
    0xC9: 6,  # ext 32
}


def value_size(data: bytes) -> int:
    """Size in bytes of one encoded value (:func:`dumps`) without its outermost MessagePack
    type-and-length header (1 to 6 bytes), which is what ``max_result_size`` limits: a
    ``bytes`` value counts its length, a ``str`` its UTF-8 length, a list or dict its encoded
    items, a number its whole encoding.

    Args:
        data: the encoded value.
    """
    if not data:
        return 0
    return len(data) - _HEADER_BYTES.get(data[0], 0)
