"""Queue names: priority levels and routing rules.

Priority is not a field on the message: a task enqueued with ``priority="high"`` on queue
``default`` is published to the physical queue ``default:high`` (and ``"low"`` to
``default:low``), and every worker of ``default`` takes from ``default:high``, ``default``,
``default:low`` in that order on every batch. The names are visible everywhere (handles,
records, dead letters, stats); nothing is mangled.

Routing picks the queue of a task by name when neither the call nor the decorator names one:
glob patterns (``fnmatch``) tried in order, or a callable returning a queue name or ``None``.

Task ids: the rule every id must follow (:func:`check_task_id`) and the form of a generated
one (:func:`new_task_id`).
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Callable, Mapping
from typing import Any, Literal

from .exceptions import ConfigurationError, SerializationError
from .limits import MAX_NAME, MAX_PERIODIC_NAME, MAX_TASK_ID
from .redaction import mask_url, redact
from .serialization import lookup_key

Priority = Literal["high", "normal", "low"]
PRIORITIES: tuple[str, ...] = ("high", "normal", "low")
_SUFFIX = {"high": ":high", "normal": "", "low": ":low"}

Routes = Mapping[str, str] | Callable[[str], str | None]

#: The characters of a generated task id: RFC 4648's base32 alphabet in lower case (a-z, 2-7):
#: letters and digits only (``str.isalnum``, the worker's fast check of a message's id), no
#: ``-`` a command line would read as an option, nothing a URL or a shell quotes.
ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
#: ``bytes.translate`` table from a random byte to the character of its low 5 bits (each of
#: the 32 characters from 8 byte values: uniform).
ID_CHARS = bytes(ID_ALPHABET.encode()[b & 31] for b in range(256))
#: Characters of a generated task id: 24 of 5 random bits each, 120 bits; at most 31, so it
#: is a MessagePack fixstr (one byte of header: 25 bytes in a message).
ID_LENGTH = 24
#: Most ids a batch (``enqueue_many``, ``send_many``) generates with one ``os.urandom`` call
#: (:func:`new_task_ids`; a larger batch takes another block when one is used up).
ID_BLOCK = 1000


def check_name(kind: str, value: str) -> str:
    """Return ``value`` if it is usable as a queue name, namespace or task name.

    Raises:
        ConfigurationError: empty, not a string, longer than
            :data:`~blitzq.limits.MAX_NAME` characters, or holding spaces, braces or
            newlines (the value quoted cut to 80 characters).
    """
    if not isinstance(value, str) or not value or any(c in value for c in "{}\n\r\0 "):
        shown = (
            repr(value[:80] + "...") if isinstance(value, str) and len(value) > 80 else repr(value)
        )
        raise ConfigurationError(
            f"{kind} must be a non-empty string without spaces, braces or newlines, "
            f"got {redact(shown)}"  # a URL given in the wrong place: masked
        )
    if len(value) > MAX_NAME:
        raise ConfigurationError(
            f"{kind} must be at most {MAX_NAME} characters, got {len(value)} "
            f"({redact(repr(value[:40]))}...)"
        )
    return value


def check_task_name(value: Any) -> str:
    """Return ``value`` if it is usable as a task name: the one rule of a task name, applied
    where one is given (``@queue.task(name=...)``, ``queue.send(name)``, ``send_many``), the
    rule of queue names and namespaces (:func:`check_name`) in valid Unicode text. Dotted
    paths (``"myapp.tasks.add"``), colons, dashes and ``<locals>`` (a default name) pass.

    Raises:
        ConfigurationError: not a ``str``, empty, holding a space, brace, newline or NUL,
            or not valid Unicode text (a lone surrogate).
    """
    try:
        return lookup_key("task name", check_name("task name", value))
    except SerializationError as exc:
        raise ConfigurationError(str(exc)) from None


def check_task_id(kind: str, value: Any) -> str:
    """Return ``value`` if it is usable as a task id: the one rule of a task id, wherever one
    enters (``task.options(task_id=...)`` and ``send`` at enqueue, a worker decoding a message
    through :data:`~blitzq.options.FIELD_RULES`, and every lookup: ``inspect``, ``cancel``,
    ``get_result``, ``get_progress``, ``retry``, the CLI's ``TASK_ID``, the dashboard's routes),
    so an id one of them refuses is refused by all, and one enqueue accepts is found by all.

    Args:
        kind: what the value is, for the message (``"task id"``, ``"task_id"``).
        value: the id given.

    Returns:
        ``value``: a non-empty ``str`` of valid Unicode text, at most
        :data:`~blitzq.limits.MAX_TASK_ID` characters, without spaces, braces, newlines or NUL
        (:func:`check_name`).

    Raises:
        ConfigurationError: not a ``str``, empty, too long, or holding one of those characters.
        SerializationError: not valid Unicode text (a lone surrogate, or a command-line
            argument that was not UTF-8; :func:`~blitzq.serialization.lookup_key`).
    """
    if not isinstance(value, str):
        raise ConfigurationError(f"{kind} must be a str, got {redact(repr(value))}")
    if len(value) > MAX_TASK_ID:  # before check_name quotes it
        raise ConfigurationError(
            f"{kind} must be at most {MAX_TASK_ID} characters, got {len(value)} "
            f"({redact(repr(value[:40]))}...)"
        )
    return lookup_key(kind, check_name(kind, value))


def check_periodic_name(kind: str, value: Any) -> str:
    """Return ``value`` if it is usable as a periodic entry's name (``queue.periodic(name=)``,
    its task's name by default, or ``blitzq schedule add NAME``): what :func:`check_name`
    takes, in valid Unicode text, of at most :data:`~blitzq.limits.MAX_PERIODIC_NAME`
    characters, so that every occurrence's task id (``periodic:<name>:<seconds>``) is one
    :func:`check_task_id` accepts.

    Raises:
        ConfigurationError: not a ``str``, empty, too long, or holding a space, brace,
            newline or NUL.
        SerializationError: not valid Unicode text (a lone surrogate).
    """
    if isinstance(value, str) and len(value) > MAX_PERIODIC_NAME:  # before check_name quotes it
        raise ConfigurationError(
            f"{kind} must be at most {MAX_PERIODIC_NAME} characters (its occurrences' task "
            f"ids are periodic:<name>:<seconds>), got {len(value)} ({redact(repr(value[:40]))}...)"
        )
    return lookup_key(kind, check_name(kind, value))


def new_task_id() -> str:
    """A new task id: :data:`ID_LENGTH` (24) characters of :data:`ID_ALPHABET`, 120 random
    bits from ``os.urandom`` (fork-safe, no state to share), such as
    ``"k3qz7m2xw4ab5tqhn6vcr2e7"``. What an enqueue without ``task_id=`` gets, unless the broker
    makes its own (``Broker.task_ids``: the spread layout's homed ids). Workers of every
    release read it as an opaque string, as any id :func:`check_task_id` accepts.
    ``Producer.envelope`` inlines this expression (the enqueue's hot path).
    """
    return os.urandom(ID_LENGTH).translate(ID_CHARS).decode()


def new_task_ids(count: int) -> list[str]:
    """``count`` new task ids, each of :func:`new_task_id`'s form and 120 random bits of its
    own, from one ``os.urandom`` call (a batch's ids: about half the CPU of one call each).

    Args:
        count: how many, >= 0.
    """
    step = ID_LENGTH + 1
    raw = bytearray(os.urandom(step * count)).translate(ID_CHARS)
    raw[ID_LENGTH::step] = b" " * count  # a separator after each id, then one split in C
    return raw.decode().split()


def check_namespace(value: str) -> str:
    """Return ``value`` if it is usable as a namespace: what :func:`check_name` takes, in
    valid Unicode text (:func:`~blitzq.serialization.lookup_key`).

    Raises:
        ConfigurationError: either not (a lone surrogate too, such as an environment
            variable that was not UTF-8 gives).
    """
    try:
        return lookup_key("namespace", check_name("namespace", value))
    except SerializationError as exc:
        raise ConfigurationError(str(exc)) from None


def check_queue_name(kind: str, value: str) -> str:
    """Return ``value`` if it is usable as a *logical* queue name (what a Queue, a task, a
    route or a periodic entry names; the priority lanes are derived from it).

    Args:
        kind: what the value is, for the message (``"queue name"``, ``"queue"``).
        value: the name given.

    Raises:
        ConfigurationError: what :func:`check_name` refuses, a URL (``"://"``: the first
            argument of ``Queue`` is its name, the server is ``redis_url=``), or a name ending
            in a priority lane suffix (``":high"``, ``":low"``), which would share the physical
            queue of another queue's lane.
    """
    check_name(kind, value)
    if "://" in value:
        shown = mask_url(value)
        raise ConfigurationError(
            f"{kind} {shown!r} looks like a URL; a queue name is a plain name "
            f"(give the server as Queue(redis_url={shown!r}))"
        )
    for priority, suffix in _SUFFIX.items():
        if suffix and value.endswith(suffix):
            base = value[: -len(suffix)]
            raise ConfigurationError(
                f"{kind} {value!r} ends in {suffix!r}, the suffix of the {priority}-priority "
                f"lane of queue {base!r}: use the base queue name {base!r} (a worker of "
                f"{base!r} serves every level: {base}:high, {base}, {base}:low) with "
                f"priority={priority!r}, or another name"
            )
    return value


def check_priority(priority: str) -> Priority:
    """Return ``priority`` if it is a known level.

    Raises:
        ConfigurationError: anything but "high", "normal" or "low".
    """
    if priority not in _SUFFIX:
        raise ConfigurationError(f"priority must be 'high', 'normal' or 'low', got {priority!r}")
    return priority  # type: ignore[return-value]


def physical_queue(queue: str, priority: str) -> str:
    """Physical queue of ``queue`` at ``priority`` (``"default:high"``, ``"default"``, …)."""
    return queue + _SUFFIX[check_priority(priority)]


def levels(queue: str) -> list[str]:
    """The physical queues a worker of ``queue`` takes from, highest priority first."""
    return [queue + ":high", queue, queue + ":low"]


def base_queue(physical: str) -> str:
    """The queue a physical queue belongs to (``"default:low"`` → ``"default"``)."""
    for suffix in (":high", ":low"):
        if physical.endswith(suffix):
            return physical[: -len(suffix)]
    return physical


def route(routes: Routes | None, task_name: str) -> str | None:
    """The queue ``routes`` give ``task_name``, or ``None`` when no rule matches."""
    if routes is None:
        return None
    if callable(routes):
        return routes(task_name)
    for pattern, queue in routes.items():
        if fnmatch.fnmatchcase(task_name, pattern):
            return queue
    return None
