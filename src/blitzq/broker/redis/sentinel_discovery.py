"""How long a ``redis+sentinel://`` broker waits when the sentinels or the primary do not answer.

Used by ``sentinel.py``. Two parts, each bounded in time rather than in a count of attempts:

- :class:`SentinelDiscovery` asks the sentinels for the primary one after another, each on a
  connection cut at :data:`SENTINEL_CONNECT_TIMEOUT` to open and :data:`SENTINEL_TIMEOUT` to
  answer, without redis-py's own retries (by default 10 connect retries nested in 10 command
  retries, several seconds per dead sentinel). A refused connection costs nothing, a silent host
  half a second. The sentinel that answered is asked first next time. When none names a
  primary, :class:`MasterNotFoundError` (a connection error: retried) says in one line which
  sentinels were asked and what each one did; when every sentinel answered but none knows the
  service (a typo) or accepts the credentials, :class:`SentinelConfigError` (not retried).
- :class:`DeadlineRetry` retries a connection error with jittered backoff (50 ms to 0.5 s) for
  :data:`FAILOVER_SECONDS`, counted from the start of the call or from the start of the
  client's current outage (its first failure with no success since), whichever is earlier.
  No attempt starts after that; the one in flight ends within its own timeouts. Once an outage
  is older than the budget, each call makes one attempt and fails, until one succeeds. The
  error it raises at the end is the last one, with how long the client has been failing.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

T = TypeVar("T")

#: Seconds a call keeps retrying across a failover (or an outage) before it raises.
FAILOVER_SECONDS = 10.0
#: Seconds to open a connection to one sentinel (at most; a lower ``socket_connect_timeout``
#: in the URL wins).
SENTINEL_CONNECT_TIMEOUT = 0.5
#: Seconds one sentinel has to answer (at most; a lower ``socket_timeout`` in the URL wins).
SENTINEL_TIMEOUT = 1.0
#: Attempts of one call at most, whatever the time (a safety net: the time bound comes first).
_MAX_ATTEMPTS = 1000
#: Seconds without a failure after which a new failure starts a new outage.
_OUTAGE_GAP = FAILOVER_SECONDS


class SentinelConfigError(ResponseError):
    """Every sentinel answered, and none knows the service or accepts the credentials: a
    configuration error that trying again does not cure."""


class DeadlineRetry(Retry):
    """redis-py's ``Retry`` bounded by time (module docstring): one per client, shared by its
    connections (copying it returns it, so the outage clock is the client's).

    Args:
        budget: seconds of retrying (:data:`FAILOVER_SECONDS`).
        supported_errors: the errors retried (connection errors).
    """

    def __init__(
        self,
        budget: float = FAILOVER_SECONDS,
        supported_errors: tuple[type[RedisError], ...] = (RedisConnectionError,),
    ) -> None:
        backoff = ExponentialWithJitterBackoff(base=0.05, cap=0.5)
        super().__init__(backoff, _MAX_ATTEMPTS, supported_errors)
        self.budget = budget
        self._failing_since: float | None = None
        self._failed_at = -_OUTAGE_GAP

    def __copy__(self) -> DeadlineRetry:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> DeadlineRetry:
        return self

    async def call_with_retry(
        self,
        do: Callable[[], Awaitable[T]],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        """``await do()``; on a supported error, ``await fail(error[, failures])`` and try
        again after a backoff while the budget lasts.

        Raises:
            redis.exceptions.ConnectionError: the last error (its type, its message with how
                long the client has been failing) once the budget is spent; any other error
                of ``do`` at once.
        """
        started = time.monotonic()
        failures = 0
        while True:
            try:
                result = await do()
            except self._supported_errors as error:
                if is_retryable is not None and not is_retryable(error):
                    raise
                failures += 1
                now = time.monotonic()
                if self._failing_since is None or now - self._failed_at > _OUTAGE_GAP:
                    self._failing_since = now
                self._failed_at = now
                # Read before the await: a concurrent call's success clears it meanwhile.
                since = self._failing_since
                await (fail(error, failures) if with_failure_count else fail(error))
                first = min(started, since)
                pause = self._backoff.compute(failures)
                if now + pause - first >= self.budget or failures >= _MAX_ATTEMPTS:
                    raise _gave_up(error, time.monotonic() - first) from error
                await asyncio.sleep(pause)
            else:
                self._failing_since = None
                return result


def _gave_up(error: Exception, seconds: float) -> Exception:
    """``error``'s type with ``"; failing for <seconds> s"`` after its message."""
    try:
        return type(error)(f"{error}; failing for {seconds:.1f} s")
    except Exception:  # an error type with another constructor: the error as it is
        return error


class SentinelDiscovery(Sentinel):
    """redis-py's ``Sentinel`` with a bounded discovery of the primary (module docstring).

    Args:
        sentinels: ``(host, port)`` of each sentinel, in the order they are asked first.
        sentinel_kwargs: connection options of the sentinels (credentials, timeouts); the
            timeouts are cut to :data:`SENTINEL_CONNECT_TIMEOUT`/:data:`SENTINEL_TIMEOUT`
            and redis-py's retries are turned off.
    """

    def __init__(self, sentinels: list[tuple[str, int]], sentinel_kwargs: dict[str, Any]) -> None:
        options = dict(sentinel_kwargs)
        for name, cap in (
            ("socket_connect_timeout", SENTINEL_CONNECT_TIMEOUT),
            ("socket_timeout", SENTINEL_TIMEOUT),
        ):
            options[name] = min(float(options.get(name) or cap), cap)
        options["retry"] = Retry(NoBackoff(), 0)
        # redis-py types Sentinel.__init__ from 8.2 on (untyped before): called through Any so
        # that mypy passes on every supported release without a version-specific ignore.
        cast("Any", super()).__init__(sentinels, sentinel_kwargs=options)

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        """The ``(host, port)`` of the primary of ``service_name``, from the first sentinel
        that names one (asked first from then on).

        Raises:
            MasterNotFoundError: no sentinel named a primary (one line: each sentinel's
                address and what it did).
            SentinelConfigError: every sentinel answered, and none monitors the service or
                accepts the credentials.
        """
        failures: list[str] = []
        misconfigured = True
        for sentinel in list(self.sentinels):
            kwargs = sentinel.connection_pool.connection_kwargs
            address = f"{kwargs['host']}:{kwargs['port']}"
            try:
                masters = await sentinel.sentinel_masters()
            except (RedisError, OSError) as exc:
                failures.append(f"{address}: {describe_failure(exc)}")
                misconfigured = misconfigured and isinstance(
                    exc, (ResponseError, AuthenticationError)
                )
                continue
            state = masters.get(service_name) if isinstance(masters, dict) else None
            if state is None:
                failures.append(f"{address}: does not monitor it")
                continue
            if not self.check_master_state(state, service_name):
                failures.append(f"{address}: reports it down")
                misconfigured = False
                continue
            if self.sentinels[0] is not sentinel:
                self.sentinels.remove(sentinel)
                self.sentinels.insert(0, sentinel)
            return state["ip"], int(state["port"])
        error = SentinelConfigError if misconfigured else MasterNotFoundError
        raise error(
            f"no Sentinel named a primary for service {service_name!r} ({'; '.join(failures)})"
        )


#: redis-py's prefix of a connection error's message.
_CONNECTING = re.compile(r"^Error -?\d+ connecting to \S+?\.?\s+")


def describe_failure(exc: BaseException) -> str:
    """A few words for why a sentinel did not answer: ``connection refused``, ``unknown
    host``, ``timed out``, ``authentication failed: ...``, else the error's own message (at
    most 100 characters)."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 5:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return "connection refused"
    if any(isinstance(e, socket.gaierror) for e in chain):
        return "unknown host"
    if any(isinstance(e, (RedisTimeoutError, TimeoutError)) for e in chain):
        return "timed out"
    text = _CONNECTING.sub("", str(exc)).strip().rstrip(".") or type(exc).__name__
    if isinstance(exc, AuthenticationError) or "NOAUTH" in text or "WRONGPASS" in text:
        text = f"authentication failed: {text}"
    return text[:100]


__all__ = [
    "FAILOVER_SECONDS",
    "SENTINEL_CONNECT_TIMEOUT",
    "SENTINEL_TIMEOUT",
    "DeadlineRetry",
    "SentinelConfigError",
    "SentinelDiscovery",
    "describe_failure",
]
