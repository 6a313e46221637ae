"""The scheduler against a real Redis: exactly one dispatch per occurrence, clock steps, CLI.

What is due is decided on the server's clock, so instead of stepping a clock the tests plant
the periodic history (a last run days back: missed runs; one in the server's future: the
state a backward step leaves) and use daily schedules whose next occurrence is hours away;
``Every(1)`` tasks run in real time with bounded waits.
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
from tests.polling import wait_until


async def server_now(raw_redis: Any) -> float:
    """The server's clock, which decides what is due."""
    seconds, micros = await raw_redis.time()
    return float(seconds) + micros / 1e6


def periodic_key(namespace: str) -> str:
    return "{" + namespace + "}:periodic"


def daily_far_from(now: float) -> tuple[Every, float]:
    """A daily ``Every`` whose occurrences fall 12 h either side of ``now``, and its newest
    occurrence before ``now``: nothing comes due while a test runs, whatever the time."""
    offset = (now + 43200.0) % 86400.0
    return Every(86400, offset=offset), Every(86400, offset=offset).next_after(now) - 86400.0


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
    schedule, newest = daily_far_from(await server_now(raw_redis))
    occurrences = [newest - 86400 * k for k in range(7, -1, -1)]  # eight missed days
    await raw_redis.hset(periodic_key(namespace), "beat", repr(newest - 8 * 86400))

    def app() -> Queue:
        queue = make_queue(mode=mode)

        @queue.periodic(schedule, name="beat", missed="run_all")
        async def beat() -> str:
            runs.append(time.time())
            return "ok"

        return queue

    queues = [app() for _ in range(5)]
    schedulers = [Scheduler(q) for q in queues]
    try:
        results = await asyncio.gather(*(s.tick() for s in schedulers))
        assert sum(results) == len(occurrences), results
        # Every scheduler ticks again: nothing more.
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
    schedule, newest = daily_far_from(await server_now(raw_redis))
    occurrences = [newest - 86400 * k for k in range(19, -1, -1)]
    await raw_redis.hset(periodic_key(namespace), "beat", repr(newest - 20 * 86400))

    def run_one(barrier: threading.Barrier) -> int:
        queue = make_queue()
        queue.periodic(schedule, name="beat", missed="run_all")(lambda: None)
        scheduler = Scheduler(queue)

        async def main() -> int:
            try:
                barrier.wait(10)
                for _ in range(3):
                    await scheduler.tick()
                return scheduler.dispatched
            finally:
                await queue.close()

        return asyncio.run(main())

    barrier = threading.Barrier(4)
    counts = await asyncio.gather(*(asyncio.to_thread(run_one, barrier) for _ in range(4)))
    assert sum(counts) == len(occurrences)
    assert await published(raw_redis, namespace) == ids("beat", *occurrences)


async def test_an_occurrence_not_yet_due_by_the_server_clock_is_refused(
    make_queue: Callable[..., Queue], namespace: str, raw_redis: Any
) -> None:
    """The claim compares with ``TIME``: a scheduler whose clock is fast cannot dispatch early."""
    queue = make_queue()
    try:
        now = await server_now(raw_redis)
        broker = queue.broker
        assert not await broker.claim_periodic("beat", now + 30, b"early", "default")
        assert await broker.periodic_last(["beat"]) == {}
        assert await broker.claim_periodic("beat", now - 1, b"due", "default")
        assert not await broker.claim_periodic("beat", now - 1, b"again", "default")
        assert not await broker.claim_periodic("beat", now - 2, b"older", "default")
        assert await broker.periodic_last(["beat"]) == {"beat": now - 1}
    finally:
        await queue.close()


