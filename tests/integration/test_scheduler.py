"""The scheduler against a real Redis: exactly one dispatch per occurrence, clock jumps, CLI.

Schedulers tick on an injected clock (no waiting for real occurrences), except in the process
tests, where ``blitzq worker --scheduler`` and ``blitzq scheduler`` run ``Every(1)`` tasks in
real time with bounded waits.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from click.testing import CliRunner

from blitzq import Queue, TaskState, Worker
from blitzq.cli import cli
from blitzq.scheduler import Scheduler
from blitzq.schedules import Every
from blitzq.serialization import decode_envelope


class FakeClock:
    """A wall clock the test sets by hand (Unix seconds)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


#: A recent whole minute, so that occurrences of Every(60) fall on T0 + 60 k.
T0 = math.floor(time.time() / 60) * 60 - 3600.0


async def published(raw_redis: Any, namespace: str, queue: str = "default") -> list[str]:
    """Task ids of the messages waiting in ``queue`` (stream or list, whichever exists)."""
    prefix = "{" + namespace + "}:"
    entries = await raw_redis.xrange(f"{prefix}s:{queue}")
    messages = [fields[b"m"] for _, fields in entries]
    messages += await raw_redis.lrange(f"{prefix}l:{queue}", 0, -1)
    return [decode_envelope(m).id for m in messages]


def ids(name: str, *times: float) -> list[str]:
    return [f"periodic:{name}:{int(t)}" for t in times]


# ------------------------------------------------------------ exactly once
@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_five_schedulers_racing_dispatch_each_occurrence_once_and_it_runs_once(
    mode: str, make_queue: Callable[..., Queue], namespace: str, raw_redis: Any
) -> None:
    runs: list[float] = []

    def app() -> Queue:
        queue = make_queue(mode=mode)

        @queue.periodic(Every(60), name="beat", missed="run_all")
        async def beat() -> str:
            runs.append(time.time())
            return "ok"

        return queue

    queues = [app() for _ in range(5)]
    clock = FakeClock(T0 + 0.5)
    schedulers = [Scheduler(q, clock=clock) for q in queues]
    try:
        assert await asyncio.gather(*(s.tick() for s in schedulers)) == [0] * 5  # no history
        occurrences = [T0 + 60 * k for k in range(1, 9)]
        for occurrence in occurrences:
            clock.now = occurrence + 0.2
            results = await asyncio.gather(*(s.tick() for s in schedulers))
            assert sorted(results) == [0, 0, 0, 0, 1], results
        # Every scheduler ticks again at the same instant: nothing more.
        assert await asyncio.gather(*(s.tick() for s in schedulers)) == [0] * 5

        key = "{" + namespace + "}:" + ("s:default" if mode == "reliable" else "l:default")
        length = await (raw_redis.xlen(key) if mode == "reliable" else raw_redis.llen(key))
        assert length == len(occurrences)
        assert await published(raw_redis, namespace) == ids("beat", *occurrences)
        assert sum(s.dispatched for s in schedulers) == len(occurrences)

        # A worker runs each dispatched occurrence exactly once.
        worker = Worker(queues[0], concurrency=4, block_timeout=0.1, shutdown_timeout=2)
        running = asyncio.create_task(worker.run())
        try:
            for task_id in ids("beat", *occurrences):
                assert await queues[0].get_result(task_id, timeout=10) == "ok"
        finally:
            worker.stop()
            await running
        assert len(runs) == len(occurrences)
        stats = await queues[0].stats(["default"])
        assert stats["queues"]["default"] == {"waiting": 0, "in_flight": 0}
    finally:
        for q in queues:
            await q.close()


async def test_schedulers_in_threads_with_their_own_loops_dispatch_once(
    make_queue: Callable[..., Queue], namespace: str, raw_redis: Any
) -> None:
    """Truly parallel schedulers (threads, own connections) still dispatch each occurrence once."""
    occurrences = [T0 + 60 * k for k in range(1, 21)]

    def run_one(barrier: threading.Barrier) -> int:
        queue = make_queue()
        queue.periodic(Every(60), name="beat", missed="run_all")(lambda: None)
        clock = FakeClock(T0 + 0.5)
        scheduler = Scheduler(queue, clock=clock)

        async def main() -> int:
            try:
                await scheduler.tick()
                barrier.wait(10)
                for occurrence in occurrences:
                    clock.now = occurrence + 0.1
                    await scheduler.tick()
                return scheduler.dispatched
            finally:
                await queue.close()

        return asyncio.run(main())

    barrier = threading.Barrier(4)
    counts = await asyncio.gather(*(asyncio.to_thread(run_one, barrier) for _ in range(4)))
    assert sum(counts) == len(occurrences)
    assert await published(raw_redis, namespace) == ids("beat", *occurrences)


