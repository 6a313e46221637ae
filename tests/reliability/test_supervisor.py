"""``blitzq worker MODULE:ATTR --workers N``: the supervisor of worker processes.

The supervisor runs as a real subprocess (``python -m blitzq worker
tests.reliability.test_supervisor:queue --workers 2``) against the test Redis; this module is
also the application the workers import. Process trees are read from ``/proc``; a zombie
(state ``Z``) counts as dead, because PID 1 of a container may never reap orphans.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from blitzq import Queue, TaskFailed
from blitzq.serialization import loads
from blitzq.supervisor import RestartBudget
from blitzq.worker import executors
from tests.polling import wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.reliability.test_supervisor:queue"
QUEUE_NAME = "sup"

# ------------------------------------------------------------- the application
#: The Queue the supervised workers import; the command line sets URL and namespace.
queue = Queue(QUEUE_NAME, visibility_timeout=1.5)


@queue.task
async def whoami(delay: float) -> int:
    """Return the worker's pid after ``delay`` seconds."""
    await asyncio.sleep(delay)
    return os.getpid()


@queue.task(executor="process")
def hold_in_pool(path: str, seconds: float) -> int:
    """Write this pool process's pid to ``path``, then block for ``seconds``."""
    Path(path).write_text(str(os.getpid()))
    time.sleep(seconds)
    return os.getpid()


@queue.task(executor="thread", timeout=0.5, retries=0, dead_letter=False)
def hang(seconds: float) -> None:
    """Block a worker thread well past the task's hard timeout (its thread is abandoned)."""
    time.sleep(seconds)


def _enter(directory: str) -> Path:
    """Count this task body as running in this process: a file ``<pid>-<random>.run`` in
    ``directory``; then append to ``peaks`` how many such files of this pid exist (the
    bodies of this process running at once, this one included)."""
    here = Path(directory)
    me = here / f"{os.getpid()}-{os.urandom(6).hex()}.run"
    me.touch()
    now = len(list(here.glob(f"{os.getpid()}-*.run")))
    with open(here / "peaks", "a") as f:
        f.write(f"{os.getpid()} {now}\n")
    return me


@queue.task(executor="thread", timeout=0.5, retries=0, dead_letter=False)
def gated_hang(directory: str) -> None:
    """A counted body that blocks past its hard timeout until the test creates
    ``directory/release`` (or its worker process is replaced, which kills it)."""
    me = _enter(directory)
    release = Path(directory) / "release"
    deadline = time.monotonic() + 120
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    me.unlink()


@queue.task(executor="thread")
def gated_quick(directory: str, i: int) -> int:
    """A counted body that returns ``i`` at once."""
    _enter(directory).unlink()
    return i


WHOAMI = f"{__name__}.whoami"
HOLD = f"{__name__}.hold_in_pool"
HANG = f"{__name__}.hang"
GATED_HANG = f"{__name__}.gated_hang"
GATED_QUICK = f"{__name__}.gated_quick"


