"""Running deliveries: the executors, timeouts, cancel and shutdown of runs.

The per-task hot path goes through here: :mod:`.admission` decodes and looks up the
delivery (cancel marks, rate limits, start checks), the :class:`Runner` runs it on the
task's executor with :func:`~blitzq.current_task` set, and :mod:`.outcomes` turns the end of
the run into a completion for the flusher (built by :mod:`.execution`). A slot taken by the
fetch loop is released exactly once per delivery, when the code has really stopped running.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from ..broker import Broker, Completion, Delivery
from ..context import TaskContext, set_current
from ..exceptions import SerializationError
from ..extensions.registry import extensions_of
from ..serialization import decode_envelope
from . import admission, outcomes
from .eager import start_eagerly
from .execution import Job, Outcomes
from .executors import ProcessPool, ThreadPool
from .flusher import Flusher
from .lifecycle import Lifecycle
from .limiter import Slots
from .maintenance import running_record_ttl
from .progress import ProgressReporter
from .recycling import count_start
from .timeouts import (
    abandon_thread,
    interruptible,
    kill_process_run,
    soft_timeout,
    start_timers,
)
from .timeouts import timeout_error as _timeout_error

if TYPE_CHECKING:
    from .tally import RunTally
    from .worker import Worker

logger = logging.getLogger("blitzq.worker")

#: Seconds the worker's close waits for start checks that ignore their cancellation.
_CLOSE_GRACE = 1.0


class Runner:
    """Starts deliveries and commits their outcomes for one worker; the
    :class:`~blitzq.extensions.middleware.WorkerContext` its middleware see.

    Admission (cancel marks, start checks such as rate limits) is in :mod:`.admission`, the
    end of a run (finishers, writer, middleware outcome) in :mod:`.outcomes`.

    Args:
        worker: the owning worker (its queue, id and pool sizes).
        broker: the worker's broker.
        flusher: where completions go.
    """

    def __init__(self, worker: Worker, broker: Broker, flusher: Flusher) -> None:
        queue = worker.queue
        self.worker = worker
        self.worker_id: str = worker.id
        self.broker = broker
        self.flusher = flusher
        self.result_ttl: int = queue.result_ttl
        self.visibility_timeout: float = queue.visibility_timeout
        self.tasks = queue.tasks
        self.max_message_size = queue.max_message_size
        self.track_state = queue.track_state
        #: Levels of the records of failed attempts (:func:`.outcomes.log_failure`).
        self.failure_log_level: int = worker.failure_log_level
        self.retry_log_level: int = worker.retry_log_level
        #: The task lifecycle records (received, started, succeeded).
        self.lifecycle = Lifecycle(worker.lifecycle_log_level, worker.id)
        self.outcomes = Outcomes(
            worker.id, queue.store_results, queue.result_ttl, queue.max_message_size,
            queue.max_result_size,
        )  # fmt: skip
        self.outcomes.running_ttl = running_record_ttl(queue.result_ttl, queue.visibility_timeout)
        self.jobs: set[Job] = set()
        self.revoked: dict[str, float] = {}
        self.processed = 0
        self.failed = 0
        #: Runs started, counted only under a ``max_tasks_per_child`` limit (.recycling).
        self.started, self.start_limit = 0, worker.max_tasks_per_child or 0
        self._threads: ThreadPool | None = None
        self._processes: ProcessPool | None = None
        #: Pool processes killed (hard timeout, cancel) and not yet reaped: the slot of the
        #: run that caused it is freed only once they are.
        self.killed_processes: list[Any] = []
        #: The join of killed pool processes in progress, if any.
        self.reaping: asyncio.Future[None] | None = None
        #: Starts awaiting their checks or before-execute hooks, with their delivery: not
        #: started yet, but leased (renewed like running tasks) and requeued at shutdown.
        self._pending: dict[asyncio.Task[None], Delivery] = {}
        self._given_back: set[asyncio.Task[None]] = set()  # of those, handed back at shutdown
        #: Thread runs past their hard timeout whose thread has not returned, with the
        #: slots each keeps until it does.
        self.abandoned: dict[Job, Slots] = {}
        #: Thread runs abandoned since the worker started.
        self.abandoned_total = 0
        #: The broker's cancel marks being read for this fetch batch, if any.
        self.marks: asyncio.Future[dict[str, float]] | None = None
        #: Middleware and signal handlers; ``hooks.enabled`` is checked once per run.
        self.extensions = extensions_of(queue)
        #: Progress writer of this worker (``current_task().update_progress``).
        self.progress = ProgressReporter(broker, queue.result_ttl, self.lease_of)
        #: The worker's base context (taken when the worker starts): every run gets a
        #: fresh copy of it, so context variables never leak from one task to the next.
        self.base_context = contextvars.copy_context()
        #: The worker's metrics (``Worker(metrics_port=...)``; the eager test mode's outcome
        #: keeper, :mod:`blitzq.testing.inline`), told of every run; else None.
        self.observer: RunTally | None = None

    # ------------------------------------------------------------- starting
    def start(self, d: Delivery, slots: Slots) -> None:
        """Begin one delivery that holds one slot of ``slots`` (:func:`.admission.start`)."""
        admission.start(self, d, slots)

    @property
    def idle(self) -> bool:
        """Whether nothing runs here and no start is pending (burst mode asks)."""
        return not self.jobs and not self._pending

    def hold_start(self, pending: asyncio.Task[None], d: Delivery) -> None:
        """Track ``pending``, a coroutine that will start (or end) delivery ``d``."""
        self._pending[pending] = d
        pending.add_done_callback(self._pending.pop)

    def hand_back(self, d: Delivery) -> None:
        """Put a delivery this worker did not start back on its queue, untouched.

        Reliable mode acknowledges it and adds it again at the tail of its stream (delivery
        count 1) in one atomic completion; fast mode pushes it back to the head of its list.
        """
        try:
            task_id = decode_envelope(d.payload).id
        except SerializationError:
            task_id = (d.token or b"").decode() or "unknown"
        self.flusher.add(Completion(d.queue, d.token, task_id, requeue=d.payload))

    def reschedule(self, job: Job, delay: float, reserved: bool | None = None) -> Completion:
        """Completion putting ``job`` back on the schedule for ``delay`` seconds, unstarted.

        The attempt is unchanged and no slot is held while it waits (rate limits, locks).

        Args: see :meth:`.execution.Outcomes.reschedule`.
        """
        return self.outcomes.reschedule(job, delay, reserved)

    def write(self, completion: Completion) -> None:
        """Hand ``completion`` to the flusher (written with the next group commit)."""
        self.flusher.add(completion)

    def run(self, job: Job, slots: Slots, hooked: bool = False) -> None:
        """Run ``job`` on its task's executor.

        ``hooked``: the queue's middleware already saw the start (see
        :mod:`blitzq.extensions.registry`).
        """
        if not hooked and self.start_limit and not count_start(self, job, slots):
            return  # past max-tasks-per-child: handed back, not started (.recycling)
        if not hooked and self.extensions.enabled:
            self.extensions.context_for(job)
            if not self.extensions.has_before:
                self.extensions.started(job, self.worker_id)
            else:
                # The hooks run in a fresh copy of the worker's base context; what they set
                # there (a trace context, ...) is what the task body starts with.
                pending = asyncio.get_running_loop().create_task(
                    self._before_execute(job, slots), context=self.base_context.copy()
                )
                self.hold_start(pending, job.delivery)
                return
        env, task = job.envelope, job.task
        job.started_at = time.time()
        if self.lifecycle.on:
            self.lifecycle.event("started", env, job.delivery.queue, job.attempt)
        if self.observer is not None:
            self.observer.started(job)
        context = job.context
        if context is None:  # else made by the middleware hooks
            context = TaskContext(
                env.id, env.task, job.delivery.queue, job.attempt, task.max_attempts,
                env.correlation_id, env.headers, flow=env.flow, options=env.options,
            )  # fmt: skip
            job.context = context
        context._reporter = self.progress
        if self.track_state:
            self.flusher.add(self.outcomes.progress(job, "running"))
        executor = task.executor
        # The run's own context: nothing it sets is seen by the worker or the next task.
        scope = job.scope
        if scope is None:  # else made by the middleware hooks
            scope = job.scope = self.base_context.copy()
        args, kwargs = env.args, env.kwargs
        if task.prepared_call or executor != "async":
            call = admission.call_arguments(self, job, slots)
            if call is None:
                return
            args, kwargs = call
        if executor == "async":
            try:
                result, error, started = start_eagerly(scope, context, task.fn, args, kwargs)
            except BaseException as exc:
                # A TypeError here is a call that does not fit the signature: no retry.
                self.finish(job, None, exc, retry=not isinstance(exc, TypeError))
                slots.release()
                return
            if started is None:
                outcomes.finish(self, job, result, error)
                slots.release()
                return
            handle: asyncio.Future[Any] = started
        else:
            scope.run(set_current, context)
            try:
                handle = self._submit(job, scope, (args, kwargs))
            except Exception as exc:  # the pool refused the call: a failed attempt
                self.finish(job, None, exc)
                slots.release()
                return
        job.handle = handle
        self.jobs.add(job)
        if env.timeout or task.timeout or task.controls.soft_timeout:
            start_timers(self, job, slots)  # hard and soft timeouts (worker/timeouts.py)
        handle.add_done_callback(functools.partial(outcomes.run_ended, self, job, slots))

    async def _before_execute(self, job: Job, slots: Slots) -> None:
        """Await the before-execute middleware (the delivery keeps its slot meanwhile), then
        run ``job``, or fail the attempt with the exception of a hook that refused it."""
        try:
            refused = await self.extensions.before_execute(job)
        except asyncio.CancelledError:
            slots.release()  # cancelled at shutdown: the worker hands the message back
            raise
        if refused is not None:
            try:
                self.finish(job, None, refused)
            finally:
                slots.release()
            return
        # A copy: this task's own context stays entered until it returns.
        job.scope = contextvars.copy_context()
        if self.revoked and job.envelope.id in self.revoked:
            admission.skip_cancelled(self, job, slots)
            return
        self.extensions.started(job, self.worker_id)
        self.run(job, slots, True)

    def _submit(
        self, job: Job, scope: contextvars.Context, call: admission.Call
    ) -> asyncio.Future[Any]:
        """Hand a sync task's call to the thread pool (run in ``scope``) or the process pool."""
        task, (args, kwargs) = job.task, call
        if task.executor == "thread":
            if self._threads is None:
                self._threads = ThreadPool(self.worker.thread_pool_size, "blitzq-task")
            run = functools.partial(task.fn, *args, **kwargs)
            if task.controls.soft_timeout:
                run = interruptible(job, run)
            job.pool_call = self._threads.submit(scope.run, run)
            return asyncio.wrap_future(job.pool_call)
        if self._processes is None:
            w = self.worker
            self._processes = ProcessPool(
                w.process_pool_size, w.max_tasks_per_child, w.max_memory_per_child
            )
        return self._processes.submit(task.fn, args, kwargs)

    # ------------------------------------------------------------ finishing
    def finish(
        self, job: Job, result: Any, error: BaseException | None, retry: bool = True
    ) -> None:
        """Commit the outcome of a run that returned ``result`` or raised ``error``
        (:func:`.outcomes.finish`; ``retry=False``: a bad call, no retry)."""
        outcomes.finish(self, job, result, error, retry)

    def commit(
        self,
        job: Job,
        completion: Completion | None,
        error: BaseException | None = None,
        cancelled: bool = False,
    ) -> None:
        """Hand a job's completion on, through its finishers and middleware
        (:func:`.outcomes.commit`)."""
        outcomes.commit(self, job, completion, error, cancelled)

    def on_timeout(self, job: Job, soft: bool = False, slots: Slots | None = None) -> None:
        """The run passed its hard timeout (or its soft one, ``soft=True``).

        Hard: cancel an async task; for a thread task record the failure now; its thread
        is *abandoned* and keeps its slot until the call returns (see
        :func:`~blitzq.worker.timeouts.abandon_thread`), or its call is cancelled if the
        pool had not started it; terminate a process task (its slot is freed once the
        process is reaped). Soft: see :func:`~blitzq.worker.timeouts.soft_timeout`.
        ``slots``: those the run holds.
        """
        if job.finished:
            return
        if soft:
            soft_timeout(job)
            return
        job.timed_out = True
        if job.task.executor == "async":
            job.handle.cancel()
            return
        job.finished = True
        self.failed += 1
        error = _timeout_error(job)
        self.commit(job, self.outcomes.failure(job, error), error)
        if job.task.executor == "process":
            kill_process_run(self, job)
        elif job.pool_call is not None and job.pool_call.cancel():
            pass  # never started, so it never runs: its slot is freed by run_ended
        elif slots is not None:
            abandon_thread(self, job, slots)

    # --------------------------------------------------------- cancellation
    def cancel(self, task_id: str) -> bool:
        """Cancel a running task of this worker; return whether one was running here.

        Async tasks are cancelled at once; thread tasks see ``current_task().cancelled``;
        process tasks are terminated by restarting the process pool (other process tasks
        running in it go back on their queue, attempt unchanged, as for a hard timeout).
        """
        found = False
        for job in list(self.jobs):
            if job.envelope.id != task_id or job.finished or job.context is None:
                continue
            found = True
            job.context.cancelled = True
            if job.task.executor == "async":
                job.handle.cancel()
            elif job.task.executor == "process":
                kill_process_run(self, job)
        return found

    def requeue_unfinished(self) -> int:
        """At shutdown: put every job still running, and every delivery still waiting for
        its start checks or before-execute hooks (those are cancelled), back on its queue;
        return how many."""
        leftover = [j for j in self.jobs if not j.finished]
        for job in leftover:
            job.finished = True
            self.commit(job, Outcomes.requeue(job))
            if job.handle is not None:
                job.handle.cancel()
        starting = [(t, d) for t, d in self._pending.items() if not t.done()]
        for pending, d in starting:
            # Handed back once the cancellation has ended it, so a before-execute hook that
            # swallows the cancellation and starts the run cannot make it run twice.
            pending.add_done_callback(functools.partial(self._hand_back_cancelled, d))
            pending.cancel()
        return len(leftover) + len(starting)

    def _hand_back_cancelled(self, d: Delivery, pending: asyncio.Task[None]) -> None:
        if pending.cancelled() and pending not in self._given_back:
            self._given_back.add(pending)
            self.hand_back(d)

    def lease_of(self, task_id: str) -> tuple[str, bytes] | None:
        """``(queue, token)`` of the running delivery of ``task_id`` (fencing its progress
        writes), or ``None``."""
        for job in self.jobs:
            if job.envelope.id == task_id and job.delivery.token is not None:
                return job.delivery.queue, job.delivery.token
        return None

    def running_tokens(self, queue: str) -> list[bytes]:
        """Delivery tokens from physical ``queue`` this worker holds: running jobs, and
        deliveries still waiting for their start checks or before-execute hooks."""
        tokens = [
            j.delivery.token
            for j in self.jobs
            if j.delivery.queue == queue and j.delivery.token is not None
        ]
        if self._pending:
            tokens += [
                d.token for d in self._pending.values() if d.queue == queue and d.token is not None
            ]
        return tokens

    async def close(self, killed: bool) -> None:
        """Wait for start checks in flight; stop the thread and process pools."""
        if self._pending:  # cancelled by requeue_unfinished when the shutdown timed out
            _, stuck = await asyncio.wait(list(self._pending), timeout=_CLOSE_GRACE)
            for pending in stuck:  # ignores its cancellation: hand its message back anyway
                if pending not in self._given_back:
                    self._given_back.add(pending)
                    self.hand_back(self._pending[pending])
            await asyncio.sleep(0)  # let the done-callbacks of cancelled ones run
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.shutdown(kill=killed)
