"""The blitzq error tree.

Every error blitzq raises derives from :class:`BlitzQError`, so callers can catch broadly and
recover narrowly::

    BlitzQError
    ├── ConfigurationError      bad constructor argument, env var or CLI flag
    ├── SerializationError      an argument or result that is not plain data
    │   ├── MessageTooLarge     an encoded message over ``max_message_size``
    │   └── ResultTooLarge      a task's encoded return value over ``max_result_size``
    ├── TaskFailed              the task ended in a failed / dead-lettered state
    │   ├── TaskCancelled       the task was cancelled
    │   └── TaskExpired         the task waited longer than its ``max_age`` and never ran
    ├── TaskTimeout             the task ran longer than its ``timeout``
    │   └── SoftTimeoutError    raised inside a task that passed its ``soft_timeout``
    ├── ResultTimeout           ``result(timeout=...)`` gave up waiting
    │   └── ResultExpired       the record waited for is gone for good (expired): no result
    ├── ResultNotStored         the task succeeded (or will) without storing its result
    ├── UnknownTask             no task registered under that name
    ├── UnknownQueue            an operator's action names a queue nothing has used
    └── BrokerError             the broker could not be reached or answered an error
        ├── OutcomeUnknown      a write was sent but its reply was lost: maybe applied
        └── EmbeddedServerNotFound  no running embedded server for a read-only command
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
from collections.abc import Iterable, Iterator
from typing import TypeVar

from .limits import MAX_ERROR_CHARS, clip_text


class BlitzQError(Exception):
    """Root of every error raised by blitzq."""


class ConfigurationError(BlitzQError, ValueError):
    """A setting is invalid: a bad argument, environment variable or CLI flag."""


class SerializationError(BlitzQError, TypeError):
    """A value cannot be encoded as plain data, or a message cannot be decoded."""


E = TypeVar("E", bound=BaseException)


def itemized(exc: E, what: str) -> E:
    """``exc`` with ``what`` (``"send_many item 3"``) before its message, unless it names it
    already; the same object, its type and attributes kept (a batch's error names the item).

    Args:
        exc: the error an item of a batch raised.
        what: the item, as the message names it.
    """
    if exc.args and isinstance(exc.args[0], str) and not exc.args[0].startswith(what):
        exc.args = (f"{what}: {exc.args[0]}", *exc.args[1:])
    return exc


class MessageTooLarge(SerializationError):
    """An encoded message is larger than the queue's ``max_message_size`` (bytes): the
    limit counts the whole message as it crosses the broker, the arguments and the
    envelope's own fields (id, task and queue names, times: about 60 bytes and up).

    Args:
        size: the encoded size in bytes.
        limit: the configured limit in bytes.
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"message of {size} bytes is over the limit of {limit} bytes "
            "(max_message_size counts the whole encoded message: arguments and envelope)"
        )
        self.size = size
        self.limit = limit


