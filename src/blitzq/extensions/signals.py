"""Signals: named moments in the life of a task, a worker, a scheduler and a workflow that
handlers can follow.

Register a handler with ``@queue.on(Signal.TASK_FAILED)``; it receives one
:class:`SignalEvent`. Handlers may be plain functions or coroutines. A handler that raises is
logged (logger ``blitzq.signals``) and never breaks the enqueue, the worker or the scheduler
that emitted the signal; the other handlers still run.

Where each signal comes from, and what its event carries, is the table of
``docs/middleware-signals.md``; in short:

- producer: ``TASK_ENQUEUED`` (once per published message), ``TASK_REVOKED`` (a cancel
  request was written: ``queue.cancel``, ``handle.cancel()``), ``WORKFLOW_STARTED``
  (``queue.apply`` wrote a workflow's state and first steps);
- worker, per delivery: ``TASK_RECEIVED`` (decoded and checked, before its start checks),
  ``TASK_REJECTED`` (dead-lettered without running: malformed, unknown task, too large),
  ``TASK_EXPIRED`` (older than its ``max_age``), ``TASK_STARTED``; per run, from the
  completion it writes: ``TASK_SUCCEEDED`` / ``TASK_FAILED`` / ``TASK_RETRIED`` /
  ``TASK_DEAD_LETTERED`` / ``TASK_CANCELLED``, and for a workflow step that ended for good
  ``WORKFLOW_STEP_DONE`` then ``WORKFLOW_COMPLETED`` or ``WORKFLOW_FAILED`` when the step
  ended the workflow;
- worker, its own life: ``WORKER_STARTING`` (before the startup hooks), ``WORKER_STARTED``
  (fetching), ``WORKER_STOPPING`` (shutdown began), ``WORKER_STOPPED`` (completions
  written), ``WORKER_HEARTBEAT_LOST`` (the registration of another worker of the namespace
  lapsed: it stopped renewing it without unregistering);
- scheduler: ``SCHEDULER_STARTED`` / ``SCHEDULER_STOPPED``, ``SCHEDULER_DISPATCHED`` (it
  won the claim of a periodic occurrence), ``SCHEDULER_MISSED`` (an occurrence its
  missed-run policy drops).

The signals of a run's outcome are emitted in a background task after the completion was
handed to the writer: handlers run concurrently with the write and never delay it. Those
emitted from synchronous code (received, rejected, expired, started, ...) go through
:meth:`Signals.emit_soon`: plain-function handlers are called at once, coroutine handlers run
in a background task. Nothing is built for a signal nobody handles (one dictionary lookup, or
one boolean per delivery on the hot path).
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("blitzq.signals")


class Signal(enum.StrEnum):
    """The signals blitzq emits; see the module docstring for where each comes from."""

    TASK_ENQUEUED = "task_enqueued"
    TASK_RECEIVED = "task_received"
    TASK_REJECTED = "task_rejected"
    TASK_REVOKED = "task_revoked"
    TASK_STARTED = "task_started"
    TASK_SUCCEEDED = "task_succeeded"
    TASK_FAILED = "task_failed"
    TASK_RETRIED = "task_retried"
    TASK_DEAD_LETTERED = "task_dead_lettered"
    TASK_CANCELLED = "task_cancelled"
    TASK_EXPIRED = "task_expired"
    WORKER_STARTING = "worker_starting"
    WORKER_STARTED = "worker_started"
    WORKER_STOPPING = "worker_stopping"
    WORKER_STOPPED = "worker_stopped"
    WORKER_HEARTBEAT_LOST = "worker_heartbeat_lost"
    SCHEDULER_STARTED = "scheduler_started"
    SCHEDULER_STOPPED = "scheduler_stopped"
    SCHEDULER_DISPATCHED = "scheduler_dispatched"
    SCHEDULER_MISSED = "scheduler_missed"
    WORKFLOW_STARTED = "workflow_started"
    WORKFLOW_STEP_DONE = "workflow_step_done"
    WORKFLOW_COMPLETED = "workflow_completed"
    WORKFLOW_FAILED = "workflow_failed"


@dataclass(frozen=True, slots=True)
class SignalEvent:
    """What a signal handler receives.

    Attributes:
        signal: the signal emitted.
        task_id: the task's id (``None`` for worker, scheduler and workflow-level signals;
            a rejected message whose id cannot be read has none either).
        task: the task's name.
        queue: the physical queue of the message.
        attempt: 1-based attempt number of the run (``None`` where no run is involved).
        error: the exception of a failed, retried or dead-lettered run, when known.
        error_type: qualified type name of the error (also set when only the stored record
            knows it).
        error_message: the error's message.
        result: the return value of a succeeded run.
        delay: seconds until the retry of a ``TASK_RETRIED`` run.
        worker: id of the worker emitting it (``None`` on the producer and scheduler side).
        extra: further fields of the signal (``workflow_id``, ``reason``, ``occurrence``,
            ...: the table in ``docs/middleware-signals.md``).
        time: Unix time (seconds) the event was made.
    """

    signal: Signal
    task_id: str | None = None
    task: str | None = None
    queue: str | None = None
    attempt: int | None = None
    error: BaseException | None = None
    error_type: str | None = None
    error_message: str | None = None
    result: Any = None
    delay: float | None = None
    worker: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)


#: A signal handler: a plain function or a coroutine function taking the event.
Handler = Callable[[SignalEvent], "Awaitable[None] | None"]


class Signals:
    """The signal handlers of one Queue (``queue.signals``).

    Args:
        changed: called after every (dis)connect, so the owner can refresh its flags.
    """

    def __init__(self, changed: Callable[[], None] | None = None) -> None:
        self._handlers: dict[Signal, list[Handler]] = {}
        self._changed = changed
        self._pending: set[asyncio.Future[None]] = set()
        #: Signals whose handlers are all plain functions (:meth:`emit_soon` calls them).
        self._plain: set[Signal] = set()

    def connect(self, signal: Signal | str, handler: Handler) -> Handler:
        """Register ``handler`` for ``signal``; return it unchanged.

        Raises:
            ValueError: ``signal`` is not a :class:`Signal` (or its value).
            TypeError: ``handler`` is not callable.
        """
        sig = Signal(signal)
        if not callable(handler):
            raise TypeError(f"a signal handler must be callable, got {handler!r}")
        self._handlers.setdefault(sig, []).append(handler)
        self._sort(sig)
        if self._changed is not None:
            self._changed()
        return handler

    def disconnect(self, signal: Signal | str, handler: Handler) -> bool:
        """Remove ``handler`` from ``signal``; return whether it was registered."""
        handlers = self._handlers.get(Signal(signal))
        if not handlers or handler not in handlers:
            return False
        handlers.remove(handler)
        if not handlers:
            del self._handlers[Signal(signal)]
        self._sort(Signal(signal))
        if self._changed is not None:
            self._changed()
        return True

    def _sort(self, signal: Signal) -> None:
        """Note whether every handler of ``signal`` is a plain function."""
        handlers = self._handlers.get(signal)
        if handlers and not any(inspect.iscoroutinefunction(h) for h in handlers):
            self._plain.add(signal)
        else:
            self._plain.discard(signal)

    def has(self, signal: Signal) -> bool:
        """Whether any handler is registered for ``signal`` (cheap; check before building an
        event)."""
        return signal in self._handlers

    def __bool__(self) -> bool:
        """Whether any handler is registered at all."""
        return bool(self._handlers)

    async def emit(self, signal: Signal, event: SignalEvent) -> None:
        """Call every handler of ``signal`` with ``event``, in registration order.

        Coroutine handlers are awaited. A handler that raises (anything, ``SystemExit``
        included) is logged and skipped; this method never raises because of a handler
        (cancellation excepted).
        """
        for handler in tuple(self._handlers.get(signal, ())):
            try:
                outcome = handler(event)
                if inspect.isawaitable(outcome):
                    await outcome
            except asyncio.CancelledError:
                raise
            except BaseException:  # SystemExit too: logged, the emitter goes on
                logger.exception("signal handler %s for %s failed", _name(handler), signal.value)

    def emit_soon(self, signal: Signal, event: SignalEvent) -> None:
        """:meth:`emit` from synchronous code on the running event loop, without waiting.

        When every handler of ``signal`` is a plain function, they are called at once, in
        registration order (each error logged, as in :meth:`emit`; an awaitable one returns
        runs in a background task): no task is made per event. Otherwise the handlers run in
        a background task. Background tasks are kept referenced until they end;
        :meth:`drain` awaits them.

        Does nothing when ``signal`` has no handler.

        Raises:
            RuntimeError: no event loop is running in this thread.
        """
        handlers = self._handlers.get(signal)
        if not handlers:
            return
        if signal not in self._plain:
            self.track(asyncio.get_running_loop().create_task(self.emit(signal, event)))
            return
        for handler in tuple(handlers):
            try:
                outcome = handler(event)
                if inspect.isawaitable(outcome):
                    self.track(asyncio.ensure_future(self._settle(handler, signal, outcome)))
            except BaseException:  # SystemExit too: logged, the emitter goes on
                logger.exception("signal handler %s for %s failed", _name(handler), signal.value)

    async def _settle(self, handler: Handler, signal: Signal, outcome: Awaitable[None]) -> None:
        try:
            await outcome
        except asyncio.CancelledError:
            raise
        except BaseException:
            logger.exception("signal handler %s for %s failed", _name(handler), signal.value)

    def track(self, task: asyncio.Future[None]) -> None:
        """Keep ``task`` referenced until it ends, so :meth:`drain` can await it."""
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` seconds for handlers still running in the background of
        the current event loop."""
        loop = asyncio.get_running_loop()
        mine = [t for t in self._pending if t.get_loop() is loop]
        if mine:
            await asyncio.wait(mine, timeout=timeout)


def _name(handler: Callable[..., Any]) -> str:
    return getattr(handler, "__qualname__", None) or repr(handler)


__all__ = ["Handler", "Signal", "SignalEvent", "Signals"]
