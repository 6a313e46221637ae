"""Supervision by default (``blitzq worker APP``, also with one process): heartbeats,
a broker not there yet at start, the crash budget's options and exit code 78.

Every supervisor is a real ``python -m blitzq worker …`` subprocess; this module is also the
application its workers import. Waits are on events (processes seen in ``/proc``, results,
lines in the log), with deadlines; nothing asserts how long something took.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from blitzq import Queue
from blitzq.worker.heartbeat import heartbeat_channel
from tests.polling import wait_until
from tests.reliability.conftest import PrivateRedis
from tests.reliability.test_supervisor import ROOT, Supervised, alive, children

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
    pytest.mark.timeout(180),
]

APP = "tests.reliability.test_supervision:queue"
QUEUE_NAME = "supv"

# ------------------------------------------------------------- the application
#: The Queue the supervised workers import; the command line sets URL and namespace.
queue = Queue(QUEUE_NAME, visibility_timeout=1.5)


@queue.task
async def whoami() -> list[str]:
    """``[pid, slot]`` of the worker running it (``BLITZQ_WORKER_SLOT``)."""
    return [str(os.getpid()), os.environ.get("BLITZQ_WORKER_SLOT", "")]


@queue.task(retries=0)
async def block_loop_once(marker: str, seconds: float) -> str:
    """Block the worker's event loop (a synchronous sleep in async code) the first time it
    runs (``marker`` does not exist yet); return at once after that."""
    path = Path(marker)
    if path.exists():  # noqa: ASYNC240 - blocking on purpose, below too
        return "again"
    path.write_text(str(os.getpid()))  # noqa: ASYNC240
    time.sleep(seconds)  # the bug this test is about: a blocking call in async code
    return "blocked"


# ------------------------------------------------------------------ fixtures
@pytest.fixture
def start(namespace: str, tmp_path: Path) -> Iterator[Callable[..., Supervised]]:
    """Start ``blitzq worker APP …`` (supervised by default); SIGKILL what is left."""
    started: list[Supervised] = []

    def run(*extra: str, app: str = APP, cwd: Path = ROOT) -> Supervised:
        log = tmp_path / f"supervisor-{len(started)}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
        cmd = [sys.executable, "-m", "blitzq", "worker", app, "--namespace", namespace]
        cmd += ["-c", "4", "--shutdown-timeout", "2", *extra]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
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
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)


def ask(producer: Queue, timeout: float = 60.0) -> tuple[int, str]:
    """Run ``whoami`` on the workers; ``(pid, slot)`` of the one that ran it."""
    pid, slot = producer.send_sync(f"{__name__}.whoami").result_sync(timeout=timeout)
    return int(pid), slot


def one_worker(sup: Supervised) -> int:
    """Wait until the supervisor runs exactly one worker; its pid."""

    def found() -> int | None:
        if sup.proc.poll() is not None:
            raise AssertionError(f"supervisor exited early:\n{sup.output()}")
        pids = sup.workers()
        return pids[0] if len(pids) == 1 else None

    return int(wait_until(found, 60, f"one worker\n{sup.output()}"))


def replaced(sup: Supervised, old: int) -> int:
    """Wait until ``old`` is gone and one other worker runs; its pid."""

    def found() -> int | None:
        pids = sup.workers()
        return pids[0] if len(pids) == 1 and pids[0] != old and not alive(old) else None

    return int(wait_until(found, 90, f"worker {old} replaced\n{sup.output()}"))


# --------------------------------------------------------------------- tests
def test_heartbeat_channel_is_read_from_the_environment() -> None:
    assert heartbeat_channel({"BLITZQ_HEARTBEAT": "7,0.5"}) == (7, 0.5)
    for bad in ("", "7", "x,1", "7,0", "-1,1", "7,nope"):
        assert heartbeat_channel({"BLITZQ_HEARTBEAT": bad}) is None, bad
    assert heartbeat_channel({}) is None


def test_stopped_worker_is_replaced_in_its_slot(
    start: Callable[..., Supervised], redis_url: str, make_queue: Callable[..., Queue]
) -> None:
    """SIGSTOP: the process lives but beats no more; the supervisor kills its process group
    and starts a new worker in the same slot."""
    producer = make_queue(name=QUEUE_NAME)
    sup = start("--redis-url", redis_url, "--heartbeat-timeout", "5")
    first = one_worker(sup)
    assert ask(producer) == (first, "0")

    os.kill(first, signal.SIGSTOP)
    second = replaced(sup, first)
    assert ask(producer) == (second, "0")  # same slot, a new process
    out = sup.output()
    assert "sent no heartbeat" in out, out
    assert sup.proc.poll() is None
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.output()


def test_blocked_event_loop_is_replaced(
    start: Callable[..., Supervised],
    redis_url: str,
    make_queue: Callable[..., Queue],
    tmp_path: Path,
) -> None:
    """A blocking call in an ``async def`` task stops the loop's heartbeat: replaced."""
    producer = make_queue(name=QUEUE_NAME)
    sup = start("--redis-url", redis_url, "--heartbeat-timeout", "5")
    first = one_worker(sup)
    marker = tmp_path / "blocked"
    handle = producer.send_sync(f"{__name__}.block_loop_once", (str(marker), 3600.0))
    wait_until(marker.exists, 60, "the blocking task to start")
    assert int(marker.read_text()) == first
    second = replaced(sup, first)
    assert ask(producer) == (second, "0")
    # The message of the killed worker is delivered again, to the new one.
    assert handle.result_sync(timeout=60) == "again"
    assert "sent no heartbeat" in sup.output()


