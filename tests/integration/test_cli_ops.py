"""Operator tools of issue 11: ``blitzq worker --burst``, unknown tasks during a rolling
deploy, ``blitzq check``, runtime schedules (``blitzq schedule``) and the dead-letter CLI.

Commands run as a user runs them: the worker and the scheduler as real subprocesses of
``python -m blitzq``, the short commands in-process through click's CliRunner; all against
a real Redis (a private ``redis-server`` where a test needs a server configured its own way).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result

from blitzq import Queue
from blitzq.cli import cli
from tests.integration.proc_tasks import eventually, make_worker, running

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.ops_app:queue"
_CLEAN_ENV: dict[str, str | None] = {
    "BLITZQ_REDIS_URL": None,
    "BLITZQ_NAMESPACE": None,
    "BLITZQ_MODE": None,
}


def blitzq(url: str, namespace: str, *args: str) -> list[str]:
    """The command line ``python -m blitzq --redis-url URL --namespace NS ARGS``."""
    return [sys.executable, "-m", "blitzq", "--redis-url", url, "--namespace", namespace, *args]


def subprocess_env() -> dict[str, str]:
    """This environment with the worktree's sources first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    return env


@pytest.fixture
def invoke(redis_url: str, namespace: str) -> Callable[..., Result]:
    """Run ``blitzq --redis-url <test server> --namespace <test ns> ARGS`` in-process."""
    runner = CliRunner()

    def run(*args: str, input: str | None = None, url: str | None = None) -> Result:
        return runner.invoke(
            cli,
            ["--redis-url", url or redis_url, "--namespace", namespace, *args],
            input=input,
            env=_CLEAN_ENV,
            catch_exceptions=False,
        )

    return run


# -------------------------------------------------------------------- burst
@pytest.mark.timeout(90)
def test_burst_worker_drains_the_queues_and_exits_0(redis_url: str, namespace: str) -> None:
    queue = Queue(redis_url=redis_url, namespace=namespace, name="ops")
    later = None
    try:
        for i in range(20):
            queue.send_sync("ops.add", (i, 1))
        queue.send_sync("ops.add", (100, 0), delay=0.3)  # due soon: waited for
        later = queue.send_sync("ops.add", (1000, 0), delay=3600)  # far future: left
        proc = subprocess.run(
            blitzq(redis_url, namespace, "worker", APP, "--burst", "-c", "4"),
            cwd=ROOT,
            env=subprocess_env(),
            capture_output=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
        with redis.Redis.from_url(redis_url) as client:
            sums = sorted(int(x) for x in client.lrange("{" + namespace + "}:obs:sums", 0, -1))
        assert sums == sorted([i + 1 for i in range(20)] + [100])
        stats = queue.stats_sync(["ops"])
        assert stats["queues"]["ops"] == {"waiting": 0, "in_flight": 0}
        assert stats["scheduled"] == 1
        assert b"drained its queues" in proc.stderr
    finally:
        if later is not None:
            queue.cancel_sync(later.id)
        queue.close_sync()


def test_burst_with_several_workers_is_a_usage_error(invoke: Callable[..., Result]) -> None:
    result = invoke("worker", APP, "--burst", "--workers", "2")
    assert result.exit_code == 2
    assert "--burst" in result.output


# ------------------------------------------------------------- unknown tasks
async def test_an_unknown_task_waits_for_a_worker_that_knows_it(
    make_queue: Callable[..., Queue],
) -> None:
    old = make_queue(name="deploy")  # the old release: no task "deploy.new"
    new = make_queue(name="deploy")

    @new.task(name="deploy.new")
    async def new_task(x: int) -> int:
        return x * 2

    async with running(make_worker(old, queues=["deploy"], name="old-worker")):
        handle = await new_task.enqueue(21)
        # The old worker took it and put it back on the schedule instead of dead-lettering.
        await eventually(new.stats, lambda s: s["scheduled"] == 1)
        assert await new.dead_letter_count() == 0
    # The old release goes away (while both run, whichever fetches it first decides, so
    # the test lets the new one alone take it back: deterministic).
    async with running(make_worker(new, queues=["deploy"], name="new-worker")):
        assert await handle.result(timeout=30) == 42
    record = await new.inspect(handle.id)
    assert record is not None
    assert record.worker == "new-worker"
    assert record.attempts == 1  # deferrals spend no attempt
    await old.close()
    await new.close()


async def test_an_unknown_task_is_dead_lettered_after_the_grace(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(name="deploy")
    handle = await queue.send("deploy.nobody_knows", (1,))
    async with running(make_worker(queue, queues=["deploy"], unknown_task_grace=0.5)):
        dead = await eventually(queue.dead_letters, lambda rows: len(rows) == 1)
    assert dead[0].id == handle.id
    assert dead[0].reason == "unknown task"
    assert "deploy.nobody_knows" in dead[0].error
    assert "0.5 s" in dead[0].error
    await queue.close()