class ResultTooLarge(SerializationError):
    """A task's return value, encoded, is larger than the queue's ``max_result_size``
    (bytes); the task fails with this error instead of storing it. The size counts what the
    task returned (a ``bytes`` value its length, a ``str`` its UTF-8 length, a list or dict
    its encoded items), not the record's own fields (:func:`blitzq.envelope_checks.value_size`).

    Args:
        size: the encoded size in bytes.
        limit: the configured limit in bytes.
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"result of {size} bytes is over the limit of {limit} bytes "
            "(max_result_size counts the encoded value the task returned)"
        )
        self.size = size
        self.limit = limit


class UnknownTask(BlitzQError, LookupError):
    """No task is registered under the given name."""


class UnknownQueue(BlitzQError, LookupError):
    """An operator's action (pause, resume or purge a queue: ``blitzq queue ...``, the
    dashboard) names a queue nothing has used in the namespace: no producer sent to it, no
    worker or scheduler served it, it holds no message and is not paused (a typo, or the
    wrong namespace). Nothing was changed. The CLI's ``--force`` (the dashboard's
    ``"force": true``) acts all the same: to pause a queue before its first task.

    Attributes:
        queue: the queue name given.
        namespace: the namespace it was looked for in.
    """

    def __init__(self, queue: str, namespace: str) -> None:
        super().__init__(
            f"unknown queue {queue!r} in namespace {namespace!r}: no producer, worker or "
            "scheduler has used it, it holds no message and is not paused (check the name "
            "and --namespace; --force acts on it all the same)"
        )
        self.queue = queue
        self.namespace = namespace


class TaskFailed(BlitzQError):
    """A task ended in a final failed state; ``result()`` raises it.

    Attributes:
        task_id: id of the task.
        state: the final state (``"failed"`` or ``"dead_lettered"``).
        error_type: qualified name of the exception the task raised, or a reason.
        error: the exception's message.
        traceback: the formatted traceback, when the worker captured one.
    """

    def __init__(
        self,
        task_id: str,
        state: str,
        error_type: str | None,
        error: str | None,
        traceback: str | None = None,
    ) -> None:
        super().__init__(f"task {task_id} {state}: {error_type}: {error}")
        self.task_id = task_id
        self.state = state
        self.error_type = error_type
        self.error = error
        self.traceback = traceback


class TaskCancelled(TaskFailed):
    """The task was cancelled (``handle.cancel()``); ``result()`` raises it."""


class TaskExpired(TaskFailed):
    """The task waited longer than its ``max_age`` before a worker could start it; it was
    dead-lettered (reason ``"expired"``) without running. ``result()`` raises it."""


class TaskTimeout(BlitzQError, TimeoutError):
    """A task ran longer than its ``timeout`` (seconds) and was stopped or abandoned."""


class SoftTimeoutError(TaskTimeout):
    """Raised inside a task that ran longer than its ``soft_timeout`` (seconds).

    A thread task gets it raised in its thread (at the next Python bytecode, so not while it
    is blocked in C code); an async task is cancelled instead (it sees ``CancelledError``) and
    the attempt is recorded as failed with this error. The retry policy applies.

    Args:
        message: the error text.
    """

    def __init__(self, message: str = "the task ran longer than its soft_timeout") -> None:
        super().__init__(message)


class ResultTimeout(BlitzQError, TimeoutError):
    """No final result arrived within the ``timeout`` (seconds) given to ``result()``."""


class ResultExpired(ResultTimeout):
    """A result wait ended before its timeout (``timeout=None`` included) because the result
    can no longer arrive: the task's record is gone (it expired after ``result_ttl``, or
    was deleted) and the task is known nowhere else (not on the schedule, not in its queue,
    not running). A :class:`ResultTimeout`, so code that catches that catches this too.
    See docs/guarantees.md ("Result waits end").

    Attributes:
        task_id: the task waited for.
    """

    def __init__(self, task_id: str, message: str) -> None:
        super().__init__(message)
        self.task_id = task_id


class ResultNotStored(BlitzQError):
    """The task does not store its return value (``store_result=False``, or the Queue's
    ``store_results=False``), so there is no result to return.

    ``handle.result()`` raises it at once for such a task (unless a failure is already
    recorded, which raises :class:`TaskFailed` as usual); ``queue.get_result(id)`` raises it
    when the task's record says it succeeded without a stored value (``track_state=True``).
    Use ``handle.status()`` / ``queue.inspect(id)`` to follow such a task.

    Attributes:
        task_id: id of the task.
    """

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"task {task_id} does not store its result (store_result=False): there is no "
            "result to wait for; use status()/inspect() to follow its state"
        )
        self.task_id = task_id


class BrokerError(BlitzQError, ConnectionError):
    """The broker could not be reached, or it answered with an error.

    Attributes:
        transient: ``True`` when trying again may succeed (connection lost, timeout);
            ``False`` when the server refused the command itself.
        out_of_memory: ``True`` when the server refused a write for lack of memory (Redis
            ``OOM`` at ``maxmemory`` under ``noeviction``): refused, not transient, yet the
            same write succeeds once memory is freed, so a worker retries its completions
            with backoff and never drops them.
        unavailable: ``True`` when the server (or cluster) said "not now" because it is
            failing over or starting: ``READONLY`` (a demoted primary), ``LOADING``,
            ``MASTERDOWN``, ``CLUSTERDOWN``, ``TRYAGAIN``, ``BUSY``, a slot moving. Transient;
            the same command succeeds, unchanged, once the switch is over, so a worker
            retries its completions until they are applied or fenced, never recording a
            failure for them, even while another node answers PING.
        outcome_unknown: ``True`` (only on :class:`OutcomeUnknown`) when a write was sent
            and its reply was lost: it may have been applied.
        unreplicated: ``True`` when the primary applied a write but fewer of its replicas
            than it waited for acknowledged it in time (``WAIT`` fell short, on
            ``redis+sentinel://`` or a Redis Cluster with replicas): it is there now, and a
            failover may lose it. Also ``unavailable``; a producer's write raises it as
            :class:`OutcomeUnknown` (with ``unreplicated`` set).
        reported: ``True`` when the call failed because a connection was lost that the
            transport already reported in its own log line (a RabbitMQ connection: one
            WARNING per loss, ``broker/amqp/closing.py``): a caller that retries logs this
            error at DEBUG, so an expected loss reads as one line.
    """

    outcome_unknown: bool = False
    reported: bool = False
    unreplicated: bool = False

    def __init__(
        self,
        message: str,
        transient: bool = True,
        *,
        out_of_memory: bool = False,
        unavailable: bool = False,
    ) -> None:
        super().__init__(message)
        self.transient = transient or unavailable
        self.out_of_memory = out_of_memory
        self.unavailable = unavailable


class BrokerRefusedSettings(BrokerError, ConfigurationError):
    """The broker refused the connection's settings: a wrong password or user name
    (``WRONGPASS``, ``AuthenticationError``), no password given to a server that requires one
    (``NOAUTH``), a database number the server does not have (``DB index is out of range``);
    RabbitMQ's refusal of the login (``403 ACCESS_REFUSED``) or virtual host (``530
    NOT_ALLOWED``).
    Trying again cannot succeed until the URL is fixed, so it is a configuration error (a
    worker exits 78, ``EX_CONFIG``, at once instead of waiting for its broker) as well as a
    :class:`BrokerError` that is never ``transient``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class OutcomeUnknown(BrokerError):
    """A producer's write (an enqueue, a workflow start, a schedule, a cancel, a dead-letter
    replay) was sent, but the connection dropped or timed out before the reply: the broker
    may or may not have applied it. Or (``unreplicated``) the primary applied it but its
    replicas did not acknowledge it within ``wait_timeout`` (``redis+sentinel://``, a Redis
    Cluster with replicas): it stays unless a failover promotes a replica that lacks it.
    Unlike a plain transient :class:`BrokerError` (nothing was written), a blind retry can
    duplicate the write; see docs/guarantees.md ("Retrying after an unknown outcome"):
    re-enqueueing under the same ``task_id`` publishes a second message (it does not
    deduplicate), so a retry must first learn whether the first attempt landed, or the task
    must tolerate running twice -- or be a unique task, whose retry runs it once (its key's
    claim and its message are one write).

    Attributes:
        outcome_unknown: always ``True``.
        unreplicated: ``True`` when it was applied by the primary, not confirmed by its
            replicas (``cause`` was an ``unreplicated`` :class:`BrokerError`).
        transient: ``True`` (the broker may answer a later call).
        what: the write, e.g. ``"enqueue"``, ``"workflow start"``, ``"cancel"``.
        task_ids: the ids the write concerned (the task ids of an enqueue or a cancel, the
            workflow id of a workflow start, the schedule's name for a schedule).
        task_id: the first of ``task_ids`` (``None`` when there is none).
    """

    outcome_unknown = True

    def __init__(self, what: str, task_ids: tuple[str, ...], cause: BaseException) -> None:
        shown = ", ".join(task_ids[:5]) + (
            f" (+{len(task_ids) - 5} more)" if len(task_ids) > 5 else ""
        )
        unreplicated = bool(getattr(cause, "unreplicated", False))
        happened = (
            "the primary applied it, its replicas did not confirm it in time "
            f"({cause}); a failover may lose it, or it may run"
            if unreplicated
            else "the broker stopped answering after the command was sent "
            f"({cause}); it may have been applied"
        )
        super().__init__(
            f"{what} outcome unknown: {happened}. Ids: {shown or '-'}. Retrying blindly may "
            "duplicate it (the same task_id does not deduplicate): see docs/guarantees.md",
            True,
        )
        self.unreplicated = unreplicated
        self.what = what
        self.task_ids = task_ids
        self.task_id = task_ids[0] if task_ids else None