# --------------------------------------------------------------- clock jumps
async def test_a_backwards_clock_jump_never_redispatches(
    make_queue: Callable[..., Queue], namespace: str, raw_redis: Any
) -> None:
    queue = make_queue()
    queue.periodic(Every(60), name="beat", missed="run_all")(lambda: None)
    clock = FakeClock(T0 + 1)
    scheduler = Scheduler(queue, clock=clock)
    try:
        assert await scheduler.tick() == 0
        clock.now = T0 + 60.3
        assert await scheduler.tick() == 1

        clock.now = T0 - 3600  # an hour back (NTP correction, VM restore...)
        assert await scheduler.tick() == 0
        clock.now = T0 + 60.3  # and the same occurrence comes round again
        assert await scheduler.tick() == 0
        # A restarted scheduler (no memory) with the old time does not dispatch it either.
        assert await Scheduler(queue, clock=FakeClock(T0 + 60.5)).tick() == 0
        assert await published(raw_redis, namespace) == ids("beat", T0 + 60)

        clock.now = T0 + 120.1
        assert await scheduler.tick() == 1
        assert await published(raw_redis, namespace) == ids("beat", T0 + 60, T0 + 120)
        assert await queue.broker.periodic_last(["beat", "nothing"]) == {"beat": T0 + 120}
    finally:
        await queue.close()


async def test_a_forward_clock_jump_applies_each_missed_run_policy(
    make_queue: Callable[..., Queue], namespace: str, raw_redis: Any
) -> None:
    queue = make_queue()
    for policy in ("run_once", "run_all", "skip"):
        queue.periodic(Every(60), name=policy, missed=policy)(lambda: None)  # type: ignore[arg-type]
    clock = FakeClock(T0 + 1)
    scheduler = Scheduler(queue, clock=clock)

    async def dispatched_ids(name: str) -> list[str]:
        return [
            i for i in await published(raw_redis, namespace) if i.startswith(f"periodic:{name}:")
        ]

    try:
        await scheduler.tick()
        clock.now = T0 + 60.2
        assert await scheduler.tick() == 3

        # Ten occurrences pass unseen (the clock jumps, or every scheduler was down).
        clock.now = T0 + 11 * 60 + 30
        assert await scheduler.tick() == 1 + 10 + 0
        missed = [T0 + 60 * k for k in range(2, 12)]
        assert await dispatched_ids("run_once") == ids("run_once", T0 + 60, T0 + 660)
        assert await dispatched_ids("run_all") == ids("run_all", T0 + 60, *missed)
        assert await dispatched_ids("skip") == ids("skip", T0 + 60)

        # Back on schedule, every policy dispatches the next occurrence on time.
        clock.now = T0 + 720.4
        assert await scheduler.tick() == 3
        assert (await dispatched_ids("skip"))[-1] == ids("skip", T0 + 720)[0]
        assert await queue.broker.periodic_last(["run_once", "run_all", "skip"]) == {
            "run_once": T0 + 720,
            "run_all": T0 + 720,
            "skip": T0 + 720,
        }
    finally:
        await queue.close()


async def test_run_loop_dispatches_in_real_time_and_stops(
    make_queue: Callable[..., Queue], namespace: str, raw_redis: Any
) -> None:
    queue = make_queue()
    queue.periodic(Every(1), name="second")(lambda: None)
    scheduler = Scheduler(queue, poll_interval=0.5)
    running = asyncio.create_task(scheduler.run())
    try:
        deadline = time.monotonic() + 10
        while len(await published(raw_redis, namespace)) < 2:
            assert time.monotonic() < deadline, "the scheduler dispatched fewer than 2 in 10 s"
            await asyncio.sleep(0.05)
    finally:
        scheduler.stop()
        await asyncio.wait_for(running, 5)
        await queue.close()
    found = await published(raw_redis, namespace)
    stamps = [int(i.rsplit(":", 1)[1]) for i in found]
    assert stamps == sorted(set(stamps))  # distinct seconds, in order


# ---------------------------------------------------------------------- CLI
APP = """
import os

import blitzq
from blitzq.schedules import Cron, Every

queue = blitzq.Queue()


@queue.periodic(Every(60), name="cli.beat")
async def beat():
    return "beat"


@queue.periodic("0 9 * * 1-5", tz="Europe/Berlin", name="cli.report", missed="skip")
def report():
    return "report"


@queue.periodic(Every(1), name="cli.tick")
async def tick():
    return time_now()


def time_now():
    import time

    return time.time()
"""