# ------------------------------------------------------------------ helpers
def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid`` from /proc, or None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def children(pid: int) -> list[int]:
    """Live (non-zombie) children of ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[1] == pid and stat[0] != "Z":
                found.append(int(entry))
    return sorted(found)


def cmdline(pid: int) -> str:
    """The command line of ``pid`` (empty when gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class Supervised:
    """A ``blitzq worker --workers N`` subprocess and what it started."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log
        self.seen: set[int] = set()

    def workers(self) -> list[int]:
        """Pids of the live worker processes (the supervisor's children except the guard)."""
        pids = [p for p in children(self.proc.pid) if "blitzq.supervisor" not in cmdline(p)]
        self.seen.update(pids)
        return pids

    def guard(self) -> int | None:
        """Pid of the guard process, if it runs."""
        for p in children(self.proc.pid):
            if "blitzq.supervisor" in cmdline(p):
                self.seen.add(p)
                return p
        return None

    def output(self) -> str:
        """The supervisor's and workers' combined output."""
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
def supervise(
    redis_url: str, namespace: str, tmp_path: Path
) -> Iterator[Callable[..., Supervised]]:
    """Start ``blitzq worker … --workers N``; SIGKILL whatever is left at the end."""
    started: list[Supervised] = []

    def start(*extra: str, workers: int = 2, app: str = APP) -> Supervised:
        log = tmp_path / f"supervisor-{len(started)}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [sys.executable, "-m", "blitzq", "worker", app, "--workers", str(workers)]
        cmd += ["--redis-url", redis_url, "--namespace", namespace, "-c", "4"]
        cmd += ["--shutdown-timeout", "2", *extra]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        sup = Supervised(proc, log)
        started.append(sup)
        return sup

    yield start
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


def registered_pids(client: redis.Redis, namespace: str) -> set[int]:
    """Pids of the workers registered in the namespace (ids are ``host:pid:random``)."""
    return {int(k.decode().split(":")[-2]) for k in client.hkeys("{" + namespace + "}:workers")}


def wait_ready(sup: Supervised, client: redis.Redis, namespace: str, n: int = 2) -> list[int]:
    """Wait until ``n`` workers run and have registered; return their pids."""

    def ready() -> list[int] | None:
        if sup.proc.poll() is not None:
            raise AssertionError(f"supervisor exited early:\n{sup.output()}")
        pids = sup.workers()
        if len(pids) == n and set(pids) <= registered_pids(client, namespace):
            return pids
        return None

    return wait_until(ready, 30, f"{n} registered workers\n{sup.output()}")  # type: ignore[no-any-return]


def pids_answering(producer: Queue, wanted: set[int], timeout: float = 20.0) -> set[int]:
    """Send ``whoami`` batches until every pid in ``wanted`` has answered one; return all pids."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while not wanted <= seen:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {seen} answered, wanted {wanted}")
        handles = [producer.send_sync(WHOAMI, (0.1,)) for _ in range(8)]
        seen.update(h.result_sync(timeout=10) for h in handles)
    return seen


def pool_pid(path: Path) -> int:
    """Wait for ``hold_in_pool`` to write its pid to ``path``; return it."""
    return int(wait_until(lambda: path.exists() and path.read_text(), 20, "the pool task"))


# --------------------------------------------------------------------- tests
def test_workers_share_the_work_and_stop_on_sigterm(
    supervise: Callable[..., Supervised], producer: Queue, client: redis.Redis, namespace: str
) -> None:
    sup = supervise()
    workers = wait_ready(sup, client, namespace)
    guard = sup.guard()
    assert guard is not None

    assert pids_answering(producer, set(workers)) == set(workers)
    # Each worker leads its own process group (so its pool children can be killed with it).
    assert all(os.getpgid(pid) == pid for pid in workers)

    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(15) == 0, sup.output()
    for pid in [*workers, guard]:
        wait_until(lambda pid=pid: not alive(pid), 30.0, f"pid {pid} gone")
    # A graceful stop unregisters every worker.
    assert registered_pids(client, namespace).isdisjoint(workers)


def test_killed_worker_is_restarted_and_its_pool_child_dies(
    supervise: Callable[..., Supervised],
    producer: Queue,
    client: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    sup = supervise()
    workers = wait_ready(sup, client, namespace)
    marker = tmp_path / "pool.pid"
    producer.send_sync(HOLD, (str(marker), 60.0))
    pool = pool_pid(marker)
    sup.seen.add(pool)
    stat = _stat(pool)
    assert stat is not None
    victim = stat[1]  # the worker whose process pool runs the task
    assert victim in workers
    assert os.getpgid(pool) == victim

    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not alive(pool), 30.0, "the killed worker's pool process to die")

    def replaced() -> list[int] | None:
        pids = sup.workers()
        return pids if len(pids) == 2 and victim not in pids else None

    now = wait_until(replaced, 15, f"a restarted worker\n{sup.output()}")
    (new,) = set(now) - set(workers)
    wait_ready(sup, client, namespace)
    # Processing goes on, on both the surviving and the restarted worker.
    assert new in pids_answering(producer, {new})
    assert sup.proc.poll() is None


def test_sigkilled_supervisor_leaves_no_process(
    supervise: Callable[..., Supervised],
    producer: Queue,
    client: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    sup = supervise()
    workers = wait_ready(sup, client, namespace)
    guard = sup.guard()
    assert guard is not None
    marker = tmp_path / "pool.pid"
    producer.send_sync(HOLD, (str(marker), 60.0))
    pool = pool_pid(marker)
    sup.seen.add(pool)

    sup.proc.kill()
    sup.proc.wait(5)
    for pid in [*workers, pool, guard]:
        wait_until(lambda pid=pid: not alive(pid), 30.0, f"pid {pid} ({cmdline(pid)!r}) gone")


def test_configuration_error_is_not_restarted(
    supervise: Callable[..., Supervised], client: redis.Redis, namespace: str
) -> None:
    sup = supervise(app="tests.reliability.no_such_module:queue")
    assert sup.proc.wait(20) == 78, sup.output()
    out = sup.output()
    assert out.count("not restarting it") == 2, out
    assert "restarting worker slot" not in out


def test_crashing_slot_gives_up_after_its_restart_budget(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "from blitzq.supervisor import Supervisor\n"
        "cmd = [sys.executable, '-c', 'raise SystemExit(3)']\n"
        "sys.exit(Supervisor(cmd, 2, max_restarts=3, backoff=0.01, max_backoff=0.02).run())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr
    # 2 slots x (1 start + 3 restarts) exits, then each slot gives up.
    assert proc.stderr.count("exited with code 3") == 8, proc.stderr
    assert proc.stderr.count("giving up on it") == 2, proc.stderr
    assert "every worker slot gave up" in proc.stderr


def test_restart_budget_backs_off_and_is_spent_within_its_window() -> None:
    now = [0.0]
    budget = RestartBudget(
        limit=3, window=60.0, base_delay=0.5, max_delay=1.5, clock=lambda: now[0]
    )
    assert [budget.next_delay() for _ in range(3)] == [0.5, 1.0, 1.5]
    assert budget.next_delay() is None
    now[0] = 61.0  # the window slid past every restart
    assert budget.next_delay() == 0.5


_POOL_DIES_WITH_WORKER = "die_with_parent" in inspect.getsource(executors)


@pytest.mark.skipif(
    not _POOL_DIES_WITH_WORKER,
    reason="pool processes get PR_SET_PDEATHSIG only with the executors.py initializer",
)
def test_sigkilled_single_worker_takes_its_pool_child_along(
    redis_url: str, namespace: str, producer: Queue, client: redis.Redis, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    cmd = [sys.executable, "-m", "blitzq", "worker", APP, "--redis-url", redis_url]
    cmd += ["--namespace", namespace, "--no-supervise"]  # this process is the worker
    worker = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    pool = None
    try:
        wait_until(lambda: worker.pid in registered_pids(client, namespace), 30, "the worker")
        marker = tmp_path / "pool.pid"
        producer.send_sync(HOLD, (str(marker), 60.0))
        pool = pool_pid(marker)
        worker.kill()
        worker.wait(5)
        wait_until(lambda: not alive(pool), 30.0, "the pool process to die with its worker")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(5)
        if pool is not None and alive(pool):
            os.kill(pool, signal.SIGKILL)


# ------------------------------------------------------------ planned restarts (exit 75)
def test_planned_restarts_do_not_spend_the_restart_budget(tmp_path: Path) -> None:
    """Exit 75 (EXIT_RESTART) is a planned restart: it never makes a slot give up, and a
    slot restarts at most about once per PLANNED_RESTART_INTERVAL (1 s)."""
    script = (
        "import sys\n"
        "from blitzq.supervisor import Supervisor\n"
        "cmd = [sys.executable, '-c', 'raise SystemExit(75)']\n"
        "sys.exit(Supervisor(cmd, 2, max_restarts=2, backoff=0.01, max_backoff=0.02).run())\n"
    )
    log = tmp_path / "sup.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path, stderr=out)
    started = time.monotonic()
    try:
        # 2 slots x 4 planned restarts: far past max_restarts=2 of a crashing slot.
        wait_until(
            lambda: log.read_text().count("planned restart") >= 8 or proc.poll() is not None,
            60,
            "8 planned restarts",
        )
        elapsed = time.monotonic() - started
        assert proc.poll() is None, log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = log.read_text()
    assert "giving up" not in out, out
    assert "not counted as a crash" in out
    assert "asked to be restarted (code 75)" in out
    # No hot spin: each slot starts at most once per second (a generous bound).
    per_slot = max(out.count(f"worker slot {i} (pid") for i in (0, 1))
    assert per_slot <= elapsed + 2, (per_slot, elapsed, out)


def test_abandoned_thread_restarts_never_stop_the_supervisor(
    supervise: Callable[..., Supervised], producer: Queue, client: redis.Redis, namespace: str
) -> None:
    """The fresh-user repro (poison_sup.sh): hung sync tasks with --max-abandoned-threads 0
    make every worker exit 75 again and again; the supervisor goes on (more than the 5
    restarts in 60 s a crashing slot gets) and keeps serving other tasks."""
    sup = supervise("--max-abandoned-threads", "0", "-c", "1")
    wait_ready(sup, client, namespace)
    for _ in range(14):
        producer.send_sync(HANG, (15.0,))

    def restarts() -> int:
        if sup.proc.poll() is not None:
            raise AssertionError(f"supervisor exited:\n{sup.output()}")
        return sup.log.read_text(errors="replace").count("planned restart")

    wait_until(lambda: restarts() >= 12, 100, f"12 planned restarts\n{sup.output()}")
    out = sup.log.read_text(errors="replace")
    assert "giving up" not in out, out[-4000:]
    assert sup.proc.poll() is None
    # Still serving: the hung tasks are done with, whoami runs on a live worker.
    handle = producer.send_sync(WHOAMI, (0.0,))
    assert handle.result_sync(timeout=60) in set(sup.workers()) | sup.seen
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.output()


def test_hung_threads_holding_every_slot_get_their_worker_replaced(
    supervise: Callable[..., Supervised],
    producer: Queue,
    client: redis.Redis,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Issue 28, item 12: ``-c 4`` workers and sync tasks that block past their hard timeout.
    A hung thread keeps its slot, so no worker process ever runs more than 4 task bodies at
    once (counted with files per pid); once hung threads hold all 4 slots of a worker (far
    below ``--max-abandoned-threads`` 10) it exits 75 and the supervisor replaces it, which
    kills them; every task behind them completes, and the hung ones failed at their
    timeout."""
    bodies = tmp_path / "bodies"
    bodies.mkdir()
    sup = supervise("-c", "4")
    wait_ready(sup, client, namespace)
    hung = [producer.send_sync(GATED_HANG, (str(bodies),)) for _ in range(8)]
    quick = [producer.send_sync(GATED_QUICK, (str(bodies), i)) for i in range(12)]
    try:
        assert [h.result_sync(timeout=90) for h in quick] == list(range(12)), sup.output()
        for h in hung:
            with pytest.raises(TaskFailed) as info:
                h.result_sync(timeout=30)
            assert info.value.error_type is not None
            assert info.value.error_type.endswith("TaskTimeout")
        peaks: dict[str, int] = {}
        for line in (bodies / "peaks").read_text().splitlines():
            pid, now = line.split()
            peaks[pid] = max(peaks.get(pid, 0), int(now))
        assert max(peaks.values()) <= 4, f"bodies at once per worker pid: {peaks}"
        wait_until(
            lambda: "planned restart" in sup.log.read_text(errors="replace"),
            60,
            f"a planned restart\n{sup.output()}",
        )
        out = sup.log.read_text(errors="replace")
        assert "slots held by runs abandoned at their hard timeout" in out, out[-4000:]
        assert "giving up" not in out, out[-4000:]
    finally:
        (bodies / "release").touch()
    assert sup.proc.poll() is None, sup.output()
    sup.proc.send_signal(signal.SIGTERM)
    assert sup.proc.wait(30) == 0, sup.output()


def test_strict_memory_policy_refusal_is_a_configuration_error_not_restarted(
    supervise: Callable[..., Supervised], private_redis: Any
) -> None:
    """A worker refusing an evicting maxmemory-policy (--strict-memory-policy) exits 78, so
    the supervisor does not restart it in a loop; it exits 78 once every slot refused."""
    with redis.Redis.from_url(private_redis.url) as c:  # this test's own server
        c.config_set("maxmemory", "40mb")
        c.config_set("maxmemory-policy", "allkeys-lru")
    sup = supervise("--strict-memory-policy", "--redis-url", private_redis.url)
    assert sup.proc.wait(60) == 78, sup.output()
    out = sup.output()
    assert out.count("not restarting it") == 2, out
    assert "restarting worker slot" not in out
    assert "allkeys-lru" in out


def registrations(client: redis.Redis, namespace: str) -> dict[int, dict[str, Any]]:
    """The live workers' registrations, by pid."""
    out = {}
    for raw in client.hvals("{" + namespace + "}:workers"):
        info = loads(raw)
        out[info["pid"]] = info
    return out


def test_a_restarted_slot_keeps_its_worker_id_with_a_new_instance(
    supervise: Callable[..., Supervised], producer: Queue, client: redis.Redis, namespace: str
) -> None:
    """The worker id is ``host:supervisor-slot``, the same across the slot's restarts
    (metrics, logs and records keep continuity); the process instance (``pid:random``) and the
    registry key (unique per live process, the stream consumer name) change."""
    sup = supervise(workers=1)
    (first,) = wait_ready(sup, client, namespace, n=1)
    before = registrations(client, namespace)[first]
    assert before["id"] == f"{socket.gethostname()}:{sup.proc.pid}-0"
    assert before["slot"] == 0
    assert before["instance"].startswith(f"{first}:")
    assert before["key"] == f"{before['id']}:{before['instance']}"
    record = producer.send_sync(WHOAMI, (0.0,))
    assert record.result_sync(timeout=30) == first
    status = record.status_sync()
    assert status is not None
    assert status.worker == before["id"]

    os.kill(first, signal.SIGKILL)

    def restarted() -> list[int] | None:
        pids = sup.workers()
        return pids if len(pids) == 1 and first not in pids else None

    (second,) = wait_until(restarted, 30.0, f"the slot restarted\n{sup.output()}")
    wait_ready(sup, client, namespace, n=1)
    after = registrations(client, namespace)[second]
    assert after["id"] == before["id"]
    assert after["instance"] != before["instance"]
    assert after["instance"].startswith(f"{second}:")
    assert after["key"] != before["key"]
    again = producer.send_sync(WHOAMI, (0.0,))
    assert again.result_sync(timeout=30) == second
    status = again.status_sync()
    assert status is not None
    assert status.worker == before["id"]


def test_two_supervisors_on_one_host_give_their_workers_distinct_ids(
    supervise: Callable[..., Supervised], producer: Queue, client: redis.Redis, namespace: str
) -> None:
    """Two ``blitzq worker`` supervisors on one host both have a slot 0 and 1: each worker id
    carries its supervisor's pid (``host:pid-slot``), so the registrations, the records'
    ``worker`` and anything keyed by worker id tell the four workers apart."""
    host = socket.gethostname()
    one, two = supervise(workers=2), supervise(workers=2)
    pids = wait_ready(one, client, namespace, n=2) + wait_ready(two, client, namespace, n=2)
    wait_until(lambda: set(pids) <= registered_pids(client, namespace), 30, "4 registrations")
    found = registrations(client, namespace)
    ids = {found[pid]["id"] for pid in pids}
    assert ids == {f"{host}:{sup.proc.pid}-{slot}" for sup in (one, two) for slot in (0, 1)}
    assert {found[pid]["slot"] for pid in pids} == {0, 1}
    by_pid = {pid: found[pid]["id"] for pid in pids}
    seen: dict[int, str] = {}
    deadline = time.monotonic() + 30
    while set(seen) != set(pids) and time.monotonic() < deadline:
        handles = [producer.send_sync(WHOAMI, (0.05,)) for _ in range(16)]
        for handle in handles:
            pid = handle.result_sync(timeout=10)
            status = handle.status_sync()
            assert status is not None
            seen[pid] = status.worker
    assert seen == by_pid