def _never_sent(exc: BrokerError) -> bool:
    """Whether ``exc`` shows that the command never left: no connection could be made."""
    cause = exc.__cause__
    if isinstance(cause, ConnectionRefusedError):
        return True
    text = str(exc)
    return "connecting to" in text or "Connection refused" in text


@contextlib.contextmanager
def unknown_outcome(what: str, ids: Iterable[str]) -> Iterator[None]:
    """Turn a transient :class:`BrokerError` raised inside the block (a timeout or a
    connection lost mid-command: the write may have been applied; or a write the primary
    applied that its replicas did not confirm: ``unreplicated``) into
    :class:`OutcomeUnknown` naming ``what`` and ``ids``. A refusal (``transient`` false), a
    server saying "not now" (``unavailable`` and not ``unreplicated``: nothing applied) and
    a connection that could not be made (nothing sent) pass through unchanged.

    Args:
        what: the write, e.g. ``"enqueue"``.
        ids: the task (or workflow, or schedule) ids it concerns; read only on an error.

    Raises:
        OutcomeUnknown: as above, ``from`` the original error.
    """
    try:
        yield
    except OutcomeUnknown:
        raise
    except BrokerError as exc:
        if not exc.unreplicated and (not exc.transient or exc.unavailable or _never_sent(exc)):
            raise
        raise OutcomeUnknown(what, tuple(ids), exc) from exc