@pytest.fixture
def app_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh importable application module (unique name) in the current directory."""
    name = f"periodic_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(APP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


async def test_scheduler_list_shows_schedule_next_and_last_run(
    app_module: str, make_queue: Callable[..., Queue], redis_url: str, namespace: str
) -> None:
    # One occurrence of cli.beat was dispatched (by a scheduler of the same app).
    queue = make_queue()
    queue.periodic(Every(60), name="cli.beat")(lambda: None)
    clock = FakeClock(T0 + 1)
    scheduler = Scheduler(queue, clock=clock)
    await scheduler.tick()
    clock.now = T0 + 60.5
    assert await scheduler.tick() == 1
    await queue.close()

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(
            cli,
            ["--redis-url", redis_url, "--namespace", namespace, "scheduler", "list", *args],
            env={
                "BLITZQ_REDIS_URL": None,
                "BLITZQ_NAMESPACE": None,
                "BLITZQ_MODE": None,
                "COLUMNS": "200",
            },
            catch_exceptions=False,
        )

    before = time.time()
    result = await asyncio.to_thread(invoke, f"{app_module}:queue", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)["periodic_tasks"]}
    assert sorted(rows) == ["cli.beat", "cli.report", "cli.tick"]
    beat, report = rows["cli.beat"], rows["cli.report"]
    assert beat["schedule"] == "every 60s"
    assert beat["task"] == "cli.beat"
    assert beat["queue"] == "default"
    assert beat["missed"] == "run_once"
    assert datetime.fromisoformat(beat["last_run"]).timestamp() == T0 + 60
    next_beat = datetime.fromisoformat(beat["next_run"]).timestamp()
    assert before < next_beat <= before + 60
    assert next_beat % 60 == 0
    assert report["schedule"] == "cron 0 9 * * 1-5 (Europe/Berlin)"
    assert report["missed"] == "skip"
    assert report["last_run"] is None
    next_report = datetime.fromisoformat(report["next_run"])
    assert next_report.timestamp() > before
    assert next_report.astimezone(ZoneInfo("Europe/Berlin")).hour == 9

    text = await asyncio.to_thread(invoke, f"{app_module}:queue")
    assert text.exit_code == 0, text.output
    lines = {line.split()[0]: line.strip() for line in text.output.splitlines() if "cli." in line}
    assert "every 60s" in lines["cli.beat"]
    assert "cron 0 9 * * 1-5 (Europe/Berlin)" in lines["cli.report"]
    assert lines["cli.report"].endswith("-")  # never ran
    assert (
        lines["cli.beat"]
        .rstrip()
        .endswith(datetime.fromtimestamp(T0 + 60).strftime("%Y-%m-%d %H:%M:%S"))
    )


def _blitzq_command() -> list[str]:
    script = Path(sys.executable).with_name("blitzq")
    return [str(script)] if script.exists() else [sys.executable, "-m", "blitzq"]


def _spawn(tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    return subprocess.Popen(
        [*_blitzq_command(), *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _stop(proc: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=5)
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def _wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def test_worker_with_scheduler_flag_runs_a_periodic_task_repeatedly(
    tmp_path: Path,
    app_module: str,
    redis_url: str,
    namespace: str,
    make_queue: Callable[..., Queue],
) -> None:
    ns = ["--redis-url", redis_url, "--namespace", namespace]
    proc = _spawn(tmp_path, "worker", f"{app_module}:queue", *ns, "-c", "4", "--scheduler")
    client = redis.Redis.from_url(redis_url)
    observer = make_queue()
    pattern = "{" + namespace + "}:t:periodic:cli.tick:*"

    def succeeded() -> list[str]:
        found = [k.decode().split(":t:", 1)[1] for k in client.scan_iter(match=pattern)]
        records = [observer.inspect_sync(task_id) for task_id in found]
        return [r.id for r in records if r is not None and r.state is TaskState.SUCCEEDED]

    try:
        runs = _wait_for(lambda: len(succeeded()) >= 2 and succeeded(), 30, "two periodic runs")
        stamps = sorted(int(task_id.rsplit(":", 1)[1]) for task_id in runs)
        assert len(set(stamps)) == len(stamps)
    finally:
        code, out, err = _stop(proc)
        client.close()
        observer.close_sync()
    assert code == 0, err
    assert out.startswith("blitzq worker "), out
    assert "scheduler stopped" in err


def test_scheduler_command_dispatches_and_stops_on_sigterm(
    tmp_path: Path, app_module: str, redis_url: str, namespace: str
) -> None:
    # ``blitzq scheduler MODULE:ATTR`` is ``blitzq scheduler run MODULE:ATTR``.
    proc = _spawn(
        tmp_path,
        "scheduler",
        f"{app_module}:queue",
        "--redis-url",
        redis_url,
        "--namespace",
        namespace,
    )
    client = redis.Redis.from_url(redis_url)
    stream = "{" + namespace + "}:s:default"

    def ticks() -> int:  # cli.beat (every minute) may be dispatched too
        found = [decode_envelope(f[b"m"]).task for _, f in client.xrange(stream)]
        return found.count("cli.tick")

    try:
        _wait_for(lambda: ticks() >= 2, 30, "two dispatched cli.tick messages")
    finally:
        code, out, err = _stop(proc)
        messages = [decode_envelope(f[b"m"]) for _, f in client.xrange(stream)]
        client.close()
    assert code == 0, err
    assert out.startswith("blitzq scheduler "), out
    stamps = [int(m.id.rsplit(":", 1)[1]) for m in messages if m.task == "cli.tick"]
    assert len(stamps) >= 2
    assert stamps == sorted(set(stamps))
