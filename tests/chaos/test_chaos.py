"""The chaos suite: faults injected under load, then DESIGN.md §5's invariants checked.

Three scenarios, each on a private AOF-persisted server (see ``conftest.py``), with real
worker and scheduler subprocesses running ``chaos_app``:

- ``network``: three workers, each through its own TCP fault proxy; one worker at a time gets
  added latency, its connections cut, half-opened (left open and silent for good) or
  partitioned for longer than the visibility timeout, then healed.
- ``kills``: three workers and three schedulers (a periodic entry ``Every(1)``); at random
  moments one of them is SIGKILLed and replaced (20 cycles, 100 in the long form).
- ``redis_restart``: the server is SIGKILLed and restarted from its AOF while workers are busy.

Tasks (plain ones and chords) are enqueued throughout. After each scenario every task must be
final and succeeded, a task may have run more than once only if it was in flight at a fault,
each periodic occurrence was dispatched once, each chord's callback ran once (beyond faults)
with all results, and no record is left running. The figures (tasks, faults, duplicates) are
printed at the end of the session under "chaos figures".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import TaskRecord, chord
from blitzq.workflow import WorkflowHandle

from .chaos_app import JOIN, MEMBER, TICK_EVERY, WORK, build_queue
from .conftest import FIGURES, ChaosSettings, Cluster, Proc, record_figures, wait_until
from .invariants import (
    Fault,
    Figures,
    check_concurrency,
    check_duplicates,
    check_periodic,
    parse_executions,
)

pytestmark = pytest.mark.chaos

#: Seconds around a fault within which an execution counts as in flight at it: a completion
#: being written just after the body returned, a reply held back by a partition.
SLACK = 5.0
#: Members of each chord.
CHORD_SIZE = 4


class Run:
    """What one scenario enqueued and injected, and the checks at its end.

    Args:
        cluster: the scenario's processes.
        chaos: the session's settings.
        scenario: name (also seeds the random generator).
    """

    def __init__(self, cluster: Cluster, chaos: ChaosSettings, scenario: str) -> None:
        self.cluster = cluster
        self.chaos = chaos
        self.rng, seed = chaos.rng(scenario)
        self.figures = Figures(scenario, chaos.seed)
        self.faults: list[Fault] = []
        self.labels: list[str] = []
        self.chords: dict[str, WorkflowHandle] = {}
        self.queue, _ = build_queue(
            cluster.server.url,
            cluster.namespace,
            cluster.server.url,
            cluster.visibility_timeout,
        )
        self.started = time.monotonic()
        print(f"chaos {scenario}: random seed {seed} (BLITZQ_CHAOS_SEED={chaos.seed} replays it)")

    def context(self) -> str:
        """Seed and scenario, for failure messages."""
        return f"[{self.figures.scenario}, BLITZQ_CHAOS_SEED={self.chaos.seed}]"

    def enqueue(self, count: int, seconds: float | None = None) -> None:
        """Enqueue ``count`` work tasks (of ``seconds``, default random 10-300 ms), their
        labels as task ids."""
        calls: list[Any] = []
        for _ in range(count):
            label = f"w{len(self.labels)}"
            self.labels.append(label)
            length = seconds if seconds is not None else round(self.rng.uniform(0.01, 0.3), 3)
            calls.append(((label, length), {}, {"task_id": label}))
        self.queue.tasks[WORK].enqueue_many_sync(calls)

    def chord(self) -> None:
        """Apply one chord of CHORD_SIZE members and a callback."""
        chord_id = f"c{len(self.chords)}"
        members = [
            self.queue.sig(MEMBER, chord_id, i, round(self.rng.uniform(0.05, 0.3), 3))
            for i in range(CHORD_SIZE)
        ]
        self.chords[chord_id] = self.queue.apply_sync(
            chord(members, self.queue.sig(JOIN, chord_id))
        )

    def probe_liveness(self, procs: list[Proc], timeout: float) -> None:
        """Enqueue rounds of short tasks until each of ``procs`` has started one.

        Raises:
            AssertionError: some worker started none within ``timeout`` seconds (it is stuck).
        """
        since = time.time()
        waiting = {p.pid for p in procs}
        deadline = time.monotonic() + timeout
        while waiting:
            assert time.monotonic() < deadline, (
                f"{self.context()} worker(s) {sorted(waiting)} took no task for {timeout} s "
                f"after the faults"
            )
            self.enqueue(4 * len(procs), seconds=0.5)
            round_end = time.monotonic() + 5.0
            while waiting and time.monotonic() < round_end:
                executions = parse_executions(self.cluster.redis.hgetall(self.cluster.key("exec")))
                waiting -= {e.pid for e in executions if e.start >= since}
                time.sleep(0.2)

    def fault(self, kind: str, pids: set[int] | None, start: float, end: float) -> None:
        """Record one injected fault."""
        self.faults.append(Fault(kind, None if pids is None else frozenset(pids), start, end))
        self.figures.faults[kind] += 1

    # ------------------------------------------------------------------ checks
    def records(self) -> dict[str, TaskRecord | None]:
        """Every task record of the namespace, by task id (``None``: undecodable)."""
        r = self.cluster.redis
        prefix = "{" + self.cluster.namespace + "}:t:"
        names = [k.decode() for k in r.scan_iter(match=prefix + "*", count=1000)]
        found: dict[str, TaskRecord | None] = {}
        for i in range(0, len(names), 500):
            chunk = names[i : i + 500]
            for name, raw in zip(chunk, r.mget(chunk), strict=True):
                if raw is None:
                    continue
                try:
                    found[name[len(prefix) :]] = TaskRecord.from_bytes(raw)
                except Exception:
                    found[name[len(prefix) :]] = None
        return found

    def settle(self, timeout: float) -> None:
        """Wait until every task and chord finished and the stream is empty.

        Raises:
            AssertionError: something was still unfinished after ``timeout`` seconds.
        """
        r = self.cluster.redis
        prefix = "{" + self.cluster.namespace + "}:t:"

        def unfinished() -> list[str]:
            left = []
            for i in range(0, len(self.labels), 500):
                chunk = self.labels[i : i + 500]
                for label, raw in zip(chunk, r.mget([prefix + x for x in chunk]), strict=True):
                    if raw is None or not TaskRecord.from_bytes(raw).state.is_final:
                        left.append(label)
            return left

        left: list[str] = []

        def done() -> bool:
            nonlocal left
            left = unfinished()
            return not left

        try:
            wait_until(done, timeout, "every task final", interval=0.5)
        except AssertionError:
            raise AssertionError(
                f"{self.context()} {len(left)} task(s) never reached a final state: "
                f"{left[:20]}; live processes: "
                f"{[(p.role, p.pid) for p in self.cluster.procs if p.alive()]}"
            ) from None
        deadline = time.monotonic() + timeout
        for chord_id, handle in self.chords.items():
            remaining = max(1.0, deadline - time.monotonic())
            got = handle.get_sync(timeout=remaining)
            assert got == list(range(CHORD_SIZE)), f"{self.context()} chord {chord_id}: {got}"
        stream = "{" + self.cluster.namespace + "}:s:default"
        wait_until(lambda: r.xlen(stream) == 0, timeout, "an empty stream")

    def check(self, periodic: bool = False) -> None:
        """Check the invariants, record and print the figures; fail on any violation."""
        r = self.cluster.redis
        executions = parse_executions(r.hgetall(self.cluster.key("exec")))
        problems: list[str] = []
        # Nothing lost: every task succeeded and ran to its end at least once.
        records = self.records()
        finished = {(e.kind, e.item) for e in executions if e.end is not None}
        for label in self.labels:
            record = records.get(label)
            if record is None or record.state.value != "succeeded":
                problems.append(f"task {label}: record {record and record.state.value}")
            if ("work", label) not in finished:
                problems.append(f"task {label}: no execution ran to its end")
        # No record left running (or queued, retrying ...): every record is final.
        stuck = [
            f"{tid}: {rec.state.value if rec else 'undecodable'}"
            for tid, rec in records.items()
            if rec is None or not rec.state.is_final
        ]
        problems += [f"record not final: {s}" for s in stuck[:20]]
        # Chord callbacks: each ran, with every member's result in order.
        joined = {k.decode(): v.decode() for k, v in r.hgetall(self.cluster.key("joined")).items()}
        for chord_id in self.chords:
            if ("join", chord_id) not in finished:
                problems.append(f"chord {chord_id}: callback never ran to its end")
            if joined.get(chord_id) != str(list(range(CHORD_SIZE))):
                problems.append(f"chord {chord_id}: callback got {joined.get(chord_id)}")
        # Periodic occurrences: claimed once each, none missing, each run.
        if periodic:
            count, periodic_problems = check_periodic(
                r.hgetall(self.cluster.key("claims")), executions, TICK_EVERY
            )
            self.figures.occurrences = count
            problems += periodic_problems
        # Concurrency never above a worker's bound (invariant 5).
        limits = {p.pid: p.concurrency for p in self.cluster.procs if p.role == "worker"}
        self.figures.peak_concurrency, over = check_concurrency(executions, self.faults, limits)
        problems += over
        # Duplicates only for what was in flight at a fault (chord callbacks and periodic
        # occurrences included: "exactly once" beyond the faults' in-flight work).
        unexplained = check_duplicates(executions, self.faults, SLACK, self.figures)
        problems += [f"duplicate not explained by a fault: {u}" for u in unexplained[:20]]
        self.figures.tasks = len(self.labels)
        self.figures.chords = len(self.chords)
        self.figures.executions = len(executions)
        self.figures.seconds = time.monotonic() - self.started
        FIGURES.append(self.figures)
        print(self.figures.line())
        assert not problems, f"{self.context()} invariants broken:\n" + "\n".join(problems)

    def close(self) -> None:
        """Close the producer Queue."""
        self.queue.close_sync()


@pytest.fixture
def make_run(
    make_cluster: Callable[[float], Cluster], chaos: ChaosSettings, request: pytest.FixtureRequest
) -> Any:
    """Factory ``make_run(scenario, visibility_timeout) -> Run``; closed after the test, its
    figures attached to the test's reports (``record_figures``) for the session summary."""
    runs: list[Run] = []

    def make(scenario: str, visibility_timeout: float) -> Run:
        run = Run(make_cluster(visibility_timeout), chaos, scenario)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.close()
        if run.figures in FIGURES:
            record_figures(request.node, run.figures)