class EmbeddedServerNotFound(BrokerError):
    """A command that must not start the embedded server found none running: no data
    directory was found, or no server answers in it (never transient: nothing retries it)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False)


class Retry(Exception):
    """Raise inside a task to retry it after ``delay`` seconds.

    The attempt counts against the task's ``retries``; when they are exhausted the task fails
    (or is dead-lettered) with the error that caused the retry.

    Args:
        delay: seconds to wait before the next attempt (or a ``timedelta``, kept as its
            seconds); ``None`` uses the retry policy's backoff.
        reason: a short text recorded with the attempt.

    Raises:
        ConfigurationError: ``delay`` is negative, NaN, infinite or not a number (a negative
            ``timedelta`` is refused as a negative number is).
    """

    def __init__(
        self, delay: float | _dt.timedelta | None = None, reason: str | None = None
    ) -> None:
        super().__init__(reason or "retry requested")
        given = repr(delay)
        if isinstance(delay, _dt.timedelta):
            delay = delay.total_seconds()
            given = f"a timedelta of {delay:g} s"
        if delay is not None and (
            isinstance(delay, bool)
            or not isinstance(delay, int | float)
            or not (0 <= delay < math.inf)  # NaN fails both
        ):
            raise ConfigurationError(
                f"Retry delay must be a finite number >= 0 seconds, got {given}"
            )
        self.delay = delay
        self.reason = reason

    def __reduce__(self) -> tuple[type[Retry], tuple[float | None, str | None]]:
        """Pickle by ``(delay, reason)``: a ``Retry`` raised in an ``executor="process"``
        task crosses back to the worker as itself (the default pickling of an exception
        would call ``Retry(message)`` and fail)."""
        return (type(self), (self.delay, self.reason))


class NoRetry(Exception):
    """Raise inside a task to fail it for good: no retry, whatever its ``retries`` and
    retry policy say (SwarmQ's ``NoRetry``; the per-raise form of ``dont_retry_on``).

    The attempt is recorded as failed (dead-lettered when the task dead-letters its
    failures) under this error; ``raise NoRetry("why") from exc`` records ``exc`` instead.

    Args:
        reason: a short text recorded as the error's message.
    """

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason or "the task asked not to be retried")
        self.reason = reason

    def __reduce__(self) -> tuple[type[NoRetry], tuple[str | None]]:
        """Pickle by ``reason`` (an ``executor="process"`` task's ``NoRetry`` crosses back to
        the worker as it was raised)."""
        return (type(self), (self.reason,))


def describe_error(exc: BaseException) -> tuple[str, str]:
    """Return ``(qualified type name, message)`` for an exception, as stored in records.

    Never raises, whatever the exception does: a ``__str__`` that raises gives
    ``"<unprintable ValueError>"`` (the type's name), and a message longer than
    :data:`MAX_ERROR_CHARS` characters is cut to that many, with a note of its full length.

    Args:
        exc: any exception (``BaseException`` subclasses included).

    Returns:
        ``(name, message)``: ``name`` is ``qualname`` for builtins and ``__main__``, else
        ``module.qualname``.
    """
    cls = type(exc)
    try:
        module = cls.__module__
        qualname = cls.__qualname__
        name = qualname if module in ("builtins", "__main__") else f"{module}.{qualname}"
        if not isinstance(name, str):
            raise TypeError(name)
    except BaseException:
        name = object.__repr__(cls)
    try:
        message = str(exc)
        if type(message) is not str:  # a str subclass whose methods may misbehave
            message = str.__str__(message)
    except BaseException:
        short = getattr(cls, "__name__", None)
        return name, f"<unprintable {short if isinstance(short, str) else name}>"
    return name, clip_text(message)


__all__ = [
    "MAX_ERROR_CHARS",
    "BlitzQError",
    "BrokerError",
    "ConfigurationError",
    "MessageTooLarge",
    "NoRetry",
    "OutcomeUnknown",
    "ResultNotStored",
    "ResultTimeout",
    "ResultTooLarge",
    "Retry",
    "SerializationError",
    "SoftTimeoutError",
    "TaskCancelled",
    "TaskExpired",
    "TaskFailed",
    "TaskTimeout",
    "UnknownTask",
    "describe_error",
]
