"""Running deliveries: checks before a start, the executors, and what happens at the end.

The per-task hot path lives here: decode → look up → (revoked? rate-limited?) → run on the
task's executor with :func:`~blitzq.current_task` set → turn the outcome into a completion for
the flusher. A slot taken by the fetch loop is released exactly once per delivery, when the
code has really stopped running.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec

from ..broker.base import Broker, Completion, Delivery
from ..context import TaskContext, set_current
from ..exceptions import BrokerError, SerializationError, describe_error
from ..extensions.expiry import checks_with_expiry
from ..extensions.middleware import hooks_of
from ..routing import base_queue
from ..serialization import Envelope, decode_envelope, encode_envelope, envelope_head
from ..task import Task
from .execution import Job, Outcomes
from .executors import ProcessPool, ThreadPool, start_eagerly, unwrap
from .flusher import Flusher
from .limiter import Slots
from .progress import ProgressReporter
from .timeouts import (
    abandon_thread,
    forget,
    interruptible,
    kill_process_run,
    soft_timeout,
    start_timers,
    thread_returned,
)
from .timeouts import timeout_error as _timeout_error

if TYPE_CHECKING:
    from .worker import Worker

logger = logging.getLogger("blitzq.worker")

_NO_BUCKETS: list[tuple[str, float, float]] = []

#: Seconds the worker's close waits for start checks that ignore their cancellation.
_CLOSE_GRACE = 1.0

#: A rate-limit answer below this many seconds starts the task at once.
_RATE_SLACK = 0.002


def _enter(context: TaskContext, fn: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Inside a run's own context: make ``context`` the current task and call ``fn``."""
    set_current(context)
    return fn(*args, **kwargs)


