"""Running deliveries: the executors, timeouts, cancel and shutdown of runs.

A delivery's path, stage by stage, each with one owner: :class:`~.admission.Admission`
decodes and looks it up (cancel marks, rate limits, start checks); :meth:`Runner.run` runs
it on the task's executor with :func:`~blitzq.current_task` set (its timers armed by
:class:`~.timeouts.Timeouts`); :meth:`Runner.run_ended` frees its slot when the code has
really stopped running, exactly once per delivery; and :class:`~.ending.Ending` does
everything the end of a run means (record, finishers, logs, progress, metrics, middleware,
the flusher).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from ..broker import Broker, Completion, Delivery
from ..context import set_current
from ..exceptions import SerializationError
from ..extensions.registry import extensions_of
from ..serialization import decode_envelope
from .admission import Admission, Call
from .completions import Completions
from .cpu import CpuExecutor, CpuOwner, ForkRefused
from .eager_start import EagerStart
from .ending import Ending
from .execution import Job
from .executors import ProcessPool, ThreadPool
from .flusher import Flusher
from .lifecycle import Lifecycle
from .limiter import Slots
from .maintenance import running_record_ttl
from .progress import ProgressReporter
from .recent import EndNotes
from .recycling import recycle_after
from .timeouts import Timeouts
from .unknown import UnknownTasks

if TYPE_CHECKING:
    from ..dependencies import Resources
    from ..queue import Queue
    from ..task import Task
    from .deferral import OutageBackoff
    from .tally import RunTally
    from .unknown import Knowers

logger = logging.getLogger("blitzq.worker")

#: Seconds the worker's close waits for start checks that ignore their cancellation.
_CLOSE_GRACE = 1.0


class Owner(CpuOwner, Protocol):
    """What the runner and the stages it owns see of the worker (a :class:`~blitzq.Worker`):
    its settings, resources and counters, and its restart (the stages' own views of it,
    :class:`~.admission.AdmittingRunner`, :class:`~.timeouts.TimedRunner` and
    :class:`~.unknown.HandingRunner`, are parts of this one)."""

    @property
    def id(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def queue(self) -> Queue: ...

    @property
    def broker(self) -> Broker: ...

    @property
    def resources(self) -> Resources: ...

    @property
    def knowers(self) -> Knowers: ...

    @property
    def outage_backoff(self) -> OutageBackoff: ...

    @property
    def thread_pool_size(self) -> int: ...

    @property
    def process_pool_size(self) -> int: ...

    @property
    def max_tasks_per_child(self) -> int | None: ...

    @property
    def max_memory_per_child(self) -> int | None: ...

    @property
    def max_abandoned_threads(self) -> int: ...

    @property
    def unknown_task_grace(self) -> float: ...

    @property
    def failure_log_level(self) -> int: ...

    @property
    def retry_log_level(self) -> int: ...

    @property
    def lifecycle_log_level(self) -> int: ...

    @property
    def stopping(self) -> bool: ...

    handed_back: int

    def request_restart(self, reason: str, level: int = logging.ERROR) -> None: ...


class Runner:
    """Starts deliveries for one worker, and owns the stages of their runs; the
    :class:`~blitzq.extensions.middleware.WorkerContext` its middleware see.

    Admission (decode, cancel marks, start checks) is :attr:`admission`, the timers
    :attr:`timeouts`, the end of a run (record, finishers, writer, middleware outcome)
    :attr:`ending`.

    Args:
        worker: the owning worker (its queue, id and pool sizes).
        broker: the worker's broker.
        flusher: where completions go.
    """

    def __init__(self, worker: Owner, broker: Broker, flusher: Flusher) -> None:
        queue = worker.queue
        self.worker = worker
        self.worker_id: str = worker.id
        self.broker = broker
        self._flusher = flusher
        self.result_ttl: int = queue.result_ttl
        self.visibility_timeout: float = queue.visibility_timeout
        self.tasks = queue.tasks
        self.max_message_size, self.max_deliveries = queue.max_message_size, queue.max_deliveries
        self.track_state = queue.track_state
        #: The task lifecycle records (received, started, succeeded).
        self.lifecycle = Lifecycle(worker.lifecycle_log_level, worker.id)
        #: Builds the completion of each way a run ends.
        self.completions = Completions(
            worker.id,
            queue.store_results,
            queue.result_ttl,
            queue.max_message_size,
            queue.max_result_size,
        )
        self.completions.running_ttl = running_record_ttl(
            queue.result_ttl, queue.visibility_timeout
        )
        self.jobs: set[Job] = set()
        #: Runs started, counted only under a ``max_tasks_per_child`` limit (.recycling).
        self.started, self.start_limit = 0, worker.max_tasks_per_child or 0
        self._threads: ThreadPool | None = None
        self._processes: ProcessPool | None = None
        #: The CPU pool's side of this worker: which tasks run there, the pool itself.
        self.cpu = CpuExecutor(worker, self.tasks)
        #: Pool processes killed (hard timeout, cancel) and not yet reaped: the slot of the
        #: run that caused it is freed only once they are.
        self.killed_processes: list[Any] = []
        #: The join of killed pool processes in progress, if any.
        self.reaping: asyncio.Future[None] | None = None
        #: Starts awaiting their checks or before-execute hooks, with their delivery: not
        #: started yet, but leased (renewed like running tasks) and requeued at shutdown.
        self.starting: dict[asyncio.Task[None], Delivery] = {}
        self._given_back: set[asyncio.Task[None]] = set()  # of those, handed back at shutdown
        #: Middleware and signal handlers; ``hooks.enabled`` is checked once per run.
        self.extensions = extensions_of(queue)
        #: Progress writer of this worker (``current_task().update_progress``).
        self.progress = ProgressReporter(broker, queue.result_ttl, self.lease_of)
        #: The worker's base context (taken when the worker starts): every run gets a
        #: fresh copy of it, so context variables never leak from one task to the next.
        self._base_context = contextvars.copy_context()
        self._observer: RunTally | None = None
        #: Hard and soft timeouts, and the thread runs abandoned at theirs.
        self.timeouts = Timeouts(self)
        #: The end of every run: record, finishers, logs, progress, observer, middleware.
        self.ending = Ending(
            self.completions,
            flusher,
            self.progress,
            self.extensions,
            self.lifecycle,
            worker.id,
            queue.track_state,
            worker.failure_log_level,
            worker.retry_log_level,
            self._base_context,
            self.timeouts,
        )
        if queue.recent_index:
            self.notes: EndNotes | None = EndNotes(queue.recent_index, queue.result_ttl)
            self.ending.tap = self.notes.note
        else:
            self.notes = None
        #: The first stage of every delivery (the fetch loops call ``admission.start``).
        self.admission = Admission(self)
        #: What admission does with a delivery naming a task this worker does not know.
        self.unknown = UnknownTasks(self)
        self._run_ended = self.run_ended  # bound once: a run's done-callback reuses it
        #: Starts the async runs (their first step inline, see :mod:`.eager_start`).
        self.eager = EagerStart()

    # ------------------------------------------- shared with the stages, kept in step
    @property
    def observer(self) -> RunTally | None:
        """The worker's metrics (``Worker(metrics_port=...)``; the eager test mode's
        outcome keeper, :mod:`blitzq.testing.inline`), told of every run; else ``None``."""
        return self._observer

    @observer.setter
    def observer(self, observer: RunTally | None) -> None:
        self._observer = self.ending.observer = observer

    @property
    def thread_pool(self) -> ThreadPool | None:
        """The pool of the thread tasks' calls, once one ran (made on first use)."""
        return self._threads

    @property
    def flusher(self) -> Flusher:
        """Where completions go (the eager mode gives each drain a fresh one)."""
        return self._flusher

    @flusher.setter
    def flusher(self, flusher: Flusher) -> None:
        self._flusher = self.ending.flusher = flusher

    @property
    def base_context(self) -> contextvars.Context:
        """The context every run starts from a fresh copy of."""
        return self._base_context

    @base_context.setter
    def base_context(self, context: contextvars.Context) -> None:
        self._base_context = self.ending.base_context = context

    @property
    def revoked(self) -> dict[str, float]:
        """Cancel marks this worker knows, task id -> expiry (Unix seconds)."""
        return self.admission.revoked

    @revoked.setter
    def revoked(self, marks: dict[str, float]) -> None:
        self.admission.revoked = marks

    # ------------------------------------------------------------- starting
    @property
    def idle(self) -> bool:
        """Whether nothing runs here and no start is pending (burst mode asks)."""
        return not self.jobs and not self.starting

    def hold_start(self, pending: asyncio.Task[None], d: Delivery) -> None:
        """Track ``pending``, a coroutine that will start (or end) delivery ``d``."""
        self.starting[pending] = d
        pending.add_done_callback(self.starting.pop)

    def hand_back(self, d: Delivery) -> None:
        """Put a delivery this worker did not start back on its queue, untouched.

        Reliable mode acknowledges it and adds it again at the tail of its stream, with the
        delivery count it had (a recovered message keeps counting towards max_deliveries), in
        one atomic completion; fast mode pushes it back to the head of its list.
        """
        try:
            task_id = decode_envelope(d.payload).id
        except SerializationError:
            task_id = (d.token or b"").decode() or "unknown"
        self._flusher.add(Completion(d.queue, d.token, task_id, requeue=d.payload))

    def give_back(self, d: Delivery, slots: Slots, job: Job | None = None) -> None:
        """Put delivery ``d``, fetched but never started here (past
        ``max_tasks_per_child``), back on its queue untouched (:meth:`hand_back`: same
        attempt) and free its slot of ``slots``.

        ``job``: the delivery's job when its start checks already ran; the task's finishers
        then see the requeue (:meth:`.ending.Ending.handed_back`).
        """
        if job is not None and job.task.finishers:
            self.ending.handed_back(job)
        else:
            self.hand_back(d)
        self.worker.handed_back += 1
        slots.release()

    def count_start(self, job: Job, slots: Slots) -> bool:
        """Count the start of ``job`` against :attr:`start_limit` (``max_tasks_per_child``,
        not 0); return whether it may start.

        The limit-th start asks for the restart (:func:`.recycling.recycle_after`). Past the
        limit the delivery is given back (:meth:`give_back`): ``False``.
        """
        if self.started >= self.start_limit:
            self.give_back(job.delivery, slots, job)
            return False
        self.started += 1
        if self.started == self.start_limit:
            recycle_after(self.worker, self.started)
        return True

    def reschedule(self, job: Job, delay: float, reserved: bool | None = None) -> Completion:
        """Completion putting ``job`` back on the schedule for ``delay`` seconds, unstarted.

        The attempt is unchanged and no slot is held while it waits (rate limits, locks).

        Args: see :meth:`.completions.Completions.reschedule`.
        """
        return self.completions.reschedule(job, delay, reserved)

    def write(self, completion: Completion) -> None:
        """Hand ``completion`` to the flusher (written with the next group commit)."""
        self._flusher.add(completion)

    def run(self, job: Job, slots: Slots, hooked: bool = False) -> None:
        """Run ``job`` on its task's executor.

        ``hooked``: the queue's middleware already saw the start (see
        :mod:`blitzq.extensions.registry`).
        """
        if not hooked and self.start_limit and not self.count_start(job, slots):
            return  # past max-tasks-per-child: handed back, not started (.recycling)
        if not hooked and self.extensions.enabled:
            self.extensions.context_for(job)
            if not self.extensions.has_before:
                self.extensions.started(job, self.worker_id)
            else:
                # The hooks run in a fresh copy of the worker's base context; what they set
                # there (a trace context, ...) is what the task body starts with.
                pending = asyncio.get_running_loop().create_task(
                    self._before_execute(job, slots), context=self._base_context.copy()
                )
                self.hold_start(pending, job.delivery)
                return
        env, task = job.envelope, job.task
        job.started_at = time.time()
        if self.lifecycle.on:
            self.lifecycle.event("started", env, job.delivery.queue, job.attempt)
        if self._observer is not None:
            self._observer.started(job)
        # The run's TaskContext is made when first asked for (Job.task_context), unless the
        # middleware hooks made it already.
        job.reporter = self.progress
        context = job.context
        if context is not None:
            context._reporter = self.progress
        if self.track_state:
            self._flusher.add(self.completions.progress(job))
        executor = task.executor if task.executor != "thread" else self.executor_of(task)
        # The run's own context: nothing it sets is seen by the worker or the next task.
        scope = job.scope
        if scope is None:  # else made by the middleware hooks
            scope = job.scope = self._base_context.copy()
        args, kwargs = env.args, env.kwargs
        if task.prepared_call or executor != "async":
            call = self.admission.arguments(job, slots)
            if call is None:
                return
            args, kwargs = call
        if executor == "async":
            try:
                current = context if context is not None else job
                result, error, started = self.eager.start(scope, current, task.fn, args, kwargs)
            except BaseException as exc:
                # A TypeError here is a call that does not fit the signature: no retry.
                self.ending.finish(job, None, exc, retry=not isinstance(exc, TypeError))
                slots.release()
                return
            if started is None:
                if env.timeout or task.timeout:  # ended in its first step: it never yielded
                    self.timeouts.overran(job)
                self.ending.finish(job, result, error)
                slots.release()
                return
            handle: asyncio.Future[Any] = started
        else:
            scope.run(set_current, job.task_context())
            try:
                handle = self._submit(job, scope, (args, kwargs), executor)
            except Exception as exc:  # the pool refused the call: a failed attempt
                self.ending.finish(job, None, exc)
                slots.release()
                return
        job.handle = handle
        self.jobs.add(job)
        if env.timeout or task.timeout or task.controls.soft_timeout:
            self.timeouts.arm(job, slots)  # hard and soft timeouts (worker/timeouts.py)
        handle.add_done_callback(functools.partial(self._run_ended, job, slots))

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
                self.ending.finish(job, None, refused)
            finally:
                slots.release()
            return
        # A copy: this task's own context stays entered until it returns.
        job.scope = contextvars.copy_context()
        revoked = self.admission.revoked
        if revoked and job.envelope.id in revoked:
            self.admission.skip_cancelled(job, slots)
            return
        self.extensions.started(job, self.worker_id)
        self.run(job, slots, True)

    def executor_of(self, task: Task[Any, Any]) -> str:
        """Where ``task`` runs in this worker (:meth:`.cpu.CpuExecutor.executor_of`)."""
        return self.cpu.executor_of(task)

    def _submit(
        self, job: Job, scope: contextvars.Context, call: Call, executor: str
    ) -> asyncio.Future[Any]:
        """Hand a sync task's call to the thread pool (run in ``scope``), the process pool or
        the CPU pool."""
        task, (args, kwargs) = job.task, call
        if executor == "cpu":
            return self.cpu.pool().submit(task.fn, args, kwargs)
        if executor == "thread":
            if self._threads is None:
                self._threads = ThreadPool(self.worker.thread_pool_size, "blitzq-task")
            run = functools.partial(task.fn, *args, **kwargs)
            if task.controls.soft_timeout:
                run = self.timeouts.interruptible(job, run)
            job.pool_call = self._threads.submit(scope.run, run)
            return asyncio.wrap_future(job.pool_call)
        if self._processes is None:
            w = self.worker
            self._processes = ProcessPool(
                w.process_pool_size, w.max_tasks_per_child, w.max_memory_per_child
            )
        return self._processes.submit(task.fn, args, kwargs)

    # -------------------------------------------------------------- ending
    def run_ended(self, job: Job, slots: Slots, handle: asyncio.Future[Any]) -> None:
        """The run's call really ended: free its slot of ``slots``, then commit what it
        came to (:meth:`.ending.Ending.ended`), unless already committed."""
        timeouts = self.timeouts
        if timeouts.abandoned and job in timeouts.abandoned:
            timeouts.returned(job)  # committed at the timeout; it kept its slot till now
            slots.release()
            timeouts.forget(job)
            if not handle.cancelled():
                handle.exception()
            return
        self.jobs.discard(job)
        timer = job.timer
        if timer is not None:
            timer.cancel()
            if job.task.executor == "async" and timer.when() <= asyncio.get_running_loop().time():
                timeouts.overran(job)  # a timer due that never fired: the loop was blocked
        if job.task.executor == "process" and (self.killed_processes or self.reaping):
            self._release_once_reaped(slots)
        else:
            slots.release()
        refused = not handle.cancelled() and isinstance(handle.exception(), ForkRefused)
        if refused and not job.finished:  # it never ran: back on its queue it goes
            job.finished = True
            self.ending.commit(job, Completions.requeue(job))
        self.ending.ended(job, handle)
        if timer is not None:  # only a run with timers has anything to forget
            timeouts.forget(job)

    def _release_once_reaped(self, slots: Slots) -> None:
        """Free a process run's slot once the pool processes killed (for it or a sibling
        in the same pool) have exited: joined in a thread, since a SIGKILLed process may
        still be exiting when its pool reports it broken."""
        if self.killed_processes:
            killed, self.killed_processes = self.killed_processes, []

            def reap() -> None:
                for process in killed:
                    process.join(10.0)

            self.reaping = asyncio.ensure_future(asyncio.to_thread(reap))
        reaping = self.reaping
        if reaping is None or reaping.done():
            self.reaping = None
            slots.release()
        else:
            reaping.add_done_callback(lambda _: slots.release())

    def kill_run(self, job: Job) -> None:
        """Stop a process or CPU-pool run (a hard timeout, a cancel): a CPU-pool run's child
        is killed alone (:meth:`.cpu_pool.CpuPool.kill`), a process run's whole pool."""
        if self.executor_of(job.task) == "cpu":
            self.cpu.kill(job.handle)
        else:
            self.kill_process_run(job)

    def kill_process_run(self, job: Job) -> None:
        """Terminate the process pool running ``job``; requeue the other process tasks in it.

        The slot of ``job`` is freed when its future fails and the killed processes are
        reaped (:attr:`killed_processes`), so the concurrency bound counts a dying process
        too.
        """
        pool = self._processes
        if pool is None:
            return
        for other in list(self.jobs):
            if other is not job and other.task.executor == "process" and not other.finished:
                other.finished = True  # its broken future is ignored; the message goes back
                self.ending.commit(other, Completions.requeue(other))
        self.killed_processes.extend(pool.shutdown(kill=True))
        self._processes = None

    # --------------------------------------------------------- cancellation
    def cancel(self, task_id: str) -> bool:
        """Cancel a running task of this worker; return whether one was running here.

        Async tasks are cancelled at once; thread tasks see ``current_task().cancelled``;
        a CPU-pool task's child is killed (its process group); process tasks are terminated
        by restarting the process pool (other process tasks running in it go back on their
        queue, attempt unchanged, as for a hard timeout).
        """
        found = False
        for job in list(self.jobs):
            if job.envelope.id != task_id or job.finished:
                continue
            found = True
            job.task_context().cancelled = True  # made now if the run never asked for it
            if job.task.executor == "async":
                job.handle.cancel()
            elif self.executor_of(job.task) in ("process", "cpu"):
                self.kill_run(job)
        if found:  # its slot frees: what starts there next is checked against fresh marks
            self.admission.reread_marks()
        return found

    def requeue_unfinished(self) -> int:
        """At shutdown: put every job still running, and every delivery still waiting for
        its start checks or before-execute hooks (those are cancelled), back on its queue;
        return how many."""
        leftover = [j for j in self.jobs if not j.finished]
        for job in leftover:
            job.finished = True
            self.ending.commit(job, Completions.requeue(job))
            if job.handle is not None:
                job.handle.cancel()
        starting = [(t, d) for t, d in self.starting.items() if not t.done()]
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
        if self.starting:
            tokens += [
                d.token for d in self.starting.values() if d.queue == queue and d.token is not None
            ]
        return tokens

    async def close(self, killed: bool) -> None:
        """Wait for start checks in flight; stop the thread and process pools."""
        if self.starting:  # cancelled by requeue_unfinished when the shutdown timed out
            _, stuck = await asyncio.wait(list(self.starting), timeout=_CLOSE_GRACE)
            for pending in stuck:  # ignores its cancellation: hand its message back anyway
                if pending not in self._given_back:
                    self._given_back.add(pending)
                    self.hand_back(self.starting[pending])
            await asyncio.sleep(0)  # let the done-callbacks of cancelled ones run
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        if self._processes is not None:
            self._processes.shutdown(kill=killed)
        await self.cpu.close()
