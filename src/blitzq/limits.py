"""Size and batch bounds: every value blitzq sends to Redis in one call is bounded by one
of these (docs/configuration.md lists them with their defaults).

Sizes are in bytes, times in seconds, batches in items.
"""

from __future__ import annotations

from typing import Final

#: Most levels of lists, tuples and dicts one value may nest (``[[...]]`` is 2): each task
#: argument, keyword argument, header and return value, checked where it is encoded (at
#: enqueue, and as a worker stores a result). One number for both sides, well inside the
#: recursion limits of the encoder and decoder at any stack depth, so an accepted argument
#: is always decoded and re-encoded by the worker, and a deeper value gets a
#: ``SerializationError`` naming this limit instead of a ``RecursionError``.
MAX_NESTING: Final = 100

#: Default ``Queue(max_result_size=)``: largest encoded return value (without the record's
#: own fields: exactly 8 MiB of bytes fit); a larger result fails the task with
#: ``ResultTooLarge``.
DEFAULT_MAX_RESULT_SIZE: Final = 8 * 1024 * 1024

#: Default ``Queue(dead_letter_ttl=)``: seconds a dead letter is kept (7 days).
DEFAULT_DEAD_LETTER_TTL: Final = 7 * 86400

#: Default ``Queue(dead_letter_max_bytes=)``: total bytes of stored dead letters before the
#: oldest are dropped.
DEFAULT_DEAD_LETTER_MAX_BYTES: Final = 256 * 1024 * 1024

#: A task record up to this size is pushed on its done channel with the notification (the
#: waiter needs no read); a larger one is announced with a bare notification and read back.
NOTIFY_INLINE_MAX: Final = 4096

#: Most items one Redis call of a producer or of an admin command carries when each item is
#: one write (a message published, a unique key claimed, an id read); larger batches are
#: split into several calls, each well under ~20 ms of server time (see bench/chunking.py).
CHUNK_ITEMS: Final = 1000

#: The same when each item is several writes (a scheduled message: ZADD + HSET; a record:
#: SET + PUBLISH; a dead letter deleted: four commands).
CHUNK_WRITES: Final = 500

#: Most completions the worker's flusher sends in one call (a group commit of 1000 records
#: takes a few ms of server time; 2000 took up to ~40 ms on a loaded machine).
COMPLETION_BATCH_ITEMS: Final = 1000

#: Most bytes of completions the worker's flusher sends in one call (at least one completion
#: always goes, whatever its size).
COMPLETION_BATCH_BYTES: Final = 4 * 1024 * 1024

#: Longest error message kept in a task record or dead letter (characters); longer ones are
#: cut with a note of the original length.
MAX_ERROR_CHARS: Final = 8000

#: A message over ``max_message_size`` is dead-lettered with only its first bytes kept.
DEAD_MESSAGE_SAMPLE: Final = 1024


def clip_text(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was when cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters in all)"


#: Longest duration any option takes, in seconds (ten years of 365 days): ``delay``, how far
#: ahead an ``eta`` may be, task and call timeouts, ``max_age``, TTLs, the visibility timeout
#: and the worker's shutdown timeout. Longer values are refused with ConfigurationError.
MAX_SECONDS: Final = 10 * 365 * 86400

#: Most seconds a time read from a message (``created_at``, ``enqueued_at``: the producer's
#: clock) may be ahead of the worker's clock; a later one is dead-lettered as malformed. It
#: bounds how long such a message can be deferred (an unknown task's grace counts from
#: ``created_at``) and covers any sane clock skew between hosts.
MAX_CLOCK_AHEAD: Final = 3600.0

#: Largest ``attempt`` number a message may carry (1-based); a larger one, zero or a negative
#: one is dead-lettered as malformed.
MAX_ATTEMPT: Final = 2**31 - 1

#: Deepest nesting of lists and objects in JSON a user hands blitzq (``blitzq schedule add
#: --args``/``--kwargs``, the dashboard's request bodies); deeper is refused with
#: ConfigurationError (CLI exit 2, dashboard 400) before it can exhaust the recursion limit.
MAX_JSON_DEPTH: Final = 32

#: Longest task id (characters): a ``task_id`` chosen at enqueue, and every id a lookup takes
#: (``inspect``, ``cancel``, ``get_result``, ``blitzq task inspect``, the dashboard's routes),
#: by one rule (:func:`blitzq.routing.check_task_id`). Generated ids are 24 characters
#: (:func:`blitzq.routing.new_task_id`; on the spread layout 32 hex digits, ``.`` and the queue).
MAX_TASK_ID: Final = 512

#: Longest queue name, namespace or task name (characters, :func:`blitzq.routing.check_name`):
#: an error that quotes a refused or unknown one stays short.
MAX_NAME: Final = 512

#: Longest periodic entry name (characters), code-defined or run-time: an occurrence's task id
#: is ``periodic:<name>:<Unix seconds>`` (:meth:`blitzq.periodic.PeriodicTask.task_id`), which
#: must fit :data:`MAX_TASK_ID` with up to 20 digits of seconds.
MAX_PERIODIC_NAME: Final = MAX_TASK_ID - len("periodic::") - 20

#: Largest request body the dashboard's JSON API reads (bytes); a larger one is answered 413
#: without being read whole.
MAX_REQUEST_BODY: Final = 64 * 1024
