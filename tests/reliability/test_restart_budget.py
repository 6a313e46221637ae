"""The supervisor's restart budget counts only the deaths of workers that made no progress.

A worker that got a task done (the completion of one of its runs was applied) writes its
progress mark to the supervisor (``BLITZQ_PROGRESS``); its death is restarted uncounted, so
tasks that kill their worker now and then (poison tasks) never make the supervisor give up,
while a worker that dies before it gets anything done (a crash loop) still spends the budget.

The supervisors are real subprocesses; this module is also the application their workers
import. Waits are on events (lines in the log, processes, results), with deadlines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from blitzq import Queue, TaskFailed
from blitzq.supervisor import RestartBudget
from blitzq.worker.heartbeat import PROGRESS_ENV, progress_mark
from tests.polling import wait_until
from tests.reliability.test_supervisor import (
    ROOT,
    Supervised,
    alive,
    client,
    supervise,
    wait_ready,
)

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
    pytest.mark.timeout(240),
]

__all__ = ["client", "supervise"]  # the fixtures, used by name

APP = "tests.reliability.test_restart_budget:queue"
QUEUE_NAME = "budget"
#: Logged by the supervisor once a worker wrote its progress mark.
PROGRESSED = "made progress (a task completed"
#: Logged by the supervisor for a restart that the budget does not count.
UNCOUNTED = "not counted against the restart budget"

# ------------------------------------------------------------- the application
#: The Queue the supervised workers import; the command line sets URL and namespace.
queue = Queue(QUEUE_NAME, visibility_timeout=1.5)


@queue.task
async def good(i: int) -> int:
    """Return ``i``."""
    return i


@queue.task
async def poison(log: str) -> str:
    """Kill this worker process (``os._exit``) when the supervisor, whose log is at ``log``,
    has seen its progress mark; return ``"spared"`` on a worker that has not made progress
    yet (so every death this task causes is one the budget must not count)."""
    text = Path(log).read_text(errors="replace")  # noqa: ASYNC240 - a small log file
    if f"(pid {os.getpid()}) {PROGRESSED}" in text:
        os._exit(1)
    return "spared"


def __getattr__(name: str) -> object:
    """``crash_at_start``: the worker process dies (exit code 3) while it loads its
    application, before it runs any task."""
    if name == "crash_at_start":
        os._exit(3)
    raise AttributeError(name)


def _poison_end(handle: Any) -> str | None:
    """How a poison task ended: ``"spared"``, or the error type it failed with."""
    try:
        return str(handle.result_sync(timeout=90))
    except TaskFailed as exc:
        return exc.error_type


GOOD = f"{__name__}.good"
POISON = f"{__name__}.poison"


# --------------------------------------------------------------------- units
def test_a_restart_after_progress_is_not_counted_and_starts_the_count_over() -> None:
    now = [0.0]
    budget = RestartBudget(
        limit=2, window=60.0, base_delay=0.5, max_delay=4.0, clock=lambda: now[0]
    )
    assert [budget.next_delay(), budget.next_delay()] == [0.5, 1.0]
    assert budget.progressed() == 0.5  # the shortest delay, and the count is forgotten
    assert [budget.next_delay(), budget.next_delay()] == [0.5, 1.0]
    assert budget.next_delay() is None


def test_progress_mark_writes_one_byte_once_and_leaves_the_environment() -> None:
    read_end, write_end = os.pipe()
    try:
        env = {PROGRESS_ENV: str(write_end)}
        mark = progress_mark(env)
        assert mark is not None
        assert PROGRESS_ENV not in env
        mark()
        mark()  # once only; the descriptor is closed after the first
        assert os.read(read_end, 16) == b"!"
        assert os.read(read_end, 16) == b""  # end-of-file: the mark closed its end
    finally:
        os.close(read_end)
    for bad in ({}, {PROGRESS_ENV: ""}, {PROGRESS_ENV: "x"}, {PROGRESS_ENV: "-1"}):
        assert progress_mark(dict(bad)) is None, bad


def _run_supervisor(tmp_path: Path, worker: str) -> tuple[subprocess.Popen[bytes], Path]:
    """A Supervisor of one slot (``max_restarts=2``) whose worker runs Python ``worker``."""
    script = (
        "import logging, sys\n"
        "from blitzq.supervisor import Supervisor\n"
        "logging.basicConfig(level=logging.INFO)\n"
        f"cmd = [sys.executable, '-c', {worker!r}]\n"
        "sys.exit(Supervisor(cmd, 1, max_restarts=2, backoff=0.01, max_backoff=0.02,\n"
        "                    heartbeat_timeout=None).run())\n"
    )
    log = tmp_path / "sup.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stderr=out, env=env)
    return proc, log


def test_deaths_after_the_progress_mark_never_spend_the_budget(tmp_path: Path) -> None:
    """A worker that writes its mark and then dies, again and again: restarted far past
    ``max_restarts`` (2), never given up on."""
    worker = "import os; os.write(int(os.environ['BLITZQ_PROGRESS']), b'!'); os._exit(3)"
    proc, log = _run_supervisor(tmp_path, worker)
    try:
        wait_until(
            lambda: log.read_text().count(UNCOUNTED) >= 8 or proc.poll() is not None,
            60,
            "8 uncounted restarts",
        )
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "giving up" not in log.read_text()


def test_deaths_without_the_progress_mark_spend_the_budget(tmp_path: Path) -> None:
    """The same worker without its mark: one start and 2 restarts, then the slot gives up."""
    proc, log = _run_supervisor(tmp_path, "import os; os._exit(3)")
    try:
        assert proc.wait(60) == 1, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = log.read_text()
    assert out.count("exited with code 3") == 3, out
    assert "giving up on it" in out
    assert UNCOUNTED not in out


# ---------------------------------------------------------- real workers
def test_poison_tasks_killing_workers_that_made_progress_never_stop_the_supervisor(
    supervise: Callable[..., Supervised],
    make_queue: Callable[..., Queue],
    client: redis.Redis,
    namespace: str,
) -> None:
    """``--workers 1 --max-restarts 2``: 4 rounds of good tasks, then a poison task once the
    supervisor saw the worker's progress mark. Every round's worker dies of a poison task
    (this round's, or one redelivered from an earlier round), 4 deaths past a budget of 2:
    the supervisor restarts each uncounted and goes on; every good task succeeds, and every
    poison task ends (spared by a worker without progress, or dead-lettered)."""
    producer = make_queue(name=QUEUE_NAME)
    sup = supervise("--max-restarts", "2", workers=1, app=APP)
    poisons = []
    try:
        for round_ in range(4):
            (pid,) = wait_ready(sup, client, namespace, n=1)
            goods = [producer.send_sync(GOOD, (i,)) for i in range(3)]
            assert [h.result_sync(timeout=60) for h in goods] == [0, 1, 2], sup.output()
            wait_until(
                lambda pid=pid: f"(pid {pid}) {PROGRESSED}" in sup.output() or not alive(pid),
                60,
                f"round {round_}: worker {pid}'s progress mark\n{sup.output()}",
            )
            poisons.append(producer.send_sync(POISON, (str(sup.log),)))
            wait_until(lambda pid=pid: not alive(pid), 60, f"worker {pid} killed\n{sup.output()}")
        for handle in poisons:
            assert _poison_end(handle) in ("spared", "MaxDeliveriesExceeded"), sup.output()
        out = sup.log.read_text(errors="replace")
        assert out.count(UNCOUNTED) >= 4, out[-4000:]
        assert "giving up" not in out, out[-4000:]
        assert sup.proc.poll() is None
        sup.proc.send_signal(signal.SIGTERM)
        assert sup.proc.wait(30) == 0, sup.output()
    finally:
        producer.close_sync()


def test_workers_dying_before_any_task_still_exhaust_the_budget(
    supervise: Callable[..., Supervised],
) -> None:
    """A worker that dies while it loads its application (exit code 3, no task run): one
    start and 2 restarts (``--max-restarts 2``), then the supervisor gives up and exits 1."""
    sup = supervise("--max-restarts", "2", workers=1, app=f"{__name__}:crash_at_start")
    assert sup.proc.wait(90) == 1, sup.output()
    out = sup.output()
    assert out.count("exited with code 3") == 3, out
    assert "giving up on it" in out, out
    assert UNCOUNTED not in out, out