def test_one_process_is_supervised_by_default(
    start: Callable[..., Supervised], redis_url: str, make_queue: Callable[..., Queue]
) -> None:
    """``blitzq worker APP`` (no --workers): kill -9 its worker and a new one runs the
    tasks queued meanwhile; the supervisor keeps running."""
    producer = make_queue(name=QUEUE_NAME)
    sup = start("--redis-url", redis_url)
    first = one_worker(sup)
    assert first != sup.proc.pid
    os.kill(first, signal.SIGKILL)
    handles = [producer.send_sync(f"{__name__}.whoami") for _ in range(5)]
    second = replaced(sup, first)
    assert {tuple(h.result_sync(timeout=60)) for h in handles} == {(str(second), "0")}
    assert sup.proc.poll() is None
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.output()


def test_no_supervise_runs_the_worker_in_the_command_process(
    start: Callable[..., Supervised], redis_url: str, make_queue: Callable[..., Queue]
) -> None:
    producer = make_queue(name=QUEUE_NAME)
    sup = start("--redis-url", redis_url, "--no-supervise")
    assert ask(producer) == (sup.proc.pid, "")
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.output()


def test_broker_not_there_at_start_is_waited_for(
    start: Callable[..., Supervised], namespace: str, tmp_path: Path
) -> None:
    """Redis down when the supervisor starts: the worker waits for it (logged, no restart
    spent) and runs tasks once it answers."""
    directory = tmp_path / "redis"
    directory.mkdir()
    server = PrivateRedis(directory)  # its port is free: nothing answers yet
    sup = start("--redis-url", server.url, "--max-restarts", "0")
    try:
        wait_until(
            lambda: sup.output().count("broker not reachable yet") >= 2,
            60,
            f"the worker waiting for its broker\n{sup.output()}",
        )
        worker = one_worker(sup)
        server.start()
        producer = Queue(QUEUE_NAME, redis_url=server.url, namespace=namespace)
        try:
            assert ask(producer) == (worker, "0")
        finally:
            producer.close_sync()
        out = sup.output()
        assert "restarting worker slot" not in out, out
        assert "gave up" not in out, out
        sup.proc.send_signal(signal.SIGTERM)
        assert sup.proc.wait(30) == 0, sup.output()
    finally:
        server.stop()


