"""Process control of the supervisor: ``--autoscale`` with ``blitzq control scale|status``,
``--max-tasks-per-child``, ``--max-memory-per-child``, ``--reload`` and SIGHUP.

Every supervisor is a real ``python -m blitzq worker …`` subprocess on the test Redis; this
module is also the application its workers import (``--reload`` uses a module written to a
temporary directory instead, which the test edits). Waits are on events (processes seen in
``/proc``, registrations, results), with deadlines; the windows of the autoscaler are made
small through its options.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from blitzq import Queue
from blitzq.cli import cli
from tests.polling import wait_until
from tests.reliability.test_supervisor import ROOT, Supervised, alive, children, registered_pids

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
    pytest.mark.timeout(120),
]

APP = "tests.reliability.test_process_control:queue"
QUEUE_NAME = "pc"
MB = 1024 * 1024

# ------------------------------------------------------------- the application
#: The Queue the supervised workers import; the command line sets URL and namespace. A short
#: visibility timeout refreshes the workers' registrations (their "running") every 0.5 s.
queue = Queue(QUEUE_NAME, visibility_timeout=1.5)
_HELD: list[bytes] = []


def _append(path: str, line: str) -> None:
    with open(path, "a") as f:
        f.write(line)


@queue.task
async def work(path: str, token: str, seconds: float) -> int:
    """Append ``token pid`` to ``path`` (one line per run), sleep, return the pid."""
    _append(path, f"{token} {os.getpid()}\n")
    await asyncio.sleep(seconds)
    return os.getpid()


@queue.task
async def gated(path: str, token: str, gate: str) -> int:
    """Append ``token pid`` to ``path``, wait until the file ``gate`` exists, return the pid."""
    _append(path, f"{token} {os.getpid()}\n")
    while not os.path.exists(gate):  # noqa: ASYNC240 - a test task polling a local file
        await asyncio.sleep(0.05)
    return os.getpid()


@queue.task
def hog(megabytes: int) -> int:
    """Hold ``megabytes`` of touched memory in this process for good; return the pid."""
    _HELD.append(b"\x01" * (megabytes * MB))
    return os.getpid()


@queue.task(executor="process")
def pool_hog(megabytes: int) -> int:
    """``hog`` in a process-pool child."""
    _HELD.append(b"\x01" * (megabytes * MB))
    return os.getpid()


WORK, GATED, HOG, POOL_HOG = (f"{__name__}.{n}" for n in ("work", "gated", "hog", "pool_hog"))


# ------------------------------------------------------------------ fixtures
@pytest.fixture
def start(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Callable[..., Supervised]]:
    """Start ``blitzq worker APP …``; SIGKILL whatever is left at the end."""
    started: list[Supervised] = []

    def run(*extra: str, app: str = APP, cwd: Path = ROOT, typed_ns: bool = True) -> Supervised:
        log = tmp_path / f"supervisor-{len(started)}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
        env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")]
        )
        cmd = [sys.executable, "-m", "blitzq", "worker", app, "--redis-url", redis_url]
        cmd += ["--namespace", namespace] if typed_ns else []
        cmd += ["--shutdown-timeout", "10", *extra]
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
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def producer(make_queue: Callable[..., Queue]) -> Iterator[Queue]:
    """A Queue on the test namespace that sends the app's tasks by name."""
    q = make_queue(name=QUEUE_NAME)
    yield q
    q.close_sync()


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    """A plain sync Redis client."""
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def workers_are(sup: Supervised, client: redis.Redis, namespace: str, n: int) -> list[int]:
    """Wait until exactly ``n`` worker processes run, all registered; return their pids."""

    def ready() -> list[int] | None:
        if sup.proc.poll() is not None:
            raise AssertionError(f"supervisor exited early:\n{sup.output()}")
        pids = sup.workers()
        if len(pids) == n and set(pids) <= registered_pids(client, namespace):
            return pids
        return None

    return wait_until(ready, 40, f"{n} registered workers\n{sup.output()}")  # type: ignore[no-any-return]