NETWORK_FAULTS = ("latency", "cut", "half_open", "partition")


@pytest.mark.timeout(1800)
def test_network_faults_between_workers_and_redis(make_run: Any, chaos: ChaosSettings) -> None:
    run: Run = make_run("network", 2.0)
    cluster, rng = run.cluster, run.rng
    vt = cluster.visibility_timeout
    workers = [cluster.spawn("worker", proxy=cluster.proxy()) for _ in range(3)]
    run.enqueue(chaos.pick(60, 200))
    rounds = chaos.pick(12, 40)
    kinds: list[str] = []
    for r in range(rounds):
        if not kinds:  # every kind once per pass, in a random order
            kinds = list(NETWORK_FAULTS)
            rng.shuffle(kinds)
        kind = kinds.pop()
        worker = rng.choice(workers)
        proxy = worker.proxy
        assert proxy is not None
        run.enqueue(rng.randint(20, 50))
        if r % 2 == 0:
            run.chord()
        time.sleep(rng.uniform(0.3, 1.0))  # pacing: let the new work get in flight
        start = time.time()
        if kind == "latency":
            proxy.set_latency(rng.uniform(0.05, 0.3))
            time.sleep(rng.uniform(1.0, 3.0))
            proxy.set_latency(0.0)
        elif kind == "cut":
            proxy.cut()
        elif kind == "half_open":
            proxy.half_open()
        else:
            proxy.partition()
            time.sleep(vt * 1.5 + rng.uniform(0.0, 1.5))
            proxy.heal()
        end = time.time()
        if kind == "half_open":
            # The worker cannot tell a silent connection from a slow one at once: it may
            # keep work until its reads time out. Allow it a generous while.
            end += 4 * vt + 15.0
        run.fault(kind, {worker.pid}, start, end)
        time.sleep(rng.uniform(0.3, 1.0))
    # Each worker recovered from its faults: it takes new work again.
    run.probe_liveness(workers, 90.0)
    run.settle(chaos.pick(180, 600))
    run.check()
    # Every worker survived its faults (a worker may not crash on a network fault).
    assert [w.pid for w in workers if not w.alive()] == [], cluster.logs()


