"""The CPU pool (``executor="cpu"``, ``blitzq worker --pool cpu``; :mod:`blitzq.worker.cpu`)
with real workers on the test Redis.

Each worker is a ``python -m blitzq worker`` subprocess of :mod:`tests.reliability.cpu_app`;
the tasks write the pid of the child running them to files the tests read. Waits are on
events (files, records, processes seen in ``/proc``), with deadlines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blitzq import Queue, TaskFailed
from tests.polling import wait_until
from tests.reliability.test_supervisor import ROOT, Supervised, alive, children

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
    pytest.mark.timeout(120),
]

APP = "tests.reliability.cpu_app:queue"
TASK = "tests.reliability.cpu_app."


@pytest.fixture
def start(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Callable[..., Supervised]]:
    """Start ``blitzq worker APP …``; SIGKILL whatever is left at the end (the CPU pool's
    children lead process groups of their own: their pids are read from the task files)."""
    started: list[Supervised] = []

    def run(*extra: str, env_extra: dict[str, str] | None = None) -> Supervised:
        log = tmp_path / f"worker-{len(started)}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
        env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", **(env_extra or {}))
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]
        )
        cmd = [sys.executable, "-m", "blitzq", "worker", APP, "--redis-url", redis_url]
        cmd += ["--namespace", namespace, "--shutdown-timeout", "5", *extra]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        sup = Supervised(proc, log)
        started.append(sup)
        return sup

    yield run
    for sup in started:
        pids = set(sup.seen)
        if sup.proc.poll() is None:
            pids.update(children(sup.proc.pid))
            sup.proc.kill()
        sup.proc.wait(10)
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def producer(make_queue: Callable[..., Queue]) -> Iterator[Queue]:
    """A Queue on the test namespace that sends the app's tasks by name."""
    q = make_queue(name="cpu")
    yield q
    q.close_sync()


def pid_in(path: Path, sup: Supervised, timeout: float = 40.0) -> int:
    """Wait until the task wrote its child's pid to ``path``; return it."""

    def read() -> int | None:
        if sup.proc.poll() is not None:
            raise AssertionError(f"worker exited early:\n{sup.output()}")
        return int(path.read_text()) if path.exists() else None

    pid: int = wait_until(read, timeout, f"a pid in {path}\n{sup.output()}")
    sup.seen.add(pid)
    return pid


def gone(pid: int, sup: Supervised) -> None:
    """Wait until process ``pid`` is gone (reaped, or a zombie nobody waits for)."""
    wait_until(lambda: not alive(pid), 30, f"process {pid} gone\n{sup.output()}")


def test_a_cpu_task_computes_in_a_child_and_returns_its_result(
    start: Callable[..., Supervised], producer: Queue
) -> None:
    sup = start("--no-supervise")
    total, pid = producer.send_sync(TASK + "crunch", (1000,)).result_sync(timeout=60)
    assert total == sum(i * i for i in range(1000))
    assert pid != sup.proc.pid  # not the worker: a child of the forkserver
    assert pid not in children(sup.proc.pid)
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(60) == 0
    # With --pool cpu a sync task left on its default executor runs there too.
    sup2 = start("--no-supervise", "--pool", "cpu", "--cpu-processes", "1")
    plain = producer.send_sync(TASK + "plain_pid").result_sync(timeout=60)
    assert plain != sup2.proc.pid
    assert plain not in children(sup2.proc.pid)


def test_a_hard_timeout_kills_only_its_child_and_the_sibling_completes(
    start: Callable[..., Supervised], producer: Queue, tmp_path: Path
) -> None:
    sup = start("--no-supervise", "--cpu-processes", "2")
    sibling_pid, gate, victim_pid = tmp_path / "sibling", tmp_path / "gate", tmp_path / "victim"
    sibling = producer.send_sync(TASK + "gated", (str(sibling_pid), str(gate)))
    sibling_child = pid_in(sibling_pid, sup)
    victim = producer.send_sync(TASK + "stuck", (str(victim_pid),))
    victim_child = pid_in(victim_pid, sup)
    assert victim_child != sibling_child
    with pytest.raises(TaskFailed) as failed:
        victim.result_sync(timeout=60)
    assert "TaskTimeout" in (failed.value.error_type or "")
    gone(victim_child, sup)
    assert alive(sibling_child)  # its child was not touched
    gate.touch()
    assert sibling.result_sync(timeout=60) == sibling_child
    record = sibling.status_sync()
    assert record is not None
    assert record.attempts == 1  # finished where it ran: not requeued
    assert "requeue" not in sup.output().lower()