def control(redis_url: str, namespace: str, *args: str) -> tuple[int, str]:
    """Run ``blitzq control …``; return (exit code, output)."""
    result = CliRunner().invoke(
        cli, ["--redis-url", redis_url, "--namespace", namespace, "control", *args]
    )
    return result.exit_code, result.output


def control_app(redis_url: str, app: str, *args: str) -> tuple[int, str]:
    """Run ``blitzq control SUBCOMMAND APP …`` with no ``--namespace`` (none in the
    environment either): the namespace is the application's; return (exit code, output)."""
    sub, *rest = args
    result = CliRunner().invoke(
        cli,
        ["--redis-url", redis_url, "control", sub, app, *rest],
        env={"BLITZQ_NAMESPACE": None, "BLITZQ_REDIS_URL": None},
    )
    return result.exit_code, result.output


def runs(path: Path) -> list[tuple[str, int]]:
    """The ``(token, pid)`` lines the ``work`` task wrote."""
    if not path.exists():
        return []
    return [(t, int(p)) for t, p in (line.split() for line in path.read_text().splitlines())]


# --------------------------------------------------------------------- tests
def test_autoscale_adds_processes_under_a_burst_and_removes_idle_ones(
    start: Callable[..., Supervised],
    producer: Queue,
    client: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    sup = start(
        "--autoscale", "1,3", "-c", "2", "--autoscale-interval", "0.2",
        "--autoscale-cooldown", "0.3", "--autoscale-idle", "1", "--autoscale-min-age", "1",
        "--autoscale-backlog", "2",
    )  # fmt: skip
    workers_are(sup, client, namespace, 1)
    path, gate = tmp_path / "runs.txt", tmp_path / "gate"
    # The tasks wait for the gate, so the backlog lasts until the added processes have
    # started and taken tasks, however slowly a busy machine starts them.
    handles = [producer.send_sync(GATED, (str(path), str(i), str(gate))) for i in range(48)]
    added = workers_are(sup, client, namespace, 3)
    wait_until(
        lambda: {pid for _, pid in runs(path)} == set(added), 40, f"3 running\n{sup.output()}"
    )
    gate.touch()
    pids = {h.result_sync(timeout=60) for h in handles}
    assert pids == set(added)  # the added processes took tasks
    # Idle for a second: the added processes are removed (gracefully), down to the minimum.
    wait_until(lambda: len(sup.workers()) == 1, 40, f"back to 1 process\n{sup.output()}")
    tokens = [t for t, _ in runs(path)]
    assert sorted(tokens, key=int) == [str(i) for i in range(48)]  # each ran once
    assert "autoscale: adding worker slot" in sup.output()
    assert "autoscale: removing worker slot" in sup.output()
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(20) == 0, sup.output()


NS_APP_SOURCE = """
import asyncio

from blitzq import Queue

queue = Queue("pcns", namespace={namespace!r}, visibility_timeout=1.5)


@queue.task
async def nap(seconds: float) -> None:
    await asyncio.sleep(seconds)
"""


def test_autoscale_samples_the_namespace_the_app_sets_in_code(
    start: Callable[..., Supervised],
    make_queue: Callable[..., Queue],
    client: redis.Redis,
    namespace: str,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = f"ns_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(NS_APP_SOURCE.format(namespace=namespace))
    sup = start(
        "--autoscale", "1,3", "-c", "2", "--autoscale-interval", "0.2",
        "--autoscale-cooldown", "0.3", "--autoscale-backlog", "2",
        app=f"{module}:queue", cwd=tmp_path, typed_ns=False,
    )  # fmt: skip
    workers_are(sup, client, namespace, 1)
    producer = make_queue(name="pcns")
    try:
        handles = [producer.send_sync(f"{module}.nap", (0.3,)) for _ in range(40)]
        wait_until(lambda: len(sup.workers()) == 3, 40, f"3 processes\n{sup.output()}")
        for h in handles:
            h.result_sync(timeout=60)
    finally:
        producer.close_sync()
    assert "autoscale: adding worker slot" in sup.output()

    # `blitzq control` given the application, no --namespace: it reaches this supervisor.
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    app = f"{module}:queue"
    code, out = control_app(redis_url, app, "scale", "--min", "1", "--max", "1")
    assert code == 0, out
    assert f"setpoint min=1 max=1 (namespace {namespace})" in out
    workers_are(sup, client, namespace, 1)  # the surplus removed

    def status() -> dict | None:
        code, out = control_app(redis_url, app, "status", "--json")
        assert code == 0, out
        doc = json.loads(out)
        sups = doc["supervisors"]
        return doc if sups and sups[0]["processes"] == 1 and sups[0]["max"] == 1 else None

    doc = wait_until(status, 20, "status with 1 process")
    assert doc["namespace"] == namespace
    assert doc["setpoint"] == {"min": 1, "max": 1}
    assert doc["supervisors"][0]["pid"] == sup.proc.pid
    code, out = control_app(redis_url, app, "status")
    assert code == 0, out
    assert f"namespace: {namespace}" in out, out
    assert "setpoint: min=1 max=1" in out, out
    code, out = control_app(redis_url, app, "scale", "--reset")
    assert code == 0, out
    assert f"setpoint removed (namespace {namespace})" in out
    # Without the application (and no --namespace), the default namespace is meant.
    result = CliRunner().invoke(
        cli,
        ["--redis-url", redis_url, "--json", "control", "status"],
        env={"BLITZQ_NAMESPACE": None},
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["namespace"] == "blitzq"
    # An application that does not load is a configuration error (exit code 78), nothing
    # stored.
    code, out = control_app(
        redis_url, "no_such_module_x:queue", "scale", "--min", "2", "--max", "2"
    )
    assert code == 78, out
    assert "no_such_module_x" in out
    assert client.exists("{" + namespace + "}:scale") == 0


def test_process_control_options_are_checked_before_anything_starts(redis_url: str) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["worker", APP, "--autoscale", "5,2", "--redis-url", redis_url])
    assert result.exit_code == 2, result.output
    assert "above the maximum" in result.output
    result = runner.invoke(cli, ["worker", APP, "--autoscale", "1,x", "--redis-url", redis_url])
    assert result.exit_code == 2, result.output
    assert "'1,x'" in result.output
    # The format is checked first, whatever the rest of the command line lacks.
    for bad in ("2", "1,2,3"):
        result = runner.invoke(
            cli, ["worker", APP, "--autoscale", bad], env={"BLITZQ_REDIS_URL": None}
        )
        assert result.exit_code == 2, result.output
        assert "Invalid value for '--autoscale'" in result.output
        assert f"expects MIN,MAX (e.g. 2,8), got {bad!r}" in result.output
        assert "redis-url" not in result.output
    assert "--workers N" in runner.invoke(cli, ["worker", APP, "--autoscale", "2"]).output


def test_autoscale_without_a_shared_server_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The app's own URL (in code) is what the workers use: an in-process one cannot be shared.
    module = f"mem_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        f"from blitzq import Queue\n\nqueue = Queue('m', redis_url='memory://{module}')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(
        cli, ["worker", f"{module}:queue", "--autoscale", "1,2"], env={"BLITZQ_REDIS_URL": None}
    )
    assert result.exit_code == 2, result.output
    assert "--autoscale needs a Redis server its workers share" in result.output
    assert f"memory://{module}" in result.output


def test_control_starts_no_embedded_server(tmp_path: Path) -> None:
    data_dir = tmp_path / "none"
    env = {"BLITZQ_REDIS_URL": None, "BLITZQ_NAMESPACE": None, "BLITZQ_DATA_DIR": str(data_dir)}
    for args in (["status"], ["status", APP], ["scale", APP, "--min", "1", "--max", "2"]):
        result = CliRunner().invoke(cli, ["control", *args], env=env)
        assert result.exit_code == 1, result.output
        assert "embedded server" in result.output, result.output
    assert not data_dir.exists()


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--max-tasks-per-child", "3"], "--max-tasks-per-child"),
        (["--max-memory-per-child", "100"], "--max-memory-per-child"),
        (["--workers", "2"], "--workers 2"),
        (["--autoscale", "1,2"], "--autoscale"),
        (["--workers", "2", "--max-tasks-per-child", "3"], "--workers 2, --max-tasks-per-child"),
    ],
)
def test_burst_names_the_options_it_conflicts_with(
    redis_url: str, extra: list[str], named: str
) -> None:
    result = CliRunner().invoke(cli, ["--redis-url", redis_url, "worker", APP, "--burst", *extra])
    assert result.exit_code == 2, result.output
    assert f"--burst runs one worker process: not with {named}" in result.output
    if "--workers" not in extra:
        assert "--workers" not in result.output


