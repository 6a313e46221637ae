"""The middleware registry of one Queue (``queue._extensions``) and the calls that run it.

The producer reaches it through two calls per batch, :meth:`Extensions.before_publish` and
:meth:`~Extensions.after_publish` (the enqueue hooks of every middleware, the built-in ones
last: the Queue's ``enqueue_filters`` / ``enqueue_observers`` lists are run by one of them,
the eager test mode's drain by another);
the worker through four calls, in this order per run: :meth:`Extensions.context_for`,
:meth:`~Extensions.before_execute` (when any middleware has a before-execute hook),
:meth:`~Extensions.started`, and :meth:`~Extensions.committed` with the run's typed
:class:`~blitzq.extensions.middleware.Outcome`. It never calls back into the worker.

Signals (:mod:`blitzq.extensions.signals`) go through the same chain: :attr:`Extensions.signals`
is the table of each signal's observers, the ``on_signal`` hooks of the registered middleware
that observe it, then the ``queue.on`` handlers held by a built-in middleware
(:class:`~.signals.SignalHandlers`); the registry rebuilds it whenever a middleware or a
handler is added. A run's outcome signals are emitted from here, after its middleware hooks;
the other signals at their emit sites, through the same table.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..client.testmode import TestModeDrain
from ..context import NO_RESULT, TaskContext, reset_current, set_current
from ..exceptions import BlitzQError, TaskCancelled, TaskFailed, TaskTimeout, describe_error
from ..serialization import encode_envelope
from .flow_signals import WorkflowEnd, step_ended, workflow_extra
from .lifecycle import EnqueueLists
from .middleware import EnqueueRefused, Middleware
from .signals import Signal, SignalEvent, Signals

if TYPE_CHECKING:
    from ..broker import Delivery
    from ..client.context import QueueContext
    from ..seams import QueueSettings
    from ..serialization import Envelope
    from ..worker.execution import Job
    from .middleware import (
        Outcome,
        Outgoing,
        OutgoingWorkflow,
        RunningWorker,
    )

logger = logging.getLogger("blitzq.middleware")

_HOOK_NAMES = (
    "before_enqueue",
    "after_enqueue",
    "before_publish",
    "after_publish",
    "before_apply",
    "after_apply",
    "before_execute",
    "after_execute",
    "on_error",
    "on_retry",
    "on_failure",
)


def _overrides(m: Middleware, name: str) -> bool:
    return getattr(type(m), name) is not getattr(Middleware, name)


async def _call(hook: Callable[..., Any], *args: Any) -> None:
    outcome = hook(*args)
    if inspect.isawaitable(outcome):
        await outcome


def _owner(hook: Callable[..., Any]) -> str:
    owner = getattr(hook, "__self__", None)
    return type(owner).__name__ if owner is not None else getattr(hook, "__qualname__", "hook")


class Extensions:
    """Middleware of one Queue (signal handlers included), and the calls that run them.

    Args:
        queue: the owning Queue.

    Attributes:
        middleware: registered middleware, in registration order.
        signals: where the Queue's signals are emitted: each signal's observers, the
            middleware's ``on_signal`` hooks and the ``queue.on`` handlers
            (``signals.handlers``, a built-in middleware).
        enabled: whether runs need the execution hooks at all (middleware with execution
            hooks, or signal observers): the one boolean the worker checks per run.
        has_before: whether any middleware has a ``before_execute`` hook.
        received: whether ``TASK_RECEIVED`` has a handler (read once per delivery).
        workflow_signals: whether any workflow-step signal (``WORKFLOW_STEP_DONE``,
            ``WORKFLOW_COMPLETED``, ``WORKFLOW_FAILED``) has a handler.
        builtin: the Queue's own sugar as built-in middleware, outside :attr:`middleware`:
            the lifecycle hooks (:class:`~.lifecycle.QueueHooks`: started before and stopped
            after the registered middleware), the enqueue lists
            (:class:`~.lifecycle.EnqueueLists`), the eager test mode's drain
            (:class:`~blitzq.client.testmode.TestModeDrain`), whose enqueue and apply hooks
            run after the registered middleware's, and the ``queue.on`` handlers
            (:class:`~.signals.SignalHandlers`), which observe a signal after the registered
            middleware's ``on_signal``.
    """

    def __init__(self, queue: QueueContext) -> None:
        self.queue = queue
        self.middleware: list[Middleware] = []
        #: The Queue's ``enqueue_filters`` and ``enqueue_observers``, run as a built-in.
        self.lists = EnqueueLists(queue.enqueue_filters, queue.enqueue_observers)
        #: The eager test mode's drain (:mod:`blitzq.client.testmode`), idle outside it.
        self.test_mode = TestModeDrain(queue)
        self.signals = Signals(self._refresh)
        self.builtin: list[Middleware] = [self.lists, self.test_mode, self.signals.handlers]
        self.enabled = False
        self.has_before = False
        self.received = False
        self.workflow_signals = False
        self._hooks: dict[str, list[Callable[..., Any]]] = {name: [] for name in _HOOK_NAMES}
        #: Whether the registered middleware or signal handlers see enqueues at all (the
        #: built-in ones do when the Queue's lists are not empty, or in the test mode: the
        #: producer's fast path checks those too).
        self.enqueue_hooked = False

    # ----------------------------------------------------------- registration
    def add(self, middleware: Middleware) -> None:
        """Register ``middleware`` after those already registered.

        Raises:
            TypeError: ``middleware`` is not a :class:`Middleware`.
        """
        if not isinstance(middleware, Middleware):
            raise TypeError(f"expected a blitzq.Middleware instance, got {middleware!r}")
        self.middleware.append(middleware)
        self._refresh()

    def _refresh(self) -> None:
        for name in _HOOK_NAMES:
            ordered = self.middleware if name.startswith("before") else self.middleware[::-1]
            self._hooks[name] = [getattr(m, name) for m in ordered if _overrides(m, name)]
        self.signals.route((*self.middleware, *self.builtin))
        hooks = self._hooks
        self.has_before = bool(hooks["before_execute"])
        self.enabled = bool(self.signals) or any(
            hooks[n]
            for n in ("before_execute", "after_execute", "on_error", "on_retry", "on_failure")
        )
        signals = self.signals
        self.received = signals.has(Signal.TASK_RECEIVED)
        self.workflow_signals = any(signals.has(s) for s in _WORKFLOW_SIGNALS)
        self.enqueue_hooked = self.signals.has(Signal.TASK_ENQUEUED) or any(
            hooks[n] for n in ("before_enqueue", "after_enqueue", "before_publish", "after_publish")
        )

    # --------------------------------------------------------------- lifecycle
    async def worker_started(self, worker: RunningWorker) -> None:
        """Run the ``on_worker_start`` hooks: the built-in ones, then the registered
        middleware's in registration order.

        Raises:
            Exception: what a hook raised (the worker does not start).
        """
        for m in (*self.builtin, *self.middleware):
            if _overrides(m, "on_worker_start"):
                await _call(m.on_worker_start, worker)

    async def worker_stopped(self, worker: RunningWorker) -> None:
        """Run the ``on_worker_stop`` hooks: the registered middleware's in reverse order,
        then the built-in ones; each error is logged."""
        for m in (*self.middleware[::-1], *self.builtin[::-1]):
            if _overrides(m, "on_worker_stop"):
                try:
                    await _call(m.on_worker_stop, worker)
                except Exception:
                    logger.exception("middleware %s.on_worker_stop failed", type(m).__name__)

    # ---------------------------------------------------------------- enqueue
    async def before_publish(self, queue: QueueSettings, batch: list[Outgoing]) -> None:
        """Run every middleware's enqueue hooks on ``batch`` before it is published: the
        ``before_enqueue`` hooks per message, then the ``before_publish`` hooks, the built-in
        middleware's last (the Queue's ``enqueue_filters``).

        Raises:
            BlitzQError: a hook raised one (it propagates as it is).
            EnqueueRefused: a ``before_enqueue`` hook raised anything else.
        """
        if self._hooks["before_enqueue"]:
            await self._each_before(queue, batch)
        for hook in self._hooks["before_publish"]:
            await _call(hook, queue, batch)
        for m in self.builtin:
            if _overrides(m, "before_publish"):
                await m.before_publish(queue, batch)

    async def after_publish(self, queue: QueueSettings, batch: list[Outgoing]) -> None:
        """Run every middleware's enqueue hooks on the published ``batch``: the
        ``after_enqueue`` hooks per message (errors logged) and ``TASK_ENQUEUED``, then the
        ``after_publish`` hooks, the built-in middleware's last (the Queue's
        ``enqueue_observers``)."""
        if self._hooks["after_enqueue"] or self.signals.has(Signal.TASK_ENQUEUED):
            await self._each_after(queue, batch)
        for hook in self._hooks["after_publish"]:
            await _call(hook, queue, batch)
        for m in self.builtin:
            if _overrides(m, "after_publish"):
                await m.after_publish(queue, batch)

    async def _each_before(self, queue: QueueSettings, batch: list[Outgoing]) -> None:
        hooks = self._hooks["before_enqueue"]
        for out in batch:
            if out.existing_id is not None:
                continue
            for hook in hooks:
                env = out.envelope
                try:
                    await _call(hook, out)
                except BlitzQError:
                    raise
                except Exception as exc:
                    raise EnqueueRefused(
                        f"middleware {_owner(hook)} refused to enqueue task {env.task} "
                        f"({env.id}): {type(exc).__name__}: {exc}"
                    ) from exc
                if out.envelope is not env:
                    out.data = encode_envelope(out.envelope, queue.max_message_size)

    async def _each_after(self, queue: QueueSettings, batch: list[Outgoing]) -> None:
        hooks = self._hooks["after_enqueue"]
        signals = self.signals
        emit = signals.has(Signal.TASK_ENQUEUED)
        for out in batch:
            for hook in hooks:
                try:
                    await _call(hook, out)
                except Exception:
                    logger.exception("middleware %s.after_enqueue failed", _owner(hook))
            if emit:
                env = out.envelope
                await signals.emit(
                    Signal.TASK_ENQUEUED,
                    SignalEvent(
                        Signal.TASK_ENQUEUED,
                        env.id,
                        env.task,
                        env.queue,
                        env.attempt,
                        extra={"due": out.due} if out.due is not None else {},
                    ),
                )

    # -------------------------------------------------------------- workflows
    @property
    def has_apply_hooks(self) -> bool:
        """Whether any middleware has a ``before_apply`` or ``after_apply`` hook (the test
        mode's, while it is on)."""
        return bool(
            self._hooks["before_apply"] or self._hooks["after_apply"] or self.test_mode.active
        )

    async def before_apply(self, workflow: OutgoingWorkflow) -> None:
        """Run the before-apply hooks on ``workflow``.

        Raises:
            BlitzQError: a hook raised one (it propagates as it is).
            EnqueueRefused: a hook raised anything else.
        """
        for hook in self._hooks["before_apply"]:
            try:
                await _call(hook, workflow)
            except BlitzQError:
                raise
            except Exception as exc:
                raise EnqueueRefused(
                    f"middleware {_owner(hook)} refused to apply workflow "
                    f"{workflow.workflow_id}: {type(exc).__name__}: {exc}"
                ) from exc

    async def after_apply(self, workflow: OutgoingWorkflow) -> None:
        """Run the after-apply hooks on ``workflow`` (a registered middleware's errors are
        logged), the built-in middleware's last."""
        for hook in self._hooks["after_apply"]:
            try:
                await _call(hook, workflow)
            except Exception:
                logger.exception("middleware %s.after_apply failed", _owner(hook))
        for m in self.builtin:
            if _overrides(m, "after_apply"):
                await m.after_apply(workflow)

    # -------------------------------------------------------------- execution
    @staticmethod
    def context_for(job: Job) -> TaskContext:
        """Make the run's :class:`~blitzq.TaskContext` (``job.context``) before its hooks."""
        env, d = job.envelope, job.delivery
        context = job.context = TaskContext(
            env.id,
            env.task,
            d.queue,
            job.attempt,
            job.task.max_attempts,
            env.correlation_id,
            env.headers,
            flow=env.flow,
            options=env.options,
        )
        return context

    async def before_execute(self, job: Job) -> BaseException | None:
        """Run the before-execute hooks with ``job.context`` current; return the exception
        of the hook that refused the run (it fails the attempt), else ``None``.

        Raises:
            asyncio.CancelledError: cancelled (worker shutdown); the run must not start.
        """
        context = job.context
        assert context is not None
        token = set_current(context)
        hook: Callable[..., Any] | None = None
        try:
            for hook in self._hooks["before_execute"]:
                await _call(hook, context)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit too: it fails the attempt, not the worker
            reset_current(token)
            logger.info(
                "before_execute of %s refused task %s: %s: %s",
                _owner(hook) if hook is not None else "hook",
                context.id,
                *describe_error(exc),
            )
            return exc
        reset_current(token)
        return None

    def started(self, job: Job, worker_id: str) -> None:
        """Emit ``TASK_STARTED`` for ``job`` (in the background) if anyone listens."""
        signals = self.signals
        if signals.has(Signal.TASK_STARTED):
            env = job.envelope
            signals.emit_soon(
                Signal.TASK_STARTED,
                SignalEvent(
                    Signal.TASK_STARTED,
                    env.id,
                    env.task,
                    job.delivery.queue,
                    job.attempt,
                    worker=worker_id,
                ),
            )

    def received_event(self, envelope: Envelope, queue: str, attempt: int, worker_id: str) -> None:
        """Emit ``TASK_RECEIVED`` for a delivery of ``envelope`` from the physical ``queue``
        (through :meth:`~.signals.Signals.emit_soon`; the caller checked :attr:`received`)."""
        self.signals.emit_soon(
            Signal.TASK_RECEIVED,
            SignalEvent(
                Signal.TASK_RECEIVED,
                envelope.id,
                envelope.task,
                queue,
                attempt,
                worker=worker_id,
                extra=workflow_extra(envelope),
            ),
        )

    def rejected_event(
        self,
        delivery: Delivery,
        reason: str,
        error: str,
        task_id: str | None,
        task: str,
        worker_id: str,
    ) -> None:
        """Emit ``TASK_REJECTED`` (through ``emit_soon``) for a message dead-lettered without
        running, if anyone listens.

        Args:
            delivery: the message as delivered.
            reason: the dead letter's reason (``"malformed message"``, ``"message too
                large"``, ``"unknown task"``), also the event's ``error_type``.
            error: what was wrong with it.
            task_id: its id, or ``None`` when it cannot be read.
            task: its task name, or ``""`` when unknown.
            worker_id: the worker that rejected it.
        """
        signals = self.signals
        if signals.has(Signal.TASK_REJECTED):
            event = SignalEvent(
                Signal.TASK_REJECTED,
                task_id,
                task or None,
                delivery.queue,
                error_type=reason,
                error_message=error,
                worker=worker_id,
                extra={"reason": reason, "deliveries": delivery.deliveries},
            )
            signals.emit_soon(Signal.TASK_REJECTED, event)

    def expired_event(self, job: Job, max_age: float | None, worker_id: str) -> None:
        """Emit ``TASK_EXPIRED`` (through ``emit_soon``) for ``job``, found older than its
        ``max_age`` (seconds) by its start check, if anyone listens."""
        signals = self.signals
        if signals.has(Signal.TASK_EXPIRED):
            env = job.envelope
            event = SignalEvent(
                Signal.TASK_EXPIRED,
                env.id,
                env.task,
                job.delivery.queue,
                job.attempt,
                error_type="TaskExpired",  # as the expired record says
                worker=worker_id,
                extra={"age": time.time() - env.created_at, "max_age": max_age},
            )
            signals.emit_soon(Signal.TASK_EXPIRED, event)

    def committed(
        self,
        job: Job,
        outcome: Outcome,
        scope: contextvars.Context,
        worker_id: str,
        workflow_end: WorkflowEnd | None = None,
    ) -> None:
        """Schedule the after-hooks and the signals of a run's ``outcome`` (run in
        ``scope``, a copy of the run's context as the task left it), in the background.

        ``workflow_end``: the mark of the effect by which the run's completion may end the
        workflow the run is a step of (:func:`~.flow_signals.workflow_end`), else ``None``.
        """
        task = asyncio.get_running_loop().create_task(
            self._after(job, outcome, worker_id, workflow_end), context=scope
        )
        self.signals.track(task)

    async def _after(
        self, job: Job, outcome: Outcome, worker_id: str, workflow_end: WorkflowEnd | None = None
    ) -> None:
        env = job.envelope
        kind = outcome.kind
        error, error_type, message = outcome.error, outcome.error_type, outcome.error_message
        if error is None and kind not in ("succeeded", "requeued"):
            if kind == "cancelled":
                error = TaskCancelled(env.id, "cancelled", "TaskCancelled", "cancelled by request")
            elif job.timed_out:
                error = TaskTimeout(message or f"task {env.task} ran longer than its timeout")
            else:
                error = TaskFailed(env.id, kind, error_type, message)
        elif kind == "requeued":
            error = asyncio.CancelledError("the worker stopped; the task was put back on its queue")
        if error is not None and error_type is None and kind != "requeued":
            error_type, message = describe_error(error)
        result = job.result
        if result is NO_RESULT:
            result = None
        context = job.context
        if context is not None:
            token = set_current(context)
            try:
                if kind == "succeeded":
                    await self._safely("after_execute", context, result)
                else:
                    await self._safely("on_error", context, error)
                    if kind == "retried":
                        await self._safely("on_retry", context, error, outcome.delay or 0.0)
                    elif kind in ("failed", "dead_lettered"):
                        await self._safely("on_failure", context, error, kind)
            finally:
                reset_current(token)
        signals = self.signals
        for signal in _SIGNALS.get(kind, ()):
            if signals.has(signal):
                await signals.emit(
                    signal,
                    SignalEvent(
                        signal,
                        env.id,
                        env.task,
                        job.delivery.queue,
                        job.attempt,
                        error=error if kind != "succeeded" else None,
                        error_type=error_type,
                        error_message=message,
                        result=result if kind == "succeeded" else None,
                        delay=outcome.delay,
                        worker=worker_id,
                    ),
                )
        if self.workflow_signals and kind in _FINAL and job.envelope.flow is not None:
            described = (error_type, message)
            broker = self.queue.broker
            end = workflow_end
            await step_ended(signals, broker, job, kind, error, described, result, worker_id, end)

    async def _safely(self, name: str, *args: Any) -> None:
        for hook in self._hooks[name]:
            try:
                await _call(hook, *args)
            except asyncio.CancelledError:
                raise
            except BaseException:  # SystemExit too: logged, the worker goes on
                logger.exception("middleware %s.%s failed", _owner(hook), name)


_WORKFLOW_SIGNALS = (Signal.WORKFLOW_STEP_DONE, Signal.WORKFLOW_COMPLETED, Signal.WORKFLOW_FAILED)
#: Outcomes after which a task never runs again.
_FINAL = frozenset(("succeeded", "failed", "dead_lettered", "cancelled"))


_SIGNALS: dict[str, tuple[Signal, ...]] = {
    "succeeded": (Signal.TASK_SUCCEEDED,),
    "failed": (Signal.TASK_FAILED,),
    "dead_lettered": (Signal.TASK_FAILED, Signal.TASK_DEAD_LETTERED),
    "retried": (Signal.TASK_RETRIED,),
    "cancelled": (Signal.TASK_CANCELLED,),
}


def extensions_of(queue: Any) -> Extensions:
    """The middleware registry (:class:`Extensions`) of ``queue``, a :class:`~blitzq.Queue`."""
    extensions: Extensions = queue._extensions
    return extensions


__all__ = ["Extensions", "extensions_of"]