def test_no_supervise_fails_at_once_without_a_broker(
    start: Callable[..., Supervised], tmp_path: Path
) -> None:
    """Unsupervised, a broker that does not answer is a connection error: exit 1 (systemd
    or Kubernetes restarts it)."""
    server = PrivateRedis(tmp_path)  # never started
    sup = start("--redis-url", server.url, "--no-supervise")
    assert sup.proc.wait(60) == 1, sup.output()


CRASHING_APP = "import os\nos._exit(3)\n"


@pytest.mark.parametrize("budget", [0, 2])
def test_crash_budget_is_settable(
    budget: int, start: Callable[..., Supervised], redis_url: str, tmp_path: Path
) -> None:
    """``--max-restarts N --restart-window S``: a slot crashing at every start is restarted
    N times within the window, then given up (exit 1)."""
    (tmp_path / "crash_app.py").write_text(CRASHING_APP)
    sup = start(
        "--redis-url",
        redis_url,
        "--max-restarts",
        str(budget),
        "--restart-window",
        "3600",
        app="crash_app:queue",
        cwd=tmp_path,
    )
    assert sup.proc.wait(120) == 1, sup.output()
    out = sup.output()
    assert out.count("exited with code 3") == budget + 1, out
    assert f"restarted {budget} times within 3600 s: giving up on it" in out, out


@pytest.mark.parametrize("supervise", [True, False], ids=["supervised", "no-supervise"])
def test_configuration_error_exits_78_and_is_not_restarted(
    supervise: bool, start: Callable[..., Supervised], redis_url: str, tmp_path: Path
) -> None:
    """A module that fails on import (found only by the worker) ends the worker with 78,
    and the supervisor with 78 without a restart."""
    (tmp_path / "broken_app.py").write_text("raise RuntimeError('bad settings')\n")
    extra = [] if supervise else ["--no-supervise"]
    sup = start("--redis-url", redis_url, *extra, app="broken_app:queue", cwd=tmp_path)
    assert sup.proc.wait(60) == 78, sup.output()
    out = sup.output()
    assert out.count("RuntimeError: bad settings") == 1, out
    assert "restarting worker slot" not in out, out


def test_check_exits_78_on_a_configuration_error(tmp_path: Path, redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    (tmp_path / "broken_app.py").write_text("raise RuntimeError('bad settings')\n")
    for app in ("broken_app:queue", "no_such_module_xyz:queue"):
        done = subprocess.run(
            [sys.executable, "-m", "blitzq", "check", app, "--redis-url", redis_url],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 78, done.stderr


def test_heartbeat_pipe_does_not_leak_into_the_environment() -> None:
    """The variable naming the pipe is taken out once read (processes the worker starts do
    not inherit it)."""
    from blitzq.worker.heartbeat import HEARTBEAT_ENV, start_beating

    read_end, write_end = os.pipe()
    os.environ[HEARTBEAT_ENV] = f"{write_end},0.01"

    async def main() -> bytes:
        task = start_beating()
        assert task is not None
        assert HEARTBEAT_ENV not in os.environ
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return os.read(read_end, 100)

    try:
        assert asyncio.run(main())  # at least one beat was written
    finally:
        os.environ.pop(HEARTBEAT_ENV, None)
        os.close(read_end)


@pytest.mark.parametrize(
    "extra",
    [["--workers", "2"], ["--autoscale", "1,2"], ["--max-tasks-per-child", "5"], ["--reload"]],
)
def test_no_supervise_refuses_what_needs_a_supervisor(extra: list[str]) -> None:
    from click.testing import CliRunner

    from blitzq.cli import cli

    result = CliRunner().invoke(cli, ["worker", APP, "--no-supervise", *extra])
    assert result.exit_code == 2, result.output
    assert "--no-supervise runs one worker in this process" in result.output
    assert extra[0] in result.output
