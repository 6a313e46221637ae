"""Signals: named moments in the life of a task, a worker, a scheduler and a workflow that
middleware and handlers can follow.

Signals are part of the middleware chain: every middleware observes them through its
:meth:`~blitzq.Middleware.on_signal` hook (one :class:`SignalEvent`; the signals it wants in
:attr:`~blitzq.Middleware.observes`), and ``@queue.on(Signal.TASK_FAILED)`` is sugar that
registers a handler on one built-in middleware, :class:`SignalHandlers`. :class:`Signals`
(``queue.signals``) is where blitzq emits: it calls, per signal, the ``on_signal`` of each
registered middleware that observes it (registration order), then the ``queue.on``
handlers (registration order); the registry rebuilds that table when a middleware or a
handler is added (:meth:`Signals.route`). Handlers and hooks may be plain functions or
coroutines. One that raises is logged (logger ``blitzq.signals``) and never breaks the
enqueue, the worker or the scheduler that emitted the signal; the others still run.

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
:meth:`Signals.emit_soon`: plain-function handlers are called at once, coroutine handlers
(an ``async def on_signal`` too) run in a background task. Nothing is built for a signal
nobody observes (one dictionary lookup, or one boolean per delivery on the hot path).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from .middleware import Middleware
from .signal_events import Handler, Signal, SignalEvent

logger = logging.getLogger("blitzq.signals")


class SignalHandlers(Middleware):
    """The built-in middleware holding a Queue's ``@queue.on(...)`` handlers: its
    :meth:`signal_handlers` hands them to the chain, signal by signal.

    Made by :class:`Signals` (``queue.signals.handlers``) and listed among the registry's
    built-in middleware, after the registered ones: their ``on_signal`` hooks see an event
    before these handlers do.
    """

    def __init__(self) -> None:
        self._handlers: dict[Signal, list[Handler]] = {}

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
        return handler

    def disconnect(self, signal: Signal | str, handler: Handler) -> bool:
        """Remove ``handler`` from ``signal``; return whether it was registered."""
        sig = Signal(signal)
        handlers = self._handlers.get(sig)
        if not handlers or handler not in handlers:
            return False
        handlers.remove(handler)
        if not handlers:
            del self._handlers[sig]
        return True

    def signal_handlers(self, signal: Signal) -> Sequence[Handler]:
        """The handlers registered for ``signal``, in registration order."""
        return tuple(self._handlers.get(signal, ()))

    async def on_signal(self, event: SignalEvent) -> None:
        """Call the handlers of ``event.signal`` in order, each error logged (what
        :meth:`Signals.emit` does for them when this middleware is in its table)."""
        await _call_each(self.signal_handlers(event.signal), event)


class Signals:
    """Where a Queue's signals are emitted (``queue.signals``): the per-signal table of the
    middleware chain's observers (``on_signal`` hooks, then the ``queue.on`` handlers).

    Args:
        changed: called after every (dis)connect of a handler; the owner (the registry)
            rebuilds the table with :meth:`route` and refreshes its flags. ``None``: the
            table holds the handlers alone.

    Attributes:
        handlers: the built-in :class:`SignalHandlers` middleware that ``connect`` adds to.
    """

    def __init__(self, changed: Callable[[], None] | None = None) -> None:
        self.handlers = SignalHandlers()
        self._table: dict[Signal, tuple[Handler, ...]] = {}
        self._changed = changed
        self._pending: set[asyncio.Future[None]] = set()
        #: Signals whose observers are all plain functions (:meth:`emit_soon` calls them).
        self._plain: set[Signal] = set()

    def connect(self, signal: Signal | str, handler: Handler) -> Handler:
        """Register ``handler`` for ``signal`` on :attr:`handlers`; return it unchanged.

        Raises:
            ValueError: ``signal`` is not a :class:`Signal` (or its value).
            TypeError: ``handler`` is not callable.
        """
        self.handlers.connect(signal, handler)
        self._update()
        return handler

    def disconnect(self, signal: Signal | str, handler: Handler) -> bool:
        """Remove ``handler`` from ``signal``; return whether it was registered."""
        removed = self.handlers.disconnect(signal, handler)
        if removed:
            self._update()
        return removed

    def _update(self) -> None:
        if self._changed is not None:
            self._changed()
        else:
            self.route((self.handlers,))

    def route(self, chain: Iterable[Middleware]) -> None:
        """Rebuild the table from ``chain`` (middleware in the order their observers run):
        for each signal, every middleware's :meth:`~blitzq.Middleware.signal_handlers`."""
        chain = tuple(chain)
        table: dict[Signal, tuple[Handler, ...]] = {}
        for sig in Signal:
            observers = tuple(h for m in chain for h in m.signal_handlers(sig))
            if observers:
                table[sig] = observers
        self._table = table
        self._plain = {sig for sig, obs in table.items() if not any(_is_coroutine(h) for h in obs)}

    def has(self, signal: Signal) -> bool:
        """Whether anything observes ``signal`` (cheap; check before building an event)."""
        return signal in self._table

    def __bool__(self) -> bool:
        """Whether anything observes any signal at all."""
        return bool(self._table)

    async def emit(self, signal: Signal, event: SignalEvent) -> None:
        """Call every observer of ``signal`` with ``event``, in order (the middleware's
        ``on_signal`` in registration order, then the ``queue.on`` handlers).

        Coroutines are awaited. An observer that raises (anything, ``SystemExit``
        included) is logged and skipped; this method never raises because of one
        (cancellation excepted).
        """
        await _call_each(self._table.get(signal, ()), event)

    def emit_soon(self, signal: Signal, event: SignalEvent) -> None:
        """:meth:`emit` from synchronous code on the running event loop, without waiting.

        When every observer of ``signal`` is a plain function, they are called at once, in
        order (each error logged, as in :meth:`emit`; an awaitable one returns runs in a
        background task): no task is made per event. Otherwise the observers run in a
        background task. Background tasks are kept referenced until they end; :meth:`drain`
        awaits them.

        Does nothing when nothing observes ``signal``.

        Raises:
            RuntimeError: no event loop is running in this thread.
        """
        observers = self._table.get(signal)
        if not observers:
            return
        if signal not in self._plain:
            self.track(asyncio.get_running_loop().create_task(_call_each(observers, event)))
            return
        for handler in observers:
            try:
                outcome = handler(event)
                if inspect.isawaitable(outcome):
                    self.track(asyncio.ensure_future(_settle(handler, event, outcome)))
            except BaseException:  # SystemExit too: logged, the emitter goes on
                logger.exception("signal handler %s for %s failed", _name(handler), signal.value)

    def track(self, task: asyncio.Future[None]) -> None:
        """Keep ``task`` referenced until it ends, so :meth:`drain` can await it."""
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait up to ``timeout`` seconds for observers still running in the background of
        the current event loop."""
        loop = asyncio.get_running_loop()
        mine = [t for t in self._pending if t.get_loop() is loop]
        if mine:
            await asyncio.wait(mine, timeout=timeout)


async def _call_each(observers: Iterable[Handler], event: SignalEvent) -> None:
    for handler in observers:
        try:
            outcome = handler(event)
            if inspect.isawaitable(outcome):
                await outcome
        except asyncio.CancelledError:
            raise
        except BaseException:  # SystemExit too: logged, the emitter goes on
            logger.exception("signal handler %s for %s failed", _name(handler), event.signal.value)


async def _settle(handler: Handler, event: SignalEvent, outcome: Awaitable[None]) -> None:
    try:
        await outcome
    except asyncio.CancelledError:
        raise
    except BaseException:
        logger.exception("signal handler %s for %s failed", _name(handler), event.signal.value)


def _is_coroutine(handler: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(handler)


def _name(handler: Callable[..., Any]) -> str:
    return getattr(handler, "__qualname__", None) or repr(handler)


__all__ = ["Handler", "Signal", "SignalEvent", "SignalHandlers", "Signals"]
