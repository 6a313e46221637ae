"""Operator tools of issue 11: ``blitzq worker --burst``, unknown tasks during a rolling
deploy, ``blitzq check``, runtime schedules (``blitzq schedule``) and the dead-letter CLI.

Commands run as a user runs them: the worker and the scheduler as real subprocesses of
``python -m blitzq``, the short commands in-process through click's CliRunner; all against
a real Redis (a private ``redis-server`` where a test needs a server configured its own way).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from click.testing import CliRunner, Result

from blitzq import Queue
from blitzq.cli import cli
from blitzq.serialization import decode_envelope
from tests.conftest import SessionRedis, free_port
from tests.integration.proc_tasks import eventually, make_worker, running, worker_thread
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.integration.ops_app:queue"
_CLEAN_ENV: dict[str, str | None] = {
    "BLITZQ_REDIS_URL": None,
    "BLITZQ_NAMESPACE": None,
    "BLITZQ_MODE": None,
    # A pipe is never folded, whatever COLUMNS says (CI machines export COLUMNS=80).
    "COLUMNS": "80",
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
@pytest.mark.timeout(90)
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
        # A new worker joins while the old one still runs. When the message comes back
        # (about 1 s), either the new worker takes it, or the old one hands it over to the
        # new one (it reads the registrations, which advertise the task names, at most a
        # second old): no backoff schedule has to fit in the wait.
        async with running(make_worker(new, queues=["deploy"], name="new-worker")):
            assert await handle.result(timeout=60) == 42
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


# -------------------------------------------------------------- dead letters
def json_out(result: Result) -> Any:
    """The JSON document a ``--json`` command printed (exit code 0 checked)."""
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.timeout(90)
def test_dead_letter_filters_show_replay_purge_and_summary(
    make_queue: Callable[..., Queue], invoke: Callable[..., Result], redis_url: str
) -> None:
    queue = make_queue(name="dl")

    @queue.task(name="dl.value", retries=0)
    async def value(n: int) -> None:
        raise ValueError(f"bad {n}")

    @queue.task(name="dl.key", retries=0, queue="dl2")
    async def key(n: int) -> None:
        raise KeyError(n)

    with worker_thread(queue, queues=["dl", "dl2"], unknown_task_grace=0):
        for n in range(3):
            value.enqueue_sync(n)
        key.enqueue_sync(1)
        key.options(priority="high").enqueue_sync(2)
        queue.send_sync("dl.gone", (0,))
        wait_until(lambda: queue.dead_letter_count_sync() == 6, 30, "six dead letters")
    old = queue.dead_letters_sync(task="dl.value", limit=1)[0]
    with redis.Redis.from_url(redis_url) as client:  # one of them failed two hours ago
        client.hset(f"{{{queue.namespace}}}:d:{old.id}", "failed_at", time.time() - 7200)

    def ids(*args: str) -> set[str]:
        doc = json_out(invoke("dead-letter", "list", "--json", *args))
        return {d["id"] for d in doc["dead_letters"]}

    assert len(ids("--task", "dl.value")) == 3
    assert len(ids("--error-type", "ValueError")) == 3
    assert len(ids("--error-type", "builtins.KeyError")) == 0  # builtins are unqualified
    assert len(ids("--queue", "dl2")) == 2  # its :high level included
    assert len(ids("--queue", "dl2:high")) == 1
    assert len(ids("--reason", "unknown task", "--task", "dl.gone")) == 1
    assert ids("--older-than", "1h") == {old.id}
    assert len(ids("--newer-than", "1h")) == 5
    assert len(ids("--task", "dl.value", "--limit", "2")) == 2
    assert invoke("dead-letter", "list", "--older-than", "soon").exit_code == 2
    human = invoke("dead-letter", "list", "--task", "nobody")
    assert "no dead letters match" in human.stdout

    shown = json_out(invoke("dead-letter", "show", old.id, "--json"))
    assert shown["task"] == "dl.value"
    assert shown["error_type"] == "ValueError"
    assert shown["args"] == old.args
    assert "ValueError" in invoke("dead-letter", "show", old.id).stdout
    assert invoke("dead-letter", "show", "no-such-id").exit_code == 1

    summary = json_out(invoke("dead-letter", "summary", "--json"))
    assert summary["total"] == 6
    assert summary["by_task"] == {"dl.value": 3, "dl.key": 2, "dl.gone": 1}
    assert summary["by_reason"] == {"failed": 5, "unknown task": 1}
    assert summary["by_error_type"] == {"ValueError": 3, "KeyError": 2, "": 1}
    assert "dl.value" in invoke("dead-letter", "summary").stdout

    dry = json_out(
        invoke("dead-letter", "replay", "--all", "--task", "dl.key", "--dry-run", "--json")
    )
    assert [o["outcome"] for o in dry["outcomes"]] == ["dry run", "dry run"]
    assert queue.dead_letter_count_sync() == 6
    one = invoke("dead-letter", "replay", old.id, "--dry-run")
    assert one.exit_code == 0
    assert "would replay" in one.stdout
    assert invoke("dead-letter", "replay", "--all", old.id).exit_code == 2
    assert invoke("dead-letter", "replay", "--all", "--rate", "fast").exit_code == 2

    replayed = json_out(
        invoke("dead-letter", "replay", "--all", "--task", "dl.key", "--rate", "50/s", "--json")
    )
    assert sorted(o["outcome"] for o in replayed["outcomes"]) == ["replayed", "replayed"]
    assert queue.dead_letter_count_sync() == 4
    stats = queue.stats_sync(["dl2", "dl2:high"])["queues"]
    assert stats["dl2"]["waiting"] + stats["dl2:high"]["waiting"] == 2

    declined = invoke("dead-letter", "purge", "--error-type", "ValueError", input="n\n")
    assert declined.exit_code == 1
    assert "Delete 3 matching dead letter(s)" in declined.output
    purged = invoke("dead-letter", "purge", "--error-type", "ValueError", input="y\n")
    assert purged.exit_code == 0
    assert "purged 3" in purged.stdout
    assert json_out(
        invoke("dead-letter", "purge", "--reason", "unknown task", "--yes", "--json")
    ) == {"purged": 1}
    assert queue.dead_letter_count_sync() == 0
    queue.purge_queue_sync("dl2")
    queue.purge_queue_sync("dl2:high")
    queue.close_sync()


# ------------------------------------------------------------ run-time schedules
def _dispatched(client: redis.Redis, namespace: str, name: str) -> list[int]:
    """Occurrences (Unix seconds) of periodic entry ``name`` dispatched to queue ``ops``."""
    out = []
    for _, fields in client.xrange("{" + namespace + "}:s:ops"):
        task_id = decode_envelope(fields[b"m"]).id
        prefix = f"periodic:{name}:"
        if task_id.startswith(prefix):
            out.append(int(task_id.removeprefix(prefix)))
    return sorted(out)


@pytest.mark.timeout(90)
def test_runtime_schedules_are_picked_up_by_a_running_scheduler(
    invoke: Callable[..., Result], redis_url: str, namespace: str
) -> None:
    proc = subprocess.Popen(
        blitzq(redis_url, namespace, "scheduler", "run", APP, "--poll-interval", "0.2"),
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    client = redis.Redis.from_url(redis_url)
    try:
        added = invoke(
            "schedule", "add", "rt.add", "--task", "ops.add", "--every", "1",
            "--args", "[40, 2]", "--json",
        )  # fmt: skip
        assert json_out(added) == {"added": True, "name": "rt.add", "schedule": "every 1s"}
        berlin = invoke(
            "schedule", "add", "rt.berlin", "--task", "ops.add", "--cron", "0 9 * * *",
            "--tz", "Europe/Berlin", "--kwargs", '{"a": 1, "b": 2}',
        )  # fmt: skip
        assert berlin.exit_code == 0, berlin.output
        # The running scheduler dispatches the new entry without a restart.
        wait_until(lambda: len(_dispatched(client, namespace, "rt.add")) >= 2, 30, "rt.add runs")
        envelope = decode_envelope(client.xrange("{" + namespace + "}:s:ops", count=1)[0][1][b"m"])
        assert envelope.task == "ops.add"
        assert envelope.args == [40, 2]

        listed = {s["name"]: s for s in json_out(invoke("schedule", "list", "--json"))["schedules"]}
        assert sorted(listed) == ["rt.add", "rt.berlin"]
        assert listed["rt.add"]["last_run"] is not None
        assert listed["rt.add"]["tz"] == "UTC"  # an --every entry: UTC, as on the dashboard
        assert listed["rt.add"]["last_run"].endswith("+00:00")
        assert listed["rt.berlin"]["zone"] == "Europe/Berlin"
        next_berlin = datetime.fromisoformat(listed["rt.berlin"]["next_run"])
        assert next_berlin.astimezone(ZoneInfo("Europe/Berlin")).hour == 9
        assert listed["rt.berlin"]["kwargs"] == {"a": 1, "b": 2}
        human = invoke("schedule", "list").stdout
        assert "09:00:00 Europe/Berlin" in human
        # `scheduler list` shows code-defined and run-time entries, times with their zone.
        rows = json_out(invoke("scheduler", "list", APP, "--json"))["periodic_tasks"]
        assert {r["name"]: r["source"] for r in rows} == {
            "ops.hourly": "code", "rt.add": "runtime", "rt.berlin": "runtime",
        }  # fmt: skip
        table = invoke("scheduler", "list", APP).stdout
        assert "Europe/Berlin" in table
        header = next(line for line in table.splitlines() if "schedule" in line).split()
        assert header[:3] == ["name", "task", "schedule"]
        assert header[-1] == "source"
        berlin_row = next(line for line in table.splitlines() if "rt.berlin" in line).split()
        assert berlin_row[1] == "ops.add"
        assert berlin_row[-1] == "run-time"
        hourly_row = next(line for line in table.splitlines() if "ops.hourly" in line).split()
        assert hourly_row[-1] == "code"

        removed = invoke("schedule", "remove", "rt.add")
        assert removed.exit_code == 0, removed.output
        after = client.time()[0]
        assert invoke("schedule", "remove", "rt.add").exit_code == 1
        # Once a later entry runs, the scheduler has read the entries without rt.add.
        assert (
            invoke("schedule", "add", "rt.later", "--task", "ops.add", "--every", "1").exit_code
            == 0
        )
        wait_until(
            lambda: [t for t in _dispatched(client, namespace, "rt.later") if t > after + 1],
            30,
            "rt.later runs",
        )
        assert not [t for t in _dispatched(client, namespace, "rt.add") if t > after + 1]
        assert (
            invoke("schedule", "add", "bad", "--task", "ops.add", "--cron", "nope").exit_code == 2
        )
        assert invoke("schedule", "add", "bad", "--task", "ops.add").exit_code == 2
        assert (
            invoke("schedule", "add", "bad", "--task", "x", "--every", "1", "--args", "{").exit_code
            == 2
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        client.close()
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"run-time schedule rt.add added" in err
    assert b"run-time schedule rt.add removed" in err


# -------------------------------------------------------------------- check
def _checks(result: Result) -> dict[str, dict[str, str]]:
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == result.exit_code
    return {c["name"]: c for c in doc["checks"]}


@pytest.mark.timeout(60)
def test_check_exit_codes_and_findings(
    invoke: Callable[..., Result], make_queue: Callable[..., Queue], redis_url: str, namespace: str
) -> None:
    # 0: a reachable server that evicts nothing; warnings for what deserves a look.
    queue = make_queue(name="ops")
    with redis.Redis.from_url(redis_url) as client:
        if client.config_get("maxmemory-policy")["maxmemory-policy"] != "noeviction":
            pytest.skip("the shared server evicts keys")
        for name, task in (("rt.stale", "ops.add"), ("rt.alien", "other.app")):
            added = invoke("schedule", "add", name, "--task", task, "--every", "60")
            assert added.exit_code == 0, added.output
        client.hset("{" + namespace + "}:periodic", "rt.stale", time.time() - 3600)
        with worker_thread(queue, queues=["ops"]):
            wait_until(lambda: queue.stats_sync()["workers"] == 1, 30, "the worker registered")
            before = sorted(client.scan_iter(match="{" + namespace + "}:*"))
            result = invoke("check", APP, "--json")
            after = sorted(client.scan_iter(match="{" + namespace + "}:*"))
        assert after == before  # read-only: no key made
    assert result.exit_code == 0, result.output
    checks = _checks(result)
    assert checks["connectivity"]["status"] == "ok"
    assert checks["server"]["status"] == "ok"
    assert checks["role"] == {"name": "role", "status": "ok", "detail": "master: it accepts writes"}
    assert checks["eviction"]["status"] == "ok"
    assert checks["workers"]["detail"] == "1 live worker(s)"
    assert "queue ops" not in checks  # consumed by the worker
    # Never dispatched, its first run still ahead: nothing to warn about (issue 27).
    assert checks["periodic ops.hourly"]["status"] == "ok", checks["periodic ops.hourly"]
    assert "not dispatched yet, first run" in checks["periodic ops.hourly"]["detail"]
    assert "no scheduler is dispatching it" in checks["periodic rt.stale"]["detail"]
    assert checks["periodic rt.alien"]["status"] == "warn"
    human = invoke("check", APP)
    assert human.exit_code == 0
    assert "WARN  periodic rt.stale" in human.stdout
    assert "  OK  role: master" in human.stdout  # printed when it passes, as every check

    # 1: nothing listens there.
    unreachable = invoke("check", APP, "--json", url=f"redis://127.0.0.1:{free_port()}/0")
    assert unreachable.exit_code == 1
    assert _checks(unreachable)["connectivity"]["status"] == "fail"


@pytest.mark.timeout(60)
def test_check_exits_78_when_the_server_can_evict_keys(
    invoke: Callable[..., Result], namespace: str
) -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary")
    server = SessionRedis(binary)  # --save "" --appendonly no: no persistence
    try:
        assert server.wait_ready()
        # Three messages on a queue no worker consumes.
        producer = Queue(redis_url=server.url, namespace=namespace, name="ops")
        try:
            for i in range(3):
                producer.send_sync("ops.add", (i, 1))
        finally:
            producer.close_sync()
        with redis.Redis.from_url(server.url) as client:
            client.config_set("maxmemory", 64 * 1024 * 1024)
            client.config_set("maxmemory-policy", "allkeys-lru")
            result = invoke("check", APP, "--json", url=server.url)
            assert result.exit_code == 78, result.output
            checks = _checks(result)
            eviction = checks["eviction"]
            assert eviction["status"] == "fail"
            assert "allkeys-lru" in eviction["detail"]
            assert checks["server"]["status"] == "ok"
            assert checks["persistence"] == {
                "name": "persistence",
                "status": "warn",
                "detail": "neither AOF nor RDB snapshots: a server restart loses all work",
            }
            assert checks["workers"]["status"] == "warn"
            assert checks["queue ops"] == {
                "name": "queue ops",
                "status": "warn",
                "detail": "no live worker consumes it (3 waiting)",
            }
            human = invoke("check", APP, url=server.url)
            assert human.exit_code == 78
            assert "FAIL  eviction" in human.stdout
            # Warnings alone do not block: back to noeviction, AOF on, exit code 0.
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("appendonly", "yes")
            result = invoke("check", APP, "--json", url=server.url)
            assert result.exit_code == 0, result.output
            checks = _checks(result)
            assert checks["persistence"]["status"] == "ok"
            assert checks["persistence"]["detail"].startswith("AOF")
            assert checks["queue ops"]["status"] == "warn"
    finally:
        server.stop()


async def test_a_burst_worker_in_fast_mode_returns_once_drained(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue(name="burst", mode="fast")

    @queue.task(name="burst.double")
    async def double(x: int) -> int:
        return 2 * x

    handles = [await double.enqueue(i) for i in range(30)]
    worker = make_worker(queue, queues=["burst"], burst=True, concurrency=5)
    await asyncio.wait_for(worker.run(), 60)  # returns by itself
    assert worker.processed == 30
    assert [await h.result(timeout=5) for h in handles] == [2 * i for i in range(30)]
    assert (await queue.stats(["burst"]))["queues"]["burst"] == {"waiting": 0, "in_flight": 0}
    await queue.close()


@pytest.mark.timeout(90)
def test_dead_letter_lists_carry_a_preview_and_show_the_whole_arguments(
    make_queue: Callable[..., Queue], invoke: Callable[..., Result]
) -> None:
    """A dead letter whose argument is 500 KB: ``dead-letter list --json`` and the
    dashboard's page (both polled) carry the 2048-byte preview, ``dead-letter show --json``
    the whole arguments."""
    from blitzq.dashboard.data import DeadLetterFilter, dead_letters_page

    queue = make_queue(name="dlbig")

    @queue.task(name="dl.big", retries=0)
    async def big(blob: str, tag: str = "t") -> None:
        raise ValueError("no")

    blob = "x" * 500_000
    with worker_thread(queue, queues=["dlbig"]):
        handle = big.enqueue_sync(blob, tag="kept")
        wait_until(lambda: queue.dead_letter_count_sync() == 1, 30, "one dead letter")

    listed = invoke("dead-letter", "list", "--json")
    assert len(listed.stdout) < 8_000, len(listed.stdout)
    (doc,) = json_out(listed)["dead_letters"]
    assert doc["id"] == handle.id
    assert doc["args_truncated"] is True
    assert len(json.dumps([doc["args"], doc["kwargs"]])) <= 2048
    assert doc["args"][0].startswith("xxx")

    shown = json_out(invoke("dead-letter", "show", handle.id, "--json"))
    assert shown["args"] == [blob]
    assert shown["kwargs"] == {"tag": "kept"}

    page = asyncio.run(dead_letters_page(queue, DeadLetterFilter(), 50, 0))
    (item,) = page["items"]
    assert item["args_truncated"] is True
    assert len(json.dumps(item)) < 8_000


@pytest.mark.timeout(90)
def test_control_characters_of_stored_text_are_printed_visible(
    make_queue: Callable[..., Queue], invoke: Callable[..., Result]
) -> None:
    """A task's error holding a NUL, colour and title escape sequences and a bell (echoed
    user input): the human output of ``dead-letter show``, ``dead-letter list`` and ``task
    inspect`` shows each as a visible character (ESC as U+241B), never the raw sequence a
    terminal would act on; ``--json`` keeps the text as it was."""
    queue = make_queue(name="ctl")
    error = "weird \x00 \x1b[31mRED\x1b[0m \x1b]0;pwned-title\x07 \x7f \x9b1m end"

    @queue.task(name="ctl.weird", retries=0)
    async def weird() -> None:
        raise RuntimeError(error)

    with worker_thread(queue, queues=["ctl"]):
        handle = weird.enqueue_sync()
        wait_until(lambda: queue.dead_letter_count_sync() == 1, 30, "one dead letter")
    raw = set("\x00\x1b\x07\x7f\x9b")
    for args in (
        ("dead-letter", "show", handle.id),
        ("dead-letter", "list"),
        ("task", "inspect", handle.id),
    ):
        out = invoke(*args).stdout
        assert not raw & set(out), (args, out)
        assert (
            "\u2400 \u241b[31mRED\u241b[0m \u241b]0;pwned-title\u2407 \u2421 \ufffd1m end" in out
        ), (args, out)
    shown = json_out(invoke("dead-letter", "show", handle.id, "--json"))
    assert error in shown["error"]
