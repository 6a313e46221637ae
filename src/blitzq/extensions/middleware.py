"""Middleware: code that runs around every enqueue and every task run of a Queue.

Subclass :class:`Middleware`, override the hooks you need and register an instance with
``queue.add_middleware(m)``. Hooks are coroutines (a plain ``def`` works too):

==============================================  ===============================================
hook                                            when
==============================================  ===============================================
``before_enqueue(message)``                     producer, before a message is published; raise
                                                to refuse the enqueue (nothing is published)
``after_enqueue(message)``                      producer, after it was published
``before_execute(context)``                     worker, before the task body starts
``after_execute(context, result)``              worker, after a run returned ``result``
``on_error(context, exc)``                      worker, after a run failed (each attempt)
``on_retry(context, exc, delay)``               worker, after ``on_error`` when the task will be
                                                retried in ``delay`` seconds
==============================================  ===============================================

``message`` is a :class:`~blitzq.hooks.Outgoing` (``message.envelope`` has the id, task name,
queue, args, kwargs and headers; ``message.due`` is the Unix time it becomes due or ``None``).
A before-enqueue hook may replace ``message.envelope`` (``msgspec.structs.replace(env,
headers=...)``) to change the arguments or headers; the message is then re-encoded. ``context``
is the run's :class:`~blitzq.TaskContext` (the same object ``current_task()`` returns inside
the task).

Order: ``before_*`` hooks run in registration order, ``after_*``, ``on_error`` and
``on_retry`` in reverse order (the first middleware registered wraps all others).

Errors:

- ``before_enqueue`` raising refuses the whole enqueue call (all messages of an
  ``enqueue_many``): a :class:`~blitzq.BlitzQError` (such as :class:`EnqueueRefused`)
  propagates as it is, any other exception is wrapped in :class:`EnqueueRefused` naming the
  middleware and the task.
- ``before_execute`` raising fails the attempt with that exception without running the task
  body (the retry policy applies; ``on_error`` hooks run as for any failure).
- ``after_enqueue``, ``after_execute``, ``on_error`` and ``on_retry`` raising is logged
  (logger ``blitzq.middleware``) and changes nothing: the enqueue succeeds, the worker goes on.

Every run whose before-execute hooks ran ends with exactly one call of either ``after_execute``
(success) or ``on_error`` (failure, timeout, cancellation, or being put back on the queue at
worker shutdown).

Sync tasks (``executor="thread"`` or ``"process"``): ``before_execute`` runs on the worker's
event loop, as a coroutine, before the call is submitted to the thread or process pool; the
after-hooks run on the loop too, after the call returned. After-hooks and signal handlers run
after the run's completion was handed to the writer, concurrently with it: they never delay
the acknowledgement, and cannot change the stored result.

A Queue without middleware and signal handlers pays nothing: the worker checks one boolean
per run.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..context import TaskContext, reset_current, set_current
from ..exceptions import BlitzQError, TaskCancelled, TaskFailed, TaskTimeout, describe_error
from ..serialization import encode_envelope, loads
from .signals import Handler, Signal, SignalEvent, Signals

if TYPE_CHECKING:
    from ..broker.base import Completion
    from ..hooks import EnqueueFilter, EnqueueObserver, Outgoing
    from ..queue import Queue
    from ..worker.execution import Job
    from ..worker.limiter import Slots
    from ..worker.runner import Runner

logger = logging.getLogger("blitzq.middleware")


class EnqueueRefused(BlitzQError):
    """A before-enqueue middleware hook refused the enqueue; nothing was published.

    Raise it (or any exception) from :meth:`Middleware.before_enqueue` to refuse.
    """


class Middleware:
    """Base class of middleware; every hook does nothing unless overridden.

    See the module docstring for when each hook runs, their order and error handling.
    """

    async def before_enqueue(self, message: Outgoing) -> None:
        """Before ``message`` is published; raise to refuse the enqueue.

        Args:
            message: the outgoing message (``message.envelope`` may be replaced).
        """

    async def after_enqueue(self, message: Outgoing) -> None:
        """After ``message`` was published (errors are logged, not raised)."""

    async def before_execute(self, context: TaskContext) -> None:
        """Before the task body runs; raising fails the attempt with that exception.

        Args:
            context: the run's task context (id, task name, queue, attempt, headers).
        """

    async def after_execute(self, context: TaskContext, result: Any) -> None:
        """After a successful run that returned ``result`` (errors are logged)."""

    async def on_error(self, context: TaskContext, exc: BaseException) -> None:
        """After a failed run (each attempt), with the exception (errors are logged).

        ``exc`` is the task's exception; a :class:`~blitzq.TaskTimeout` for a timeout, a
        :class:`~blitzq.TaskCancelled` for a cancellation, ``asyncio.CancelledError`` for a
        run put back on its queue at shutdown, or a :class:`~blitzq.TaskFailed` describing
        the stored error when the exception object is not available.
        """

    async def on_retry(self, context: TaskContext, exc: BaseException, delay: float) -> None:
        """After :meth:`on_error` when the task will run again in ``delay`` seconds."""


_HOOK_NAMES = (
    "before_enqueue",
    "after_enqueue",
    "before_execute",
    "after_execute",
    "on_error",
    "on_retry",
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


_FINAL_STATES = {"succeeded", "failed", "dead_lettered", "cancelled"}


class QueueHooks:
    """Middleware and signal handlers of one Queue, and the calls that run them.

    Made on first use by :func:`hooks_of`. ``enabled`` is the one boolean the worker checks
    per run.
    """

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.middleware: list[Middleware] = []
        self.signals = Signals(self._refresh)
        #: Whether runs need the execution hooks at all (middleware or signal handlers).
        self.enabled = False
        self._hooks: dict[str, list[Callable[..., Any]]] = {name: [] for name in _HOOK_NAMES}
        self._filter_installed = False
        self._observer_installed = False

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
        hooks = self._hooks
        self.enabled = bool(self.signals) or any(
            hooks[n] for n in ("before_execute", "after_execute", "on_error", "on_retry")
        )
        queue = self.queue
        if hooks["before_enqueue"] and not self._filter_installed:
            # First, so a refusal comes before any other filter claims anything.
            enqueue_filter: EnqueueFilter = self._filter
            queue.enqueue_filters.insert(0, enqueue_filter)
            self._filter_installed = True
        if (
            hooks["after_enqueue"] or self.signals.has(Signal.TASK_ENQUEUED)
        ) and not self._observer_installed:
            observer: EnqueueObserver = self._observe
            queue.enqueue_observers.append(observer)
            self._observer_installed = True

    # ---------------------------------------------------------------- enqueue
    async def _filter(self, queue: Queue, batch: list[Outgoing]) -> None:
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

    async def _observe(self, queue: Queue, batch: list[Outgoing]) -> None:
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

    # -------------------------------------------------------------- execution
    def starting(self, runner: Runner, job: Job, slots: Slots) -> None:
        """Run the before-execute hooks, emit TASK_STARTED, then start the run.

        Without before-execute middleware the run starts at once; otherwise the hooks are
        awaited in a task first (the delivery keeps its slot meanwhile).
        """
        env, d = job.envelope, job.delivery
        job.context = TaskContext(
            env.id, env.task, d.queue, job.attempt, job.task.max_attempts,
            env.correlation_id, env.headers,
        )  # fmt: skip
        if not self._hooks["before_execute"]:
            self._started(runner, job)
            runner.run(job, slots, True)
            return
        # The hooks run in a fresh copy of the worker's base context; what they set there
        # (a trace context, ...) is what the task body starts with.
        pending = asyncio.get_running_loop().create_task(
            self._before(runner, job, slots), context=runner.base_context.copy()
        )
        runner.hold_start(pending, job.delivery)

    async def _before(self, runner: Runner, job: Job, slots: Slots) -> None:
        context = job.context
        assert context is not None
        token = set_current(context)
        try:
            for hook in self._hooks["before_execute"]:
                await _call(hook, context)
        except asyncio.CancelledError:
            slots.release()  # cancelled at shutdown: the worker hands the message back
            raise
        except BaseException as exc:  # SystemExit too: it fails the attempt, not the worker
            reset_current(token)
            logger.info(
                "before_execute of %s refused task %s: %s: %s",
                _owner(hook), context.id, *describe_error(exc),
            )  # fmt: skip
            try:
                runner.finish(job, None, exc)
            finally:
                slots.release()
            return
        reset_current(token)
        # A copy: this task's own context stays entered until it returns.
        job.scope = contextvars.copy_context()
        if runner.revoked and job.envelope.id in runner.revoked:
            runner._skip_cancelled(job, slots)
            return
        self._started(runner, job)
        runner.run(job, slots, True)

    def _started(self, runner: Runner, job: Job) -> None:
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
                    worker=runner.worker.id,
                ),
            )

    def committed(
        self,
        runner: Runner,
        job: Job,
        completion: Completion | None,
        error: BaseException | None,
    ) -> None:
        """Called by the runner with each completion of a run: schedule the after-hooks and
        the signals that the completion implies (see the module docstrings)."""
        kind, delay = _classify(job, completion, error)
        if kind is None:
            return
        # After-hooks see the run's context as the task left it (a copy: a thread task
        # abandoned after its timeout may still be inside it).
        scope = job.scope.copy() if job.scope is not None else runner.base_context.copy()
        task = asyncio.get_running_loop().create_task(
            self._after(runner, job, completion, error, kind, delay), context=scope
        )
        self.signals.track(task)

    async def _after(
        self,
        runner: Runner,
        job: Job,
        completion: Completion | None,
        error: BaseException | None,
        kind: str,
        delay: float | None,
    ) -> None:
        from ..worker.execution import NO_RESULT

        env = job.envelope
        error_type = message = None
        if kind != "succeeded" and completion is not None and completion.record is not None:
            try:
                stored = loads(completion.record)
                error_type, message = stored.get("error_type"), stored.get("error")
            except Exception:  # an unreadable record: the event just has no error text
                pass
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
        result = getattr(job, "result", None)
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
                        await self._safely("on_retry", context, error, delay or 0.0)
            finally:
                reset_current(token)
        signals = self.signals
        names = _SIGNALS.get(kind, ())
        for signal in names:
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
                        delay=delay,
                        worker=runner.worker.id,
                    ),
                )

    async def _safely(self, name: str, *args: Any) -> None:
        for hook in self._hooks[name]:
            try:
                await _call(hook, *args)
            except asyncio.CancelledError:
                raise
            except BaseException:  # SystemExit too: logged, the worker goes on
                logger.exception("middleware %s.%s failed", _owner(hook), name)


_SIGNALS: dict[str, tuple[Signal, ...]] = {
    "succeeded": (Signal.TASK_SUCCEEDED,),
    "failed": (Signal.TASK_FAILED,),
    "dead_lettered": (Signal.TASK_FAILED, Signal.TASK_DEAD_LETTERED),
    "retried": (Signal.TASK_RETRIED,),
    "cancelled": (Signal.TASK_CANCELLED,),
}


def _classify(
    job: Job, completion: Completion | None, error: BaseException | None
) -> tuple[str | None, float | None]:
    """What a completion means: ``(kind, retry delay)``; kind ``None`` for nothing to report
    (a reschedule that did not start the task, a record of a state others report)."""
    if completion is None:
        return ("succeeded" if error is None else "failed"), None
    if completion.requeue is not None:
        return "requeued", None
    if completion.reschedule is not None:
        if error is not None or job.timed_out:
            return "retried", max(0.0, completion.delay)
        return None, None
    if completion.dead_letter is not None:
        return "dead_lettered", None
    if completion.record is not None:
        try:
            state = loads(completion.record).get("state")
        except Exception:
            return None, None
        return (state if state in _FINAL_STATES else None), None
    return ("succeeded" if error is None else "failed"), None


def hooks_of(queue: Any) -> QueueHooks:
    """The :class:`QueueHooks` of ``queue``, made on first use."""
    hooks: QueueHooks | None = queue.__dict__.get("_blitzq_hooks")
    if hooks is None:
        hooks = queue.__dict__["_blitzq_hooks"] = QueueHooks(queue)
    return hooks


class MiddlewareOperations:
    """Mixin of :class:`~blitzq.Queue`: middleware and signal registration."""

    def add_middleware(self, middleware: Middleware) -> None:
        """Register ``middleware`` (see :mod:`blitzq.middleware`); register before the worker
        starts or the producer enqueues.

        Raises:
            TypeError: not a :class:`Middleware` instance.
        """
        hooks_of(self).add(middleware)

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """The registered middleware, in registration order."""
        return tuple(hooks_of(self).middleware)

    @property
    def signals(self) -> Signals:
        """The Queue's signal handlers; ``queue.signals.emit(signal, event)`` emits one."""
        return hooks_of(self).signals

    def on(self, signal: Signal | str) -> Callable[[Handler], Handler]:
        """Decorator registering a signal handler (plain function or coroutine function)::

            @queue.on(Signal.TASK_FAILED)
            async def alert(event: SignalEvent) -> None: ...

        Raises:
            ValueError: an unknown signal.
        """
        sig = Signal(signal)

        def register(handler: Handler) -> Handler:
            return hooks_of(self).signals.connect(sig, handler)

        return register


__all__ = [
    "EnqueueRefused",
    "Middleware",
    "MiddlewareOperations",
    "QueueHooks",
    "hooks_of",
]