def test_control_scale_is_applied_read_back_and_refused_out_of_range(
    start: Callable[..., Supervised], client: redis.Redis, namespace: str, redis_url: str
) -> None:
    sup = start("--autoscale", "1,2", "-c", "2", "--autoscale-interval", "0.2")
    workers_are(sup, client, namespace, 1)

    for args, reason in (
        (("--min", "0", "--max", "2"), "at least 1"),
        (("--min", "3", "--max", "2"), "above the maximum"),
        (("--min", "1", "--max", "1000"), "hard cap"),
    ):
        code, out = control(redis_url, namespace, "scale", *args)
        assert code == 2, out
        assert reason in out, out
    code, out = control(redis_url, namespace, "scale", "--min", "3", "--max", "3")
    assert code == 0, out
    workers_are(sup, client, namespace, 3)

    def status() -> dict | None:
        code, out = control(redis_url, namespace, "--json", "status")
        assert code == 0, out
        doc = json.loads(out)
        sups = doc["supervisors"]
        return doc if sups and sups[0]["processes"] == 3 and sups[0]["min"] == 3 else None

    doc = wait_until(status, 20, "status with 3 processes")
    assert doc["setpoint"] == {"min": 3, "max": 3}
    assert doc["supervisors"][0]["pid"] == sup.proc.pid
    code, out = control(redis_url, namespace, "status")
    assert code == 0, out
    assert "setpoint: min=3 max=3" in out, out
    # Lowering the maximum removes the surplus at once (gracefully).
    assert control(redis_url, namespace, "scale", "--min", "1", "--max", "1")[0] == 0
    workers_are(sup, client, namespace, 1)
    assert control(redis_url, namespace, "scale", "--reset")[0] == 0
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(20) == 0, sup.output()
    # The stopped supervisor removed its status.
    _, out = control(redis_url, namespace, "--json", "status")
    assert json.loads(out) == {
        "namespace": namespace,
        "group": None,
        "setpoint": None,
        "supervisors": [],
    }