async def test_a_fast_scheduler_clock_does_not_dispatch_early(
    make_queue: Callable[..., Queue], namespace: str, raw_redis: Any
) -> None:
    """Issue 7 §5: the scheduler compared due times with its own clock."""
    queue = make_queue()
    schedule, newest = daily_far_from(await server_now(raw_redis))
    queue.periodic(schedule, name="beat")(lambda: None)
    await raw_redis.hset(periodic_key(namespace), "beat", repr(newest))
    try:
        # 13 h fast: by its clock the next occurrence (12 h away) is due. Not by the server's.
        fast = Scheduler(queue, clock=lambda: time.time() + 13 * 3600)
        assert await fast.tick() == 0
        assert await published(raw_redis, namespace) == []
        assert fast.next_wakeup(await server_now(raw_redis)) == fast.poll_interval
    finally:
        await queue.close()


# --------------------------------------------------------------- clock steps
async def test_a_backward_step_of_the_server_clock_keeps_every_firing(
    make_queue: Callable[..., Queue], namespace: str, raw_redis: Any
) -> None:
    """Issue 7 §5: ``Every`` fell silent for the length of a backward clock step.

    The server's clock cannot be stepped here, so the test plants the state such a step
    leaves: a last occurrence an hour in the server's future.
    """
    queue = make_queue()
    queue.periodic(Every(1), name="beat", missed="run_all")(lambda: None)
    future = await server_now(raw_redis) + 3600
    await raw_redis.hset(periodic_key(namespace), "beat", repr(future))
    # The scheduler's own clock steps back too (it plays no part).
    scheduler = Scheduler(queue, clock=lambda: time.time() - 3600, poll_interval=0.2)
    try:
        seen_at = await server_now(raw_redis)
        assert await scheduler.tick() == 0  # the step is seen: restart from now
        deadline = time.monotonic() + 15
        while len(await published(raw_redis, namespace)) < 3:
            assert time.monotonic() < deadline, "Every(1) did not resume after the step"
            await scheduler.tick()
            await asyncio.sleep(0.1)
        found = [int(i.rsplit(":", 1)[1]) for i in await published(raw_redis, namespace)]
        assert found == sorted(set(found))  # each second once, in order
        assert found[0] > seen_at - 1
        last = (await queue.broker.periodic_last(["beat"]))["beat"]
        assert last <= await server_now(raw_redis)
    finally:
        await queue.close()


async def test_downtime_applies_each_missed_run_policy(
    make_queue: Callable[..., Queue], namespace: str, raw_redis: Any
) -> None:
    queue = make_queue()
    schedule, newest = daily_far_from(await server_now(raw_redis))
    for policy in ("run_once", "run_all", "skip"):
        queue.periodic(schedule, name=policy, missed=policy)(lambda: None)  # type: ignore[arg-type]
        await raw_redis.hset(periodic_key(namespace), policy, repr(newest - 10 * 86400))
    scheduler = Scheduler(queue)

    async def dispatched_ids(name: str) -> list[str]:
        return [
            i for i in await published(raw_redis, namespace) if i.startswith(f"periodic:{name}:")
        ]

    try:
        # Ten occurrences passed while no scheduler ran.
        assert await scheduler.tick() == 1 + 10 + 0
        missed = [newest - 86400 * k for k in range(9, -1, -1)]
        assert await dispatched_ids("run_once") == ids("run_once", newest)
        assert await dispatched_ids("run_all") == ids("run_all", *missed)
        assert await dispatched_ids("skip") == []
        assert await queue.broker.periodic_last(["run_once", "run_all", "skip"]) == {
            "run_once": newest,
            "run_all": newest,
            "skip": newest - 10 * 86400,
        }
    finally:
        await queue.close()


async def test_a_forward_step_of_the_server_clock_fires_one_catch_up(
    make_queue: Callable[..., Queue], namespace: str, raw_redis: Any
) -> None:
    """Server time that runs ahead of real time is a clock step, not downtime.

    Simulated by the scheduler's monotonic clock running *back* ten days between two ticks
    while the server's advances normally: the same difference a ten-day step would make.
    """
    queue = make_queue()
    schedule, newest = daily_far_from(await server_now(raw_redis))
    queue.periodic(schedule, name="beat", missed="run_all")(lambda: None)
    mono = [1e6]
    scheduler = Scheduler(queue, monotonic=lambda: mono[0])
    try:
        assert await scheduler.tick() == 0  # first sight: nothing missed
        await raw_redis.hset(periodic_key(namespace), "beat", repr(newest - 10 * 86400))
        mono[0] -= 10 * 86400
        assert await scheduler.tick() == 1
        assert await published(raw_redis, namespace) == ids("beat", newest)
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


