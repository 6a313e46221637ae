"""Checks of what crosses the broker, beyond its decoding (:mod:`blitzq.serialization`).

- :func:`envelope_fault`, :func:`options_fault`: a received message's fields, checked once by
  the worker when it decodes the message against the rules a call's fields have at enqueue
  (:data:`~blitzq.options.FIELD_RULES`; a bad one is dead-lettered as ``malformed message``);
- :func:`value_size`: the size of an encoded value that ``max_result_size`` counts (what the
  task returned, not the MessagePack header around it nor the record's own fields).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any, Final

from .exceptions import ConfigurationError
from .limits import MAX_ATTEMPT, MAX_CLOCK_AHEAD, MAX_TASK_ID
from .options import FIELD_RULES
from .serialization import Envelope

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .options import Option

#: What a name (a task id) may not hold: :func:`~blitzq.routing.check_name`'s rule, searched
#: once per message on the worker's hot path (the rule itself,
#: :func:`~blitzq.routing.check_task_id`, words the error).
_NOT_IN_NAMES: Final = re.compile("[{}\n\r\0 ]")

#: The fields with a rule of :data:`~blitzq.options.FIELD_RULES` that may be ``None``.
_OPTIONAL: Final = ("timeout", "max_age", "correlation_id", "unique_key", "deferrals")


def usable_id(task_id: object) -> bool:
    """Whether ``task_id`` passes the rule of a task id (``FIELD_RULES["id"]``,
    :func:`~blitzq.routing.check_task_id`; valid Unicode text aside, which a decoded message
    always is): a record and a dead letter may be written under it."""
    return (
        type(task_id) is str
        and 0 < len(task_id) <= MAX_TASK_ID
        and _NOT_IN_NAMES.search(task_id) is None
    )


#: Characters of a bad field's value a fault quotes at most (a dead letter's reason is shown
#: on one line by the CLI and the dashboard: a 100,000-character id is not).
_SHOWN: Final = 80


def _broken(name: str, value: Any) -> str | None:
    """The error of ``FIELD_RULES[name]`` on ``value``, as a fault (the value quoted up to
    :data:`_SHOWN` characters), or ``None``."""
    try:
        FIELD_RULES[name](name, value)
    except ConfigurationError as exc:
        shown = repr(value)
        if len(shown) > _SHOWN:
            shown = f"{shown[: _SHOWN - 20]}... ({len(shown)} characters)"
        return f"{name} is {shown}: {exc}"
    return None


def envelope_fault(env: Envelope, now: float) -> str | None:
    """What makes a decoded envelope unusable, or ``None`` when it passes every rule. The
    worker checks every message here, once, before anything reads it: a message failing it
    is dead-lettered as ``malformed message`` with this text (which names the field) instead
    of running, waiting, retrying or timing out on a value that never settles.

    A field a call sets is checked against the rule it has at enqueue
    (:data:`~blitzq.options.FIELD_RULES`, shared with :class:`~blitzq.options.CallOptions`),
    so a message written by hand or by a broken producer holds no value ``task.options``
    refuses. Per-call options are checked by :func:`options_fault` once the task is known.

    Args:
        env: the decoded message.
        now: the worker's clock, Unix seconds.

    Returns:
        ``None``, or the first bad field, its value and its rule:

        - ``id``: a non-empty str of at most :data:`~blitzq.limits.MAX_TASK_ID` characters,
          without spaces, braces or newlines (``task_id``'s rule);
        - ``created_at``, ``enqueued_at``: finite Unix seconds, >= 0 and at most
          :data:`~blitzq.limits.MAX_CLOCK_AHEAD` seconds past ``now`` (0 is an unknown time);
        - ``attempt``: an int from 1 to :data:`~blitzq.limits.MAX_ATTEMPT`;
        - ``deferrals``: ``None``, or an int from 1 to ``MAX_ATTEMPT``;
        - ``timeout``, ``max_age``: ``None``, or finite seconds > 0 and at most
          :data:`~blitzq.limits.MAX_SECONDS`;
        - ``correlation_id``, ``unique_key``: ``None``, or a non-empty str.
    """
    latest = now + MAX_CLOCK_AHEAD
    # NaN fails every comparison, so each line below refuses it along with the range.
    if (
        0.0 <= env.created_at <= latest
        and 0.0 <= env.enqueued_at <= latest
        and 1 <= env.attempt <= MAX_ATTEMPT
        and env.timeout is None
        and env.max_age is None
        and env.deferrals is None
        and env.correlation_id is None
        and env.unique_key is None
        and len(env.id) <= MAX_TASK_ID
        and (env.id.isalnum() or usable_id(env.id))  # isalnum: a generated id, at C speed
    ):
        return None  # the common message: no per-call field set
    if not usable_id(env.id):
        return _broken("id", env.id)
    for name in ("created_at", "enqueued_at"):
        value = getattr(env, name)
        if not math.isfinite(value) or value < 0.0:
            return f"{name} is {value!r}: not a finite Unix time >= 0"
        if value > latest:
            return (
                f"{name} is {value!r}: {value - now:.0f} s ahead of this worker's clock "
                f"(at most {MAX_CLOCK_AHEAD:g} s ahead is accepted)"
            )
    fault = _broken("attempt", env.attempt)
    for name in _OPTIONAL:
        if fault is not None:
            return fault
        value = getattr(env, name)
        fault = None if value is None else _broken(name, value)
    return fault


def options_fault(options: Mapping[str, Any], declared: Mapping[str, Option]) -> str | None:
    """What makes a message's per-call options (``Envelope.options``) unusable by the task
    it calls, or ``None``: each option one of the task's middleware declares
    (:attr:`Task.call_controls <blitzq.Task.call_controls>`) must pass that option's check, as
    :func:`~blitzq.options.call_options` requires at enqueue (a ``None`` value is no option).
    An option no middleware here declares is left alone, not refused: during a rolling
    deploy a newer producer may send one that this older worker does not know yet.

    Args:
        options: the message's ``options`` field.
        declared: the per-call options the task's middleware declare, by name.

    Returns:
        ``None``, or ``options.<name> is <value>: <why>``.
    """
    for name, value in options.items():
        if value is None:
            continue
        option = declared.get(name)
        if option is None:  # a newer producer's option: no middleware here reads it
            continue
        if option.check is not None:
            try:
                option.check(name, value)
            except ConfigurationError as exc:
                return f"options.{name} is {value!r}: {exc}"
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