def test_max_tasks_per_child_recycles_without_losing_or_repeating_a_task(
    start: Callable[..., Supervised],
    producer: Queue,
    client: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    # Concurrency far above the limit: a fetch batch brings more than 5 deliveries, and
    # the ones past the 5th start must be handed back, not run.
    sup = start("--max-tasks-per-child", "5", "-c", "20")
    workers_are(sup, client, namespace, 1)
    path = tmp_path / "runs.txt"
    handles = [producer.send_sync(WORK, (str(path), str(i), 0.2)) for i in range(40)]
    pids = [h.result_sync(timeout=80) for h in handles]
    lines = runs(path)
    assert sorted(t for t, _ in lines) == sorted(str(i) for i in range(40))  # each ran once
    per_pid = {pid: sum(1 for _, p in lines if p == pid) for pid in set(pids)}
    assert sorted(per_pid.values()) == [5] * 8, per_pid  # exactly 5 starts per process
    assert "planned restart" in sup.output()


def test_max_tasks_per_child_recycles_process_pool_children(
    start: Callable[..., Supervised], producer: Queue, client: redis.Redis, namespace: str
) -> None:
    # One task at a time, each in a process-pool child: no child (and no worker) serves
    # more than 2 calls, and every call is answered.
    sup = start("--max-tasks-per-child", "2", "-c", "1")
    workers_are(sup, client, namespace, 1)
    pool_pids = [producer.send_sync(POOL_HOG, (0,)).result_sync(timeout=60) for _ in range(6)]
    per_child = {pid: pool_pids.count(pid) for pid in pool_pids}
    assert len(per_child) >= 3, per_child
    assert max(per_child.values()) <= 2, per_child
    assert "planned restart" in sup.output()


def test_max_memory_per_child_recycles_the_worker_and_the_pool(
    start: Callable[..., Supervised], producer: Queue, client: redis.Redis, namespace: str
) -> None:
    sup = start("--max-memory-per-child", "200", "-c", "2")
    (worker,) = workers_are(sup, client, namespace, 1)
    # A pool child past the limit: the pool is replaced, the child exits once idle.
    child = producer.send_sync(POOL_HOG, (260,)).result_sync(timeout=60)
    assert child != worker
    wait_until(lambda: not alive(child), 30, f"pool child {child} gone\n{sup.output()}")
    assert sup.workers() == [worker]  # the worker itself stays
    # The worker past the limit: recycled (a new process), a planned restart.
    assert producer.send_sync(HOG, (260,)).result_sync(timeout=60) == worker
    wait_until(lambda: sup.workers() not in ([], [worker]), 30, f"a new worker\n{sup.output()}")
    assert "max-memory-per-child" in sup.output()
    assert "planned restart" in sup.output()


APP_SOURCE = """
import os

from blitzq import Queue

queue = Queue("reload", visibility_timeout=1.5)


@queue.task
async def version() -> list:
    return [{value!r}, os.getpid()]
"""


def test_reload_after_a_source_edit_runs_the_new_code(
    start: Callable[..., Supervised],
    make_queue: Callable[..., Queue],
    client: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    pytest.importorskip("watchfiles")
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    module = f"reload_app_{uuid.uuid4().hex[:8]}"
    source = app_dir / f"{module}.py"
    source.write_text(APP_SOURCE.format(value="first"))
    sup = start("--reload", "-c", "2", app=f"{module}:queue", cwd=app_dir)
    (old,) = workers_are(sup, client, namespace, 1)
    producer = make_queue(name="reload")
    try:
        assert producer.send_sync(f"{module}.version").result_sync(timeout=30) == ["first", old]
        source.write_text(APP_SOURCE.format(value="second, edited"))
        wait_until(
            lambda: (
                (p := sup.workers())
                and old not in p
                and old not in registered_pids(client, namespace)
            ),
            40,
            f"a new worker, the old one gone\n{sup.output()}",
        )
        (new,) = workers_are(sup, client, namespace, 1)
        answer = producer.send_sync(f"{module}.version").result_sync(timeout=30)
        assert answer == ["second, edited", new]  # a new process serves, with the new code
        assert new != old
        assert "reloading every worker (changed:" in sup.output()
    finally:
        producer.close_sync()


def test_sighup_reloads_every_worker_and_the_running_task_finishes_once(
    start: Callable[..., Supervised],
    producer: Queue,
    client: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    sup = start("--workers", "2", "-c", "2")
    old = set(workers_are(sup, client, namespace, 2))
    path = tmp_path / "runs.txt"
    running = producer.send_sync(WORK, (str(path), "long", 2.0))
    wait_until(lambda: runs(path), 30, "the task started")
    sup.proc.send_signal(signal.SIGHUP)
    new = wait_until(
        lambda: (p := set(sup.workers())) and len(p - old) == 2 and p - old,
        40,
        f"two new workers\n{sup.output()}",
    )
    assert running.result_sync(timeout=30) in old  # finished by the worker it started in
    assert [t for t, _ in runs(path)] == ["long"]  # ran once
    for pid in old:
        wait_until(lambda pid=pid: not alive(pid), 30, f"old worker {pid} gone")
    answer = producer.send_sync(WORK, (str(path), "after", 0.0)).result_sync(timeout=30)
    assert answer in new
    assert sup.proc.poll() is None