@pytest.mark.timeout(3600)
def test_sigkills_of_workers_and_schedulers(make_run: Any, chaos: ChaosSettings) -> None:
    run: Run = make_run("kills", 1.5)
    cluster, rng = run.cluster, run.rng
    for _ in range(3):
        cluster.spawn("worker")
    for _ in range(3):
        cluster.spawn("scheduler")
    cycles = chaos.pick(20, 100)
    for c in range(cycles):
        run.enqueue(rng.randint(10, 30))
        if c % 3 == 0:
            run.chord()
        time.sleep(rng.uniform(0.1, 1.0))  # pacing: a random moment of the work in flight
        role = "worker" if rng.random() < 0.7 else "scheduler"
        victim = rng.choice(cluster.live(role))
        at = time.time()
        victim.kill()
        run.fault("kill_" + role, {victim.pid}, at, at)
        cluster.spawn(role)
    # Stop the schedulers gracefully, then let the workers drain everything.
    for scheduler in cluster.live("scheduler"):
        assert scheduler.terminate() == 0, cluster.logs()
    run.settle(chaos.pick(180, 600))
    run.check(periodic=True)


@pytest.mark.timeout(1800)
def test_redis_restart_with_aof_under_load(make_run: Any, chaos: ChaosSettings) -> None:
    run: Run = make_run("redis_restart", 2.0)
    cluster, rng = run.cluster, run.rng
    server = cluster.server
    workers = [cluster.spawn("worker", concurrency=8) for _ in range(2)]
    restarts = chaos.pick(3, 10)
    for _ in range(restarts):
        before = int(cluster.redis.hlen(cluster.key("exec")))
        run.enqueue(rng.randint(60, 120))
        run.chord()
        wait_until(
            lambda before=before: cluster.redis.hlen(cluster.key("exec")) > before + 5,
            60.0,
            "work in flight",
        )
        time.sleep(rng.uniform(0.0, 0.5))
        start = time.time()
        server.kill()
        cluster.close_client()
        time.sleep(rng.uniform(0.2, 2.0))  # the server stays down a while
        server.start()
        run.fault("redis_restart", None, start, time.time())
    run.settle(chaos.pick(180, 600))
    run.check()
    assert [w.pid for w in workers if not w.alive()] == [], cluster.logs()
