"""Hung thread tasks and the concurrency bound (issue 7, section 7; issue 28, item 12).

A sync task past its hard timeout has its failure recorded (and its message acknowledged) at
once; its thread is *abandoned* (Python cannot kill it) but keeps its slot until its call
returns, so no more task bodies than ``concurrency`` ever run at once (DESIGN invariant 5).
Abandoned threads are counted (``Worker.abandoned_threads``); once they hold every slot of
the worker (or of a queue), or are more than ``max_abandoned_threads``, the worker stops
gracefully without waiting for them and asks to be restarted (``blitzq worker`` exits with
``EXIT_RESTART``; the supervisor's side is in tests/reliability/test_supervisor.py). A
process task past its hard timeout keeps its slot until its killed pool process is reaped.

Every blocking body waits on an event the test sets, never on a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blitzq import Queue, TaskFailed, TaskState, Worker
from blitzq.worker.worker import EXIT_RESTART
from tests.procfs import proc_state

from . import proc_tasks
from .proc_tasks import eventually, make_worker, running

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test, so hung task threads return."""
    event = threading.Event()
    yield event
    event.set()


class Bodies:
    """Task bodies running at once in this process, and the most seen at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0

    @contextlib.contextmanager
    def body(self) -> Iterator[None]:
        """Count the body running inside the ``with`` block."""
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            yield
        finally:
            with self.lock:
                self.now -= 1


def slots_in_use(worker: Worker) -> int:
    """Slots of the worker's global limiter taken right now."""
    return int(worker._global.in_use)