@pytest.fixture
def far_local_zone() -> Iterator[str]:
    """The process's local zone set to one far from UTC (and back afterwards), so a time
    printed in the local zone instead of UTC shows."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "Pacific/Auckland"
    time.tzset()
    try:
        yield "Pacific/Auckland"
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


async def test_scheduler_list_shows_schedule_next_and_last_run(
    far_local_zone: str,
    app_module: str,
    make_queue: Callable[..., Queue],
    redis_url: str,
    namespace: str,
    raw_redis: Any,
) -> None:
    # One occurrence of cli.beat was dispatched (by a scheduler of the same app).
    t0 = math.floor(await server_now(raw_redis) / 60) * 60 - 3600.0
    await raw_redis.hset(periodic_key(namespace), "cli.beat", repr(t0 + 60))

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(
            cli,
            ["--redis-url", redis_url, "--namespace", namespace, "scheduler", "list", *args],
            env={
                "BLITZQ_REDIS_URL": None,
                "BLITZQ_NAMESPACE": None,
                "BLITZQ_MODE": None,
                "COLUMNS": "80",  # not a terminal: never folded, whatever COLUMNS says
            },
            catch_exceptions=False,
        )

    before = time.time()
    result = await asyncio.to_thread(invoke, f"{app_module}:queue", "--json")
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)["periodic_tasks"]}
    assert sorted(rows) == ["cli.beat", "cli.report", "cli.tick"]
    beat, report = rows["cli.beat"], rows["cli.report"]
    assert beat["schedule"] == "every 60s"
    assert beat["task"] == "cli.beat"
    assert beat["queue"] == "default"
    assert beat["missed"] == "run_once"
    assert datetime.fromisoformat(beat["last_run"]).timestamp() == t0 + 60
    # An interval entry's times are in UTC, as on the dashboard, whatever the local zone.
    assert beat["zone"] is None
    assert beat["tz"] == "UTC"
    assert beat["last_run"].endswith("+00:00")
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
    assert all(line.endswith(" code") for line in lines.values())  # the source column
    lines = {name: line.removesuffix(" code").rstrip() for name, line in lines.items()}
    assert "every 60s" in lines["cli.beat"]
    assert "cron 0 9 * * 1-5 (Europe/Berlin)" in lines["cli.report"]
    assert lines["cli.report"].endswith("-")  # never ran
    last_beat = datetime.fromtimestamp(t0 + 60, ZoneInfo("UTC"))
    assert lines["cli.beat"].endswith(last_beat.strftime("%Y-%m-%d %H:%M:%S UTC"))
    local_name = datetime.fromtimestamp(t0 + 60).astimezone().tzname()
    assert local_name
    assert local_name not in text.output, far_local_zone  # not the local zone


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
        runs = wait_until(lambda: len(succeeded()) >= 2 and succeeded(), 30, "two periodic runs")
        stamps = sorted(int(task_id.rsplit(":", 1)[1]) for task_id in runs)
        assert len(set(stamps)) == len(stamps)
    finally:
        code, out, err = _stop(proc)
        client.close()
        observer.close_sync()
    assert code == 0, err
    # The supervisor (the default, also with one process) announces itself, then its worker.
    assert out.startswith("blitzq supervisor "), out
    assert "\nblitzq worker " in out, out
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
        wait_until(lambda: ticks() >= 2, 30, "two dispatched cli.tick messages")
    finally:
        code, out, err = _stop(proc)
        messages = [decode_envelope(f[b"m"]) for _, f in client.xrange(stream)]
        client.close()
    assert code == 0, err
    assert out.startswith("blitzq scheduler "), out
    stamps = [int(m.id.rsplit(":", 1)[1]) for m in messages if m.task == "cli.tick"]
    assert len(stamps) >= 2
    assert stamps == sorted(set(stamps))