class Runner:
    """Starts deliveries and commits their outcomes for one worker.

    Args:
        worker: the owning worker (its queue, id and pool sizes).
        broker: the worker's broker.
        flusher: where completions go.
    """

    def __init__(self, worker: Worker, broker: Broker, flusher: Flusher) -> None:
        queue = worker.queue
        self.worker = worker
        self.broker = broker
        self.flusher = flusher
        self.tasks = queue.tasks
        self.max_message_size = queue.max_message_size
        self.track_state = queue.track_state
        self.outcomes = Outcomes(
            worker.id, queue.store_results, queue.result_ttl, queue.max_message_size,
            queue.max_result_size,
        )  # fmt: skip
        self.jobs: set[Job] = set()
        self.revoked: dict[str, float] = {}
        self.processed = 0
        self.failed = 0
        self._threads: ThreadPool | None = None
        self._processes: ProcessPool | None = None
        #: Pool processes killed (hard timeout, cancel) and not yet reaped: the slot of the
        #: run that caused it is freed only once they are.
        self.killed_processes: list[Any] = []
        self._reaping: asyncio.Future[None] | None = None
        self._limits: dict[tuple[str, str], list[tuple[str, float, float]]] = {}
        self._queue_limits = bool(queue.queue_rate_limits)
        #: Starts awaiting their checks or before-execute hooks, with their delivery: not
        #: started yet, but leased (renewed like running tasks) and requeued at shutdown.
        self._pending: dict[asyncio.Task[None], Delivery] = {}
        self._given_back: set[asyncio.Task[None]] = set()  # of those, handed back at shutdown
        #: Thread runs past their hard timeout whose thread has not returned (slot freed).
        self.abandoned: set[Job] = set()
        #: Thread runs abandoned since the worker started.
        self.abandoned_total = 0
        self._marks: asyncio.Future[dict[str, float]] | None = None
        #: Middleware and signal handlers; ``hooks.enabled`` is checked once per run.
        self.hooks = hooks_of(queue)
        #: Progress writer of this worker (``current_task().update_progress``).
        self.progress = ProgressReporter(broker, queue.result_ttl, self.lease_of)
        #: The worker's base context (taken when the worker starts): every run gets a
        #: fresh copy of it, so context variables never leak from one task to the next.
        self.base_context = contextvars.copy_context()

    # ------------------------------------------------------------- starting
    def start(self, d: Delivery, slots: Slots) -> None:
        """Begin one delivery that holds one slot of ``slots``."""
        if len(d.payload) > self.max_message_size:
            ident, name = envelope_head(d.payload) or (None, "")
            self.reject(d, "message too large", f"{len(d.payload)} bytes", slots, ident, name)
            return
        try:
            env = decode_envelope(d.payload)
        except SerializationError as exc:
            # When its id can be read, it is dead-lettered under it with a final record, so
            # a waiter on its result learns its fate instead of waiting forever.
            ident, name = envelope_head(d.payload) or (None, "")
            error = str(exc).removeprefix("malformed message: ")
            self.reject(d, "malformed message", error, slots, ident, name)
            return
        task = self.tasks.get(env.task)
        if task is None:
            error = f"no task named {env.task!r} is registered in this worker"
            self.reject(d, "unknown task", error, slots, env.id, env.task)
            return
        if self.revoked and env.id in self.revoked:
            self._skip_cancelled(Job(d, env, task), slots)
            return
        self._admit(d, env, task, slots)

    def _admit(self, d: Delivery, env: Envelope, task: Task[Any, Any], slots: Slots) -> None:
        """Rate limits and start checks when the task has any, then run it."""
        buckets = self._buckets(task, d.queue) if not env.reserved else None
        if buckets or task.checks or env.max_age is not None:
            self.hold_start(
                asyncio.ensure_future(self._start_checked(d, env, task, slots, buckets)), d
            )
            return
        self.run(Job(d, env, task), slots)

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

    def _buckets(self, task: Task[Any, Any], physical: str) -> list[tuple[str, float, float]]:
        if task.rate_limit is None and not self._queue_limits:
            return _NO_BUCKETS  # the common case: no tuple key, no lookup per task
        cache_key = (task.name, physical)
        buckets = self._limits.get(cache_key)
        if buckets is None:
            buckets = []
            if task.rate_limit is not None:
                limit = task.rate_limit
                buckets.append((limit.key or task.name, limit.rate, limit.capacity))
            queue_limit = self.worker.queue.queue_rate_limits.get(base_queue(physical))
            if queue_limit is not None:
                buckets.append((queue_limit.key or "", queue_limit.rate, queue_limit.capacity))
            self._limits[cache_key] = buckets
        return buckets

    async def _start_checked(
        self,
        d: Delivery,
        env: Envelope,
        task: Task[Any, Any],
        slots: Slots,
        buckets: list[tuple[str, float, float]] | None,
    ) -> None:
        """Rate limits, then the task's start checks; run, or end this delivery as told.

        A check that cannot reach the broker puts the task back on the schedule for a second.
        """
        job = Job(d, env, task)
        try:
            completion: Completion | None = None
            if buckets:
                completion = await self._rate_check(job, buckets)
            checks = task.checks if env.max_age is None else checks_with_expiry(task)
            for check in checks:
                if completion is not None:
                    break
                try:
                    completion = await check(self, job)
                except BrokerError as exc:
                    logger.warning("start check of %s failed, retry in 1 s: %s", env.id, exc)
                    completion = self.reschedule(job, 1.0)
            if completion is None:
                self.run(job, slots)
                return
        except Exception:  # a bug must not leak the slot; the lease recovers the message
            logger.exception("could not start task %s", env.id)
            slots.release()
            return
        self.flusher.add(completion)
        slots.release()

    async def _rate_check(
        self, job: Job, buckets: list[tuple[str, float, float]]
    ) -> Completion | None:
        """Ask the token buckets: ``None`` to start now, else a reschedule for the wait."""
        try:
            reserved, wait = await self.broker.acquire_rate(buckets)
        except BrokerError as exc:
            logger.warning("rate limit check of %s failed, retry in 1 s: %s", job.envelope.id, exc)
            reserved, wait = False, 1.0
        if reserved and wait <= _RATE_SLACK:
            job.envelope = msgspec.structs.replace(job.envelope, reserved=True)
            return None
        return self.reschedule(job, wait, reserved=reserved)

    def reschedule(self, job: Job, delay: float, reserved: bool | None = None) -> Completion:
        """Completion putting ``job`` back on the schedule for ``delay`` seconds, unstarted.

        The attempt is unchanged and no slot is held while it waits (rate limits, locks).

        Args:
            job: the delivery to put back.
            delay: seconds.
            reserved: keep (``None``), set or clear the rate-limit reservation.
        """
        env, d = job.envelope, job.delivery
        now = time.time()
        again = msgspec.structs.replace(
            env, enqueued_at=now, reserved=env.reserved if reserved is None else reserved
        )
        data = encode_envelope(again, max(self.max_message_size, len(d.payload) * 2))
        return Completion(d.queue, d.token, env.id, reschedule=data, delay=delay)

    def run(self, job: Job, slots: Slots, hooked: bool = False) -> None:
        """Run ``job`` on its task's executor.

        ``hooked``: the queue's before-execute middleware already ran (see
        :mod:`blitzq.middleware`, which calls back here).
        """
        if not hooked and self.hooks.enabled:
            self.hooks.starting(self, job, slots)
            return
        env, task = job.envelope, job.task
        job.started_at = time.time()
        context = job.context
        if context is None:  # else made by the middleware hooks
            context = TaskContext(
                env.id, env.task, job.delivery.queue, job.attempt, task.max_attempts,
                env.correlation_id, env.headers,
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
        if executor == "async":
            try:
                coro = scope.run(_enter, context, task.fn, env.args, env.kwargs)
            except BaseException as exc:
                # A TypeError here is a call that does not fit the signature: no retry.
                self.finish(job, None, exc, retry=not isinstance(exc, TypeError))
                slots.release()
                return
            result, error, started = start_eagerly(coro, scope)
            if started is None:
                self.finish(job, result, error)
                slots.release()
                return
            handle: asyncio.Future[Any] = started
        elif not self._arguments_fit(job, slots):
            return
        else:
            scope.run(set_current, context)
            try:
                handle = self._submit(job, scope)
            except Exception as exc:  # the pool refused the call: a failed attempt
                self.finish(job, None, exc)
                slots.release()
                return
        job.handle = handle
        self.jobs.add(job)
        if env.timeout or task.timeout or task.controls.soft_timeout:
            start_timers(self, job, slots)  # hard and soft timeouts (worker/timeouts.py)
        handle.add_done_callback(functools.partial(self.on_done, job, slots))

    def _submit(self, job: Job, scope: contextvars.Context) -> asyncio.Future[Any]:
        """Hand a sync task's call to the thread pool (run in ``scope``) or the process pool."""
        env, task = job.envelope, job.task
        if task.executor == "thread":
            if self._threads is None:
                self._threads = ThreadPool(self.worker.thread_pool_size, "blitzq-task")
            call = functools.partial(task.fn, *env.args, **env.kwargs)
            if task.controls.soft_timeout:
                call = interruptible(job, call)
            return asyncio.get_running_loop().run_in_executor(self._threads, scope.run, call)
        if self._processes is None:
            self._processes = ProcessPool(self.worker.process_pool_size)
        return self._processes.submit(task.fn, env.args, env.kwargs)

    def _arguments_fit(self, job: Job, slots: Slots) -> bool:
        """Check a sync task's arguments against its signature before using a thread or
        process on it; a call that cannot bind fails at once, without retries."""
        env = job.envelope
        try:
            job.task.signature.bind(*env.args, **env.kwargs)
        except TypeError as exc:
            self.finish(job, None, exc, retry=False)
            slots.release()
            return False
        return True

    # ------------------------------------------------------------ finishing
    def finish(
        self, job: Job, result: Any, error: BaseException | None, retry: bool = True
    ) -> None:
        """Commit the outcome of a run that returned ``result`` or raised ``error``.

        ``retry=False`` fails it at once whatever the retry policy says (a bad call).
        """
        if error is None:
            try:
                completion = self.outcomes.success(job, result, self.track_state)
            except Exception as exc:  # the encoder failed in an unexpected way (a bug)
                error, retry = exc, False
            else:
                job.result = result
                self.processed += 1
        if error is not None:
            try:
                completion = self.outcomes.failure(
                    job, error, retry=retry, track_state=self.track_state
                )
            except Exception:  # a retry policy or encoder that raises: fail without retry
                logger.exception("could not build the retry of task %s", job.envelope.id)
                completion = self.outcomes.failure(job, error, False, self.track_state)
            self.failed += 1
            if logger.isEnabledFor(logging.INFO):
                logger.info(
                    "task %s %s attempt %d failed: %s: %s",
                    job.envelope.task, job.envelope.id, job.attempt, *describe_error(error),
                )  # fmt: skip
        self.commit(job, completion, error)

    def commit(
        self, job: Job, completion: Completion | None, error: BaseException | None = None
    ) -> None:
        """Hand a job's completion to the flusher, through the task's finishers if any.

        ``completion`` may be ``None`` (nothing to write: a fast-mode success without a
        record); finishers then get a bare one to add their operations to.
        """
        finishers = job.task.finishers
        if finishers:
            d = job.delivery
            bare = None
            if completion is None:
                completion = bare = Completion(d.queue, d.token, job.envelope.id)
            final = completion.reschedule is None and completion.requeue is None
            for finisher in finishers:
                completion = finisher(job, completion, final, error)
            if completion is bare and not bare.ops and bare.record is None and d.token is None:
                completion = None  # the finishers added nothing: still nothing to write
        if self.progress.active:  # the run's last progress update goes with its completion
            completion = self.progress.finish(job, completion)
        if self.hooks.enabled:
            self.hooks.committed(self, job, completion, error)
        if completion is not None:
            self.flusher.add(completion)

    def on_timeout(self, job: Job, soft: bool = False, slots: Slots | None = None) -> None:
        """The run passed its hard timeout (or its soft one, ``soft=True``).

        Hard: cancel an async task; for a thread task record the failure now and free its
        slot (the thread is *abandoned*, see :func:`~blitzq.worker.timeouts.abandon_thread`);
        terminate a process task (its slot is freed once the process is gone). Soft: see
        :func:`~blitzq.worker.timeouts.soft_timeout`. ``slots``: those the run holds.
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
        elif slots is not None:
            abandon_thread(self, job, slots)

    @staticmethod
    def _timeout_of(job: Job) -> float:
        return job.envelope.timeout or job.task.timeout or 0.0

    def on_done(self, job: Job, slots: Slots, handle: asyncio.Future[Any]) -> None:
        """The run really ended: free the slot and commit, unless already committed."""
        if self.abandoned and job in self.abandoned:
            thread_returned(self, job)  # its slot was freed at the timeout
            forget(job)
            if not handle.cancelled():
                handle.exception()
            return
        self.jobs.discard(job)
        if job.timer is not None:
            job.timer.cancel()
        if job.task.executor == "process" and (self.killed_processes or self._reaping):
            self._release_once_reaped(slots)
        else:
            slots.release()
        if job.finished:
            forget(job)
            if not handle.cancelled():
                handle.exception()  # retrieved, so asyncio does not log it as never retrieved
            return
        job.finished = True
        if job.timed_out and handle.cancelled():
            self.failed += 1
            expired = _timeout_error(job)
            self.commit(job, self.outcomes.failure(job, expired), expired)
        elif job.context is not None and job.context.cancelled:
            if not handle.cancelled():
                handle.exception()  # retrieved: a killed process pool's error is expected here
            self.commit(job, self.outcomes.cancelled(job.delivery, job.envelope, job.attempt))
        elif handle.cancelled():
            # Not cancelled by the worker (that marks the job first): the task cancelled
            # itself, which counts as a failure rather than a silent requeue loop.
            self.finish(job, None, asyncio.CancelledError("the task was cancelled"))
        else:
            error = handle.exception()
            if error is None:
                self.finish(job, handle.result(), None)
            else:
                self.finish(job, None, unwrap(error))
        forget(job)

    def _release_once_reaped(self, slots: Slots) -> None:
        """Free a process run's slot once the pool processes killed (for it or a sibling
        in the same pool) have exited: joined in a thread, since a SIGKILLed process may
        still be exiting when its pool reports it broken."""
        if self.killed_processes:
            killed, self.killed_processes = self.killed_processes, []

            def reap() -> None:
                for process in killed:
                    process.join(10.0)

            self._reaping = asyncio.ensure_future(asyncio.to_thread(reap))
        reaping = self._reaping
        if reaping is None or reaping.done():
            self._reaping = None
            slots.release()
        else:
            reaping.add_done_callback(lambda _: slots.release())

    def reject(
        self,
        d: Delivery,
        reason: str,
        error: str,
        slots: Slots,
        task_id: str | None = None,
        task: str = "",
    ) -> None:
        """Dead-letter a message that cannot run (malformed, unknown task, too large)."""
        logger.warning("dead-lettering message from %s: %s (%s)", d.queue, reason, error)
        self.flusher.add(self.outcomes.rejected(d, reason, error, task_id, task))
        self.failed += 1
        slots.release()

    # --------------------------------------------------------- cancellation
    def _skip_cancelled(self, job: Job, slots: Slots) -> None:
        """The id has a cancel mark here: confirm it in the broker, then skip the task.

        A task enqueued again under the same explicit id clears the mark in the broker
        (``reset_tasks``) before it is published, while this worker's copy of the marks may
        be older: the broker's answer decides. Marks read by one fetch batch share one read.
        """
        if self._marks is None:
            self._marks = asyncio.ensure_future(self.broker.revoked())
            asyncio.get_running_loop().call_soon(self._forget_marks)
        self.hold_start(
            asyncio.ensure_future(self._skip_if_marked(job, slots, self._marks)), job.delivery
        )

    def _forget_marks(self) -> None:
        self._marks = None

    async def _skip_if_marked(
        self, job: Job, slots: Slots, marks: asyncio.Future[dict[str, float]]
    ) -> None:
        env = job.envelope
        try:
            marked = env.id in await asyncio.shield(marks)
        except Exception as exc:  # the broker unreachable: trust this worker's copy
            logger.warning("could not confirm the cancel mark of %s: %s", env.id, exc)
            marked = True
        if not marked:
            self.revoked.pop(env.id, None)
            try:
                self._admit(job.delivery, env, job.task, slots)
            except Exception:  # as in the fetch loop: the lease recovers the message
                logger.exception("could not start task %s", env.id)
                slots.release()
            return
        self.commit(job, self.outcomes.cancelled(job.delivery, env, job.attempt))
        slots.release()

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
        """Wait for rate-limit checks in flight; stop the thread and process pools."""
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