def test_a_cancel_kills_the_child_running_the_task(
    start: Callable[..., Supervised], producer: Queue, tmp_path: Path
) -> None:
    sup = start("--no-supervise", "--cpu-processes", "2")
    pid_file = tmp_path / "held"
    handle = producer.send_sync(TASK + "held", (str(pid_file),))
    child = pid_in(pid_file, sup)
    handle.cancel_sync()
    gone(child, sup)

    def cancelled() -> bool:
        record = handle.status_sync()
        return record is not None and record.state == "cancelled"

    wait_until(cancelled, 30, f"a cancelled record\n{sup.output()}")
    # The pool goes on: a new call gets a fresh child.
    assert producer.send_sync(TASK + "child_pid").result_sync(timeout=60) != child


def test_children_are_recycled_after_max_tasks(
    start: Callable[..., Supervised], producer: Queue
) -> None:
    start("--no-supervise", "--cpu-processes", "1", "--cpu-max-tasks", "2")
    pids = [producer.send_sync(TASK + "child_pid").result_sync(timeout=60) for _ in range(4)]
    assert pids[0] == pids[1]
    assert pids[2] == pids[3]
    assert pids[1] != pids[2]


def test_a_child_past_the_memory_limit_is_recycled(
    start: Callable[..., Supervised], producer: Queue
) -> None:
    sup = start("--no-supervise", "--cpu-processes", "1", "--cpu-max-memory", "150MiB")
    first = producer.send_sync(TASK + "child_pid").result_sync(timeout=60)
    assert producer.send_sync(TASK + "child_pid").result_sync(timeout=60) == first  # kept
    assert producer.send_sync(TASK + "hog", (200,)).result_sync(timeout=60) == first
    after = producer.send_sync(TASK + "child_pid").result_sync(timeout=60)
    assert after != first
    gone(first, sup)
    assert "recycled" in sup.output()


def test_a_bad_memory_limit_is_a_usage_error(start: Callable[..., Supervised]) -> None:
    sup = start("--no-supervise", "--cpu-max-memory", "lots")
    assert sup.proc.wait(60) == 2
    assert "--cpu-max-memory" in sup.output()


def test_a_forkserver_the_os_refuses_exits_71_and_the_supervisor_starts_a_fresh_worker(
    start: Callable[..., Supervised], producer: Queue
) -> None:
    refuse = {"BLITZQ_TEST_REFUSE_FORK": "1"}
    alone = start("--no-supervise", env_extra=refuse)
    handle = producer.send_sync(TASK + "child_pid")
    assert alone.proc.wait(60) == 71
    assert "forkserver" in alone.output()
    record = handle.status_sync()
    assert record is None or record.state not in ("failed", "dead")  # back on its queue
    sup = start("--workers", "1", "--max-restarts", "20", env_extra=refuse)
    first = wait_until(lambda: sup.workers() or None, 40, sup.output())[0]

    def replaced() -> bool:
        return bool(set(sup.workers()) - {first}) and "code 71" in sup.output()

    wait_until(replaced, 60, f"a fresh worker after exit 71\n{sup.output()}")
    assert "starting a fresh worker" in sup.output()


def test_a_call_timed_out_while_waiting_for_a_child_never_runs(
    start: Callable[..., Supervised], producer: Queue, tmp_path: Path
) -> None:
    """With every child busy a call waits; its hard timeout fires there: it fails with
    TaskTimeout and never starts once a child is free."""
    sup = start("--no-supervise", "--cpu-processes", "1")
    busy_pid, gate, late_pid = tmp_path / "busy", tmp_path / "gate", tmp_path / "late"
    busy = producer.send_sync(TASK + "gated", (str(busy_pid), str(gate)))
    child = pid_in(busy_pid, sup)
    late = producer.send_sync(TASK + "stuck", (str(late_pid),))
    with pytest.raises(TaskFailed) as failed:
        late.result_sync(timeout=60)
    assert "TaskTimeout" in (failed.value.error_type or "")
    gate.touch()
    assert busy.result_sync(timeout=60) == child
    # The pool still answers, and the timed-out call never ran.
    assert producer.send_sync(TASK + "child_pid").result_sync(timeout=60) == child
    assert not late_pid.exists()


def test_the_children_die_with_a_sigkilled_worker(
    start: Callable[..., Supervised], producer: Queue, tmp_path: Path
) -> None:
    """A child leads its own process group, so a kill of the worker's group misses it: it
    dies with the forkserver (``PR_SET_PDEATHSIG``), which exits with the worker."""
    sup = start("--no-supervise")
    pid_file = tmp_path / "held"
    producer.send_sync(TASK + "held", (str(pid_file),))
    child = pid_in(pid_file, sup)
    assert os.getpgid(child) == child
    sup.proc.kill()
    sup.proc.wait(30)
    gone(child, sup)