async def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait until ``condition()`` holds (polled every 20 ms), at most ``timeout`` seconds."""
    await eventually(lambda: asyncio.sleep(0, condition()), bool, timeout)


@pytest.mark.both_servers
async def test_hung_thread_tasks_keep_their_slots_so_concurrency_bounds_the_bodies(
    make_queue: Callable[..., Queue], mode: str, release: threading.Event
) -> None:
    """Issue input: with ``-c 4``, sync tasks that block past their hard timeout had their
    slots freed and 12 task bodies ran at once. Now: three hung threads keep three of the
    four slots, the other tasks go through the fourth one by one, never more than 4 bodies
    at once; the hung tasks' failures are recorded at their timeout, and once their threads
    return all four slots run work again."""
    queue = make_queue(mode=mode)
    bodies = Bodies()
    go, go_again = threading.Event(), threading.Event()

    @queue.task(name="a.hung", timeout=0.3, retries=0)
    def hung() -> str:
        with bodies.body():
            release.wait(60)
        return "late"

    @queue.task(name="a.blocker")
    def blocker(i: int) -> int:
        with bodies.body():
            go.wait(60)
        return i

    @queue.task(name="a.again")
    def again(i: int) -> int:
        with bodies.body():
            go_again.wait(60)
        return i

    hung_handles = await hung.enqueue_many([() for _ in range(3)])
    blocker_handles = await blocker.enqueue_many([(i,) for i in range(4)])
    worker = make_worker(queue, concurrency=4)
    async with running(worker):
        # The failures are written at the timeout, while the threads still block.
        for h in hung_handles:
            with pytest.raises(TaskFailed) as info:
                await h.result(timeout=30)
            assert info.value.error_type is not None
            assert info.value.error_type.endswith("TaskTimeout")
        assert not release.is_set()
        assert worker.abandoned_threads == 3
        # Every slot is taken: 3 by the hung threads, 1 by a blocker. With the slots of
        # the hung threads freed, the three other blockers would run too (7 bodies).
        await until(lambda: slots_in_use(worker) == 4 and bodies.now >= 4)
        assert bodies.now == 4, "more bodies ran at once than the worker's concurrency"
        assert bodies.peak == 4
        assert len(worker.runner.jobs) == 1
        go.set()
        assert [await h.result(timeout=30) for h in blocker_handles] == [0, 1, 2, 3]
        assert bodies.peak == 4, "more bodies ran at once than the worker's concurrency"
        assert worker.abandoned_threads == 3
        assert not worker.restart_requested
        # The hung calls return: their slots are free again, and four runs fit at once.
        release.set()
        await until(lambda: worker.abandoned_threads == 0 and slots_in_use(worker) == 0)
        again_handles = await again.enqueue_many([(i,) for i in range(4)])
        await until(lambda: bodies.now == 4)
        go_again.set()
        assert [await h.result(timeout=30) for h in again_handles] == [0, 1, 2, 3]
        assert bodies.peak == 4
        assert worker.abandoned_threads_total == 3
        assert not worker.restart_requested
    for h in hung_handles:
        record = await h.status()
        assert record is not None
        assert record.state is TaskState.DEAD_LETTERED


@pytest.mark.both_servers
async def test_hung_threads_holding_every_slot_make_the_worker_restart(
    make_queue: Callable[..., Queue], mode: str, release: threading.Event
) -> None:
    """Two hung threads hold both slots of a ``-c 2`` worker (far below
    ``max_abandoned_threads``): it stops on its own, without waiting for them (its
    shutdown_timeout is longer than the test), and asks to be restarted; the tasks behind
    them run in the worker that replaces it while the hung threads still block."""
    queue = make_queue(mode=mode)
    bodies = Bodies()

    @queue.task(name="a.hung", timeout=0.3, retries=0)
    def hung() -> None:
        with bodies.body():
            release.wait(120)

    @queue.task(name="a.quick")
    def quick(i: int) -> int:
        with bodies.body():
            return i

    hung_handles = await hung.enqueue_many([(), ()])
    quick_handles = await quick.enqueue_many([(i,) for i in range(3)])
    worker = make_worker(queue, concurrency=2, shutdown_timeout=100.0)
    await asyncio.wait_for(worker.run(), 60.0)
    assert not release.is_set()
    assert worker.restart_requested
    assert worker.restart_reason is not None
    assert "all 2 slots" in worker.restart_reason
    assert worker.abandoned_threads == 2
    assert bodies.peak == 2
    for h in hung_handles:
        with pytest.raises(TaskFailed) as info:
            await h.result(timeout=10)
        assert info.value.error_type is not None
        assert info.value.error_type.endswith("TaskTimeout")
    # The replacement (in a process of its own under the supervisor) runs the rest.
    async with running(make_worker(queue, concurrency=2)):
        assert [await h.result(timeout=30) for h in quick_handles] == [0, 1, 2]


async def test_hung_threads_holding_every_slot_of_a_queue_make_the_worker_restart(
    make_queue: Callable[..., Queue], release: threading.Event
) -> None:
    """A queue bounded by ``queue_concurrency`` whose slots are all held by hung threads
    could never run again in this worker, though other queues still can: restart too."""
    queue = make_queue()

    @queue.task(name="a.slow_hung", queue="slow", timeout=0.3, retries=0)
    def slow_hung() -> None:
        release.wait(120)

    await slow_hung.enqueue()
    worker = make_worker(
        queue, queues=["slow", queue.name], concurrency=4, queue_concurrency={"slow": 1}
    )
    await asyncio.wait_for(worker.run(), 60.0)
    assert worker.restart_reason is not None
    assert "all 1 slots of queue 'slow'" in worker.restart_reason
    assert worker.abandoned_threads == 1


async def test_past_max_abandoned_threads_the_worker_stops_to_be_restarted(
    make_queue: Callable[..., Queue], release: threading.Event
) -> None:
    """One abandoned thread over ``max_abandoned_threads`` stops the worker gracefully (it
    ends on its own, no stop() call) and marks it for a restart, with slots still free."""
    queue = make_queue()

    @queue.task(name="a.hung", timeout=0.2, retries=0)
    def hung() -> None:
        release.wait(120)

    await hung.enqueue_many([(), ()])
    worker = make_worker(queue, concurrency=3, max_abandoned_threads=1)
    await asyncio.wait_for(worker.run(), 60.0)
    assert worker.restart_requested
    assert worker.restart_reason is not None
    assert "max_abandoned_threads" in worker.restart_reason
    assert worker.abandoned_threads == 2


async def test_a_call_the_thread_pool_had_not_started_never_runs_after_its_timeout(
    make_queue: Callable[..., Queue], release: threading.Event
) -> None:
    """``thread_pool_size`` 1 under ``concurrency`` 2: the second call waits for a thread.
    When its hard timeout passes before it got one, it is cancelled in the pool and its
    slot freed: it never starts later, after its failure (and retry) were written."""
    queue = make_queue()
    started: list[str] = []

    @queue.task(name="a.holder")
    def holder() -> None:
        started.append("holder")
        release.wait(60)

    @queue.task(name="a.waiting", timeout=0.3, retries=0)
    def waiting() -> None:
        started.append("waiting")

    held = await holder.enqueue()
    worker = make_worker(queue, concurrency=2, thread_pool_size=1)
    async with running(worker):
        await until(lambda: started == ["holder"])
        late = await waiting.enqueue()
        with pytest.raises(TaskFailed) as info:
            await late.result(timeout=30)
        assert info.value.error_type is not None
        assert info.value.error_type.endswith("TaskTimeout")
        await until(lambda: slots_in_use(worker) == 1)
        assert worker.abandoned_threads == 0
        release.set()
        assert await held.result(timeout=30) is None
        await until(lambda: slots_in_use(worker) == 0)
    assert started == ["holder"]


async def test_a_timed_out_process_task_keeps_its_slot_until_its_child_is_reaped(
    make_queue: Callable[..., Queue], tmp_path: Path
) -> None:
    """``executor="process"`` past its hard timeout: the failure is written at the timeout,
    the pool process is killed, and the slot (the only one) is taken again only once that
    process is reaped: the next task starts when its pid is gone from /proc, not even a
    zombie."""
    queue = make_queue()
    warm = queue.task(name="a.warm", executor="process")(proc_tasks.square)
    hung = queue.task(name="a.proc_hung", executor="process", timeout=3.0, retries=0)(
        proc_tasks.sleep_with_pid_file
    )
    pid_file = tmp_path / "pid"

    @queue.task(name="a.after")
    def after() -> str | None:
        return proc_state(int(pid_file.read_text()))

    # concurrency 1: one after the other; the warm call starts the pool process, so the
    # timed call does not spend its 3 s on a process start.
    warmed = await warm.enqueue(3)
    first = await hung.enqueue(str(pid_file), 60.0)
    second = await after.enqueue()
    async with running(make_worker(queue, concurrency=1, process_pool_size=1)):
        assert await warmed.result(timeout=60) == 9
        with pytest.raises(TaskFailed) as info:
            await first.result(timeout=60)
        assert info.value.error_type == "blitzq.exceptions.TaskTimeout"
        assert await asyncio.to_thread(pid_file.exists), "the call never started in the pool"
        assert await second.result(timeout=30) is None  # reaped before the slot was free


def test_blitzq_worker_exits_with_exit_restart_past_the_bound(
    server_url: str, namespace: str, tmp_path: Path, release: threading.Event
) -> None:
    """``blitzq worker --max-abandoned-threads 0``: the first hung thread task makes the
    process exit with EXIT_RESTART (the supervisor restarts it) within a few seconds, though
    the thread still blocks."""
    queue = Queue("hang", redis_url=server_url, namespace=namespace)
    try:
        queue.send_sync("tests.integration.hang_app.hang", [60.0])
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
        cmd = [sys.executable, "-m", "blitzq", "worker", "tests.integration.hang_app:queue"]
        cmd += ["--redis-url", server_url, "--namespace", namespace, "-c", "2"]
        cmd += ["--max-abandoned-threads", "0", "--shutdown-timeout", "1"]
        cmd += ["--no-supervise"]  # supervised, exit 75 is a planned restart, not an exit
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            code = proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        output = log.read_text(errors="replace")
        assert code == EXIT_RESTART, output[-3000:]
        assert "abandoned" in output
    finally:
        queue.close_sync()
