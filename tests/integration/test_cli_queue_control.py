"""CLI queue control (issue 27, point 5), typed as a user types it (a subprocess) against
real workers (subprocesses) on the real server: ``blitzq queue purge | pause | resume``,
``blitzq worker list`` and ``blitzq worker shutdown ID``. States are asserted, never timings.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis

from blitzq import Queue
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.queue_control_app:queue"
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def env(redis_url: str, namespace: str) -> dict[str, str]:
    """The environment of every subprocess: the test server and namespace."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    return clean | {
        "BLITZQ_REDIS_URL": redis_url,
        "BLITZQ_NAMESPACE": namespace,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }


def blitzq(
    env: dict[str, str], *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``blitzq ARGS`` as a user does."""
    return subprocess.run(
        [sys.executable, "-m", "blitzq", *args],
        cwd=ROOT, env=env, input=input, capture_output=True, text=True, timeout=90,
    )  # fmt: skip


def workers(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``blitzq worker list --json``: the live workers by id."""
    done = blitzq(env, "--json", "worker", "list")
    assert done.returncode == 0, done.stderr
    return {w["id"]: w for w in json.loads(done.stdout)["workers"]}


@contextmanager
def worker_procs(
    env: dict[str, str], tmp_path: Path, count: int, queues: str = "qc,other"
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` worker subprocesses of the app, registered; stopped (SIGTERM) on exit."""
    procs = []
    for i in range(count):
        log = (tmp_path / f"worker{i}.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "blitzq",
                    "worker",
                    APP,
                    "-Q",
                    queues,
                    "-c",
                    "4",
                    "--no-supervise",
                ],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    try:
        wait_until(lambda: len(workers(env)) == count, 60, f"{count} workers to register")
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture
def queue(make_queue: Callable[..., Queue]) -> Iterator[Queue]:
    """A producer's Queue on the test namespace."""
    q = make_queue(name="qc")
    yield q
    q.close_sync()


def test_pause_holds_a_queue_on_every_worker_until_resume(
    env: dict[str, str], tmp_path: Path, queue: Queue
) -> None:
    with worker_procs(env, tmp_path, 2):
        paused = blitzq(env, "queue", "pause", "qc")
        assert paused.returncode == 0, paused.stderr
        assert "queue qc paused" in paused.stdout
        again = blitzq(env, "--json", "queue", "pause", "qc")
        assert json.loads(again.stdout) == {"queue": "qc", "paused": True, "changed": False}
        # Each worker says in its registration that it holds the queue (so any fetch that
        # was in flight at the pause has ended).
        wait_until(
            lambda: all(w.get("paused") == ["qc"] for w in workers(env).values()),
            30, "both workers to report qc paused",
        )  # fmt: skip
        held = queue.send_sync("qc.add", [1, 2], {})
        # The same workers still run the other queue: a task there ends...
        other = queue.send_sync("qc.add", [3, 4], {}, queue="other")
        assert other.result_sync(timeout=30) == 7
        # ...while the paused one still waits, untaken.
        assert queue.stats_sync(["qc"])["queues"]["qc"]["waiting"] == 1
        assert queue.inspect_sync(held.id) is None  # no record: never started
        listed = blitzq(env, "worker", "list")
        assert "qc (paused)" in listed.stdout, listed.stdout

        resumed = blitzq(env, "queue", "resume", "qc")
        assert resumed.returncode == 0
        assert "queue qc resumed" in resumed.stdout
        assert held.result_sync(timeout=30) == 3
    refused = blitzq(env, "queue", "pause", "qc:high")
    assert refused.returncode == 2
    assert "qc:high" in refused.stderr


def test_purge_asks_then_deletes_every_level(env: dict[str, str], queue: Queue) -> None:
    for priority in ("high", "normal", "low", "normal"):
        queue.send_sync("qc.add", [1, 1], {}, priority=priority)
    declined = blitzq(env, "queue", "purge", "qc", input="n\n")
    assert declined.returncode == 1
    assert "Delete 4 waiting message(s) of queue 'qc'" in declined.stderr
    assert queue.stats_sync(["qc"])["queues"]["qc"]["waiting"] == 2  # nothing deleted
    unanswered = blitzq(env, "--json", "queue", "purge", "qc", input="")
    assert unanswered.returncode == 1
    assert json.loads(unanswered.stdout)["error"].startswith("not confirmed")
    done = blitzq(env, "--json", "queue", "purge", "qc", "--yes")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "queue": "qc",
        "purged": 4,
        "delayed_purged": 0,
        "delayed_left": 0,
    }
    stats = queue.stats_sync(["qc", "qc:high", "qc:low"])["queues"]
    assert [stats[q]["waiting"] for q in ("qc", "qc:high", "qc:low")] == [0, 0, 0]
    empty = blitzq(env, "queue", "purge", "qc")  # nothing to ask about
    assert empty.returncode == 0
    assert "purged 0 message(s)" in empty.stdout


def test_purge_says_how_many_delayed_tasks_stay_and_deletes_them_with_delayed(
    env: dict[str, str], queue: Queue
) -> None:
    @queue.task(name="qc.once", unique=True, queue="qc")
    async def once(n: int) -> None:
        return None

    queue.send_sync("qc.add", [1, 1], {})
    queue.send_sync("qc.add", [1, 2], {}, delay=3600)
    queue.send_sync("qc.add", [1, 3], {}, delay=3600, priority="high")  # to qc:high
    queue.send_sync("qc.add", [1, 4], {}, delay=3600, queue="other")  # another queue's
    first = once.options(delay=3600).enqueue_sync(7)
    assert queue.stats_sync()["scheduled"] == 4
    assert queue.delayed_count_sync("qc") == 2
    assert queue.delayed_count_sync("qc:high") == 1

    kept = blitzq(env, "queue", "purge", "qc", "--yes")
    assert kept.returncode == 0, kept.stderr
    lines = kept.stdout.splitlines()
    assert lines[0] == "purged 1 message(s) from queue qc"
    assert lines[1].startswith("3 delayed task(s) of queue qc stay on the schedule")
    assert "--delayed" in lines[1]
    assert queue.stats_sync()["scheduled"] == 4  # the default keeps them, and says so
    asked = blitzq(env, "queue", "purge", "qc", "--delayed", input="n\n")
    assert "Delete 0 waiting message(s) and 3 delayed task(s) of queue 'qc'" in asked.stderr

    gone = blitzq(env, "--json", "queue", "purge", "qc", "--yes", "--delayed")
    assert gone.returncode == 0, gone.stderr
    assert json.loads(gone.stdout) == {
        "queue": "qc",
        "purged": 0,
        "delayed_purged": 3,
        "delayed_left": 0,
    }
    assert queue.stats_sync()["scheduled"] == 1  # the other queue's stays
    assert queue.delayed_count_sync("other") == 1
    again = once.options(delay=3600).enqueue_sync(7)  # its unique key was freed
    assert not again.duplicate
    assert again.id != first.id
    assert queue.purge_queue_sync("qc", delayed=True) == 1
    assert queue.purge_queue_sync("other", delayed=True) == 1
    assert queue.stats_sync()["scheduled"] == 0


def test_worker_list_and_a_graceful_remote_shutdown(
    env: dict[str, str], tmp_path: Path, queue: Queue, redis_url: str, namespace: str
) -> None:
    gate = uuid.uuid4().hex
    with worker_procs(env, tmp_path, 2) as procs:
        running = queue.send_sync("qc.hold", [gate], {})
        # The worker running it lists it (id, host, pid, queues, slots, the run itself).
        wait_until(
            lambda: any(r["id"] == running.id for w in workers(env).values()
                        for r in w.get("running_tasks", [])),
            30, "a worker to list the running task",
        )  # fmt: skip
        (busy,) = [w for w in workers(env).values() if w["running"] == 1]
        assert busy["running_tasks"][0]["task"] == "qc.hold"
        assert busy["queues"] == ["qc", "other"]
        assert busy["concurrency"] == 4
        assert busy["pid"] in [p.pid for p in procs]
        assert busy["host"]
        table = blitzq(env, "worker", "list")
        assert busy["id"] in table.stdout
        assert "qc.hold" in table.stdout

        shutdown = subprocess.Popen(
            [sys.executable, "-m", "blitzq", "worker", "shutdown", busy["id"]],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # Graceful: the worker stops fetching but its task runs to its end.
        index, proc = next((i, p) for i, p in enumerate(procs) if p.pid == busy["pid"])
        log = tmp_path / f"worker{index}.log"
        wait_until(
            lambda: "shutting down: asked on the event channel" in log.read_text(),
            30, "the worker to take the request",
        )  # fmt: skip
        assert proc.poll() is None  # still running its task
        with redis.Redis.from_url(redis_url) as client:
            client.set("{" + namespace + "}:gate:" + gate, 1)
        out, err = shutdown.communicate(timeout=60)
        assert shutdown.returncode == 0, err
        assert f"worker {busy['id']} shut down" in out
        assert proc.wait(30) == 0
        assert running.result_sync(timeout=10) == "released"
        others = workers(env)
        assert busy["id"] not in others
        assert len(others) == 1
        unknown = blitzq(env, "worker", "shutdown", busy["id"])
        assert unknown.returncode == 1
        assert "no live worker" in unknown.stderr


def test_a_burst_worker_does_not_wait_for_a_paused_queue(env: dict[str, str], queue: Queue) -> None:
    # Paused before its first task: nothing has used qc yet, so it takes --force.
    assert blitzq(env, "queue", "pause", "qc", "--force").returncode == 0
    held = queue.send_sync("qc.add", [1, 2], {})
    other = queue.send_sync("qc.add", [3, 4], {}, queue="other")
    done = blitzq(env, "worker", APP, "-Q", "qc,other", "--burst")
    assert done.returncode == 0, done.stdout + done.stderr
    assert other.result_sync(timeout=10) == 7
    assert queue.stats_sync(["qc"])["queues"]["qc"]["waiting"] == 1  # left for after resume
    assert queue.inspect_sync(held.id) is None
    # `queue stats` says why a waiting task with a live worker does not run (user report).
    table = blitzq(env, "queue", "stats", "-Q", "qc,other")
    row = next(line for line in table.stdout.splitlines() if line.split()[:1] == ["qc"])
    assert "paused" in row.split()
    assert "paused: qc (blitzq queue resume QUEUE)" in table.stdout
    listed = json.loads(blitzq(env, "--json", "queue", "stats", "-Q", "qc").stdout)
    assert listed["paused"] == ["qc"]
    assert blitzq(env, "queue", "resume", "qc").returncode == 0
    again = blitzq(env, "worker", APP, "-Q", "qc", "--burst")
    assert again.returncode == 0, again.stdout + again.stderr
    assert held.result_sync(timeout=10) == 3


def test_check_warns_only_about_an_entry_that_missed_a_run(
    env: dict[str, str], redis_url: str, namespace: str
) -> None:
    """``blitzq check``: a cron entry whose first run is still ahead is ok; one that was due
    since it was added and never dispatched warns (issue 27, point 5)."""
    from blitzq.runtime_schedules import RuntimeSchedule

    for name, when in (("rt.later", ["--cron", "0 0 1 1 *"]), ("rt.missed", ["--every", "60"])):
        added = blitzq(env, "schedule", "add", name, "--task", "qc.add", "--args", "[1, 2]", *when)
        assert added.returncode == 0, added.stderr
    key = "{" + namespace + "}:periodic:rt"
    with redis.Redis.from_url(redis_url) as client:  # added an hour ago, never dispatched
        entry = RuntimeSchedule.decode("rt.missed", client.hget(key, "rt.missed"))
        earlier = dataclasses.replace(entry, added_at=entry.added_at - 3600)
        client.hset(key, "rt.missed", earlier.encode())
    done = blitzq(env, "--json", "check", APP)
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    later = checks["periodic rt.later"]
    assert later["status"] == "ok", later
    assert "not dispatched yet, first run" in later["detail"]
    missed = checks["periodic rt.missed"]
    assert missed["status"] == "warn", missed
    assert "is a scheduler running?" in missed["detail"]
