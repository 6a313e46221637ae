"""Many hosts, simulated for real: three worker hosts in network namespaces of the test's
own against a local Redis Cluster of three primaries with a replica each.

Each host is a Linux network namespace (``netns.HostNetwork``: names, veth pairs and
addresses made by the test and deleted after it, even on failure) running one worker process
(``ip netns exec <ns> python run_chaos.py worker ...``) that reaches the cluster only over its
veth. The cluster (``tests/cluster_server.py``, ``replicas=1``, a short
``cluster-node-timeout``) listens on the server address of the test's network, the
observation server (a plain ``redis-server`` where the task bodies record each execution,
``chaos_app``) on a second address that no partition cuts. The test itself, in the root
namespace, enqueues (generated ids: each task's record lives in its queue's slot, on the
spread layout) and checks. Three queues, one per primary, so every shard carries work.

Faults, one after the other (the short form, in the default suite: one of each, ~300
tasks; ``BLITZQ_CHAOS=long``: 6 rounds of both, the killed node restarted as a replica in
between):

- **partition**: one host's namespace gets a blackhole route to the cluster's address while
  it has work in flight; healed once another host has taken over one of its tasks (its
  lease lapsed).
- **primary kill**: SIGKILL of a primary while work is in flight (the one holding the
  namespace's own slot first); its replica is promoted.

Before each fault the test waits until the replicas have every write the primaries had taken
(``LocalCluster.replicated``): a write the old primary had not replicated is lost on a
failover (asynchronous replication, docs/guarantees.md), so an enqueue acknowledged just before
the kill may vanish; this test checks what blitzq adds on top: nothing the cluster held is
lost. Then: every task succeeded, ran to its end at least once and has a final record; a
task ran more than once only if it was in flight at a fault; every host takes new work
after the faults; every worker survived.

Skips, saying why, where namespaces cannot be made (not root, no ``ip``, no CAP_NET_ADMIN,
no veth) or ``redis-server``/``redis-cli`` are missing.
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from blitzq import TaskRecord
from blitzq.broker.redis.homes import HomedKeys
from blitzq.broker.redis.spread import SpreadKeys
from tests.cluster_server import LocalCluster
from tests.ports import free_port

from .chaos_app import WORK, build_queue, key
from .conftest import FIGURES, RUNNER, ChaosSettings, record_figures, wait_until
from .invariants import Execution, Fault, Figures, check_concurrency, parse_executions
from .invariants import check_duplicates as explained_duplicates
from .netns import HostNetwork, NamespaceUnavailable, unavailable_reason

pytestmark = pytest.mark.chaos

#: Seconds of a worker's lease without renewal (its Queue's visibility timeout).
VISIBILITY = 2.0
#: ``cluster-node-timeout`` of the cluster (milliseconds): a killed primary's replica is
#: promoted about this long after the kill.
NODE_TIMEOUT = 3000
#: Seconds around a fault within which an execution counts as in flight at it.
SLACK = 5.0
#: Worker concurrency per host.
CONCURRENCY = 4
#: Generous bound of every wait (a busy 2-core machine).
WAIT = 180.0


class Hosts:
    """The scenario's servers, network, worker processes and producer.

    Args:
        net: the test's network namespaces.
        cluster: the started cluster (on ``net.server_address``).
        observer_port: port of the observation server (on ``net.observer_address``).
        tmp_path: where the worker logs go.
    """

    def __init__(
        self, net: HostNetwork, cluster: LocalCluster, observer_port: int, tmp_path: Path
    ) -> None:
        self.net, self.cluster, self.tmp_path = net, cluster, tmp_path
        self.namespace = "hosts-" + uuid.uuid4().hex[:10]
        self.url = f"redis+cluster://{net.server_address}:{cluster.ports[0]}/0"
        self.observe_url = f"redis://{net.observer_address}:{observer_port}/0"
        self.observer = redis.Redis.from_url(self.observe_url, socket_timeout=30)
        self.queues = self._queues()
        self.workers: dict[int, subprocess.Popen[bytes]] = {}  # host -> process
        self.logs: dict[int, Path] = {}
        self.labels: dict[str, str] = {}  # label -> task id
        self.faults: list[Fault] = []
        self.figures = Figures("hosts", 0)
        self.producer, _ = build_queue(self.url, self.namespace, self.observe_url, VISIBILITY)

    def _queues(self) -> list[str]:
        """Three queue names whose slots are on the three primaries."""
        keys = SpreadKeys(self.namespace)
        chosen: dict[int, str] = {}
        for i in range(256):
            owner = self.cluster.owner(keys.queue_tag(f"q{i}"))
            chosen.setdefault(owner, f"q{i}")
            if len(chosen) == 3:
                break
        return sorted(chosen.values())

    # ---------------------------------------------------------------- processes
    def spawn(self, host: int) -> None:
        """Start host ``host``'s worker in its namespace; wait until it is ready."""
        log = self.tmp_path / f"host{host}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("BLITZQ_REDIS_URL", None)
        cmd = [
            *self.net.prefix(host),
            sys.executable,
            str(RUNNER),
            "worker",
            self.url,
            self.observe_url,
            self.namespace,
            "--concurrency",
            str(CONCURRENCY),
            "--visibility-timeout",
            str(VISIBILITY),
            "--queues",
            ",".join(self.queues),
        ]
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.workers[host], self.logs[host] = proc, log

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"host {host}'s worker exited:\n{self.log_tails()}")
            return bool(self.observer.sismember(key(self.namespace, "ready"), proc.pid))

        wait_until(ready, WAIT, f"host {host}'s worker ready")

    def log_tails(self, tail: int = 3000) -> str:
        """The end of every worker's log (for failure messages)."""
        return "\n".join(
            f"--- host {h} (pid {self.workers[h].pid}, rc={self.workers[h].poll()}) ---\n"
            + (log.read_text(errors="replace")[-tail:] if log.exists() else "")
            for h, log in self.logs.items()
        )

    def close(self) -> None:
        """Kill the workers, close the producer and the observation client."""
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(30)
        try:
            self.producer.close_sync()
        finally:
            self.observer.close()

    # ---------------------------------------------------------------- work
    def enqueue(self, count: int) -> None:
        """Enqueue ``count`` work tasks of 0.1-0.4 s over the queues (generated ids)."""
        task = self.producer.tasks[WORK]
        for i, queue in enumerate(self.queues):
            calls: list[tuple[tuple[str, float], dict[str, object]]] = []
            for j in range(i, count, len(self.queues)):
                label = f"w{len(self.labels) + len(calls)}"
                calls.append(((label, 0.1 + 0.3 * ((j * 7919) % 100) / 100), {}))
            handles = task.options(queue=queue).enqueue_many_sync(calls)
            for (args, _), handle in zip(calls, handles, strict=True):
                self.labels[args[0]] = handle.id

    def executions(self) -> list[Execution]:
        """Every execution the bodies recorded so far."""
        return parse_executions(self.observer.hgetall(key(self.namespace, "exec")))

    def running(self, pid: int | None = None) -> list[Execution]:
        """Executions started and not ended (of process ``pid`` if given)."""
        return [e for e in self.executions() if e.end is None and pid in (None, e.pid)]

    def settle_replicas(self) -> None:
        """Wait until every replica has what its primary had taken so far."""
        assert self.cluster.replicated(WAIT), "the replicas did not catch up"

    # ---------------------------------------------------------------- faults
    def partition(self, host: int) -> None:
        """Partition ``host`` from the cluster while it runs a task; heal it once another
        host has run one of the tasks it held (its lease lapsed and was taken over)."""
        pid = self.workers[host].pid
        held = wait_until(lambda: self.running(pid), WAIT, f"host {host} running a task")
        start = time.time()
        self.net.partition(host)
        labels = {e.item for e in held}

        def taken_over() -> bool:
            return any(
                e.item in labels and e.pid != pid and e.start >= start for e in self.executions()
            )

        try:
            wait_until(taken_over, WAIT, f"a task of partitioned host {host} taken over")
        finally:
            self.net.heal(host)
        self.fault("partition", {pid}, start, time.time())

    def kill_primary(self, port: int) -> None:
        """SIGKILL the primary on ``port`` while tasks run; wait until its replica took its
        slots and the cluster is healthy again."""
        wait_until(lambda: self.running(), WAIT, "tasks in flight")
        start = time.time()
        self.cluster.kill(port)
        wait_until(self.cluster.healthy, WAIT, f"a replica promoted in place of {port}")
        self.fault("kill_primary", None, start, time.time())

    def fault(self, kind: str, pids: set[int] | None, start: float, end: float) -> None:
        """Record one fault."""
        self.faults.append(Fault(kind, None if pids is None else frozenset(pids), start, end))
        self.figures.faults[kind] += 1

    # ---------------------------------------------------------------- checks
    def records(self) -> dict[str, TaskRecord | None]:
        """The record of every task enqueued, by label (None: none yet)."""
        keys = HomedKeys(self.namespace)
        live = next(p for p in self.cluster.ports if self.cluster.alive(p))
        with redis.RedisCluster(
            host=self.net.server_address, port=live, socket_timeout=30
        ) as client:
            labels = list(self.labels)
            raws = client.mget_nonatomic([keys.record(self.labels[x]) for x in labels])
        return {
            label: None if raw is None else TaskRecord.from_bytes(raw)
            for label, raw in zip(labels, raws, strict=True)
        }

    def settle(self) -> None:
        """Wait until every task's record is final."""
        left: list[str] = []

        def done() -> bool:
            nonlocal left
            left = [x for x, r in self.records().items() if r is None or not r.state.is_final]
            return not left

        try:
            wait_until(done, WAIT * 2, "every task final", interval=0.5)
        except AssertionError:
            raise AssertionError(
                f"{len(left)} task(s) never reached a final state: {left[:20]}\n" + self.log_tails()
            ) from None

    def probe(self) -> None:
        """Every host takes new work after the faults: enqueue rounds of short tasks until
        each worker has started one."""
        since = time.time()
        first = len(self.labels)
        waiting = {p.pid for p in self.workers.values()}

        def all_took() -> bool:
            waiting.difference_update(e.pid for e in self.executions() if e.start >= since)
            if waiting:  # a round of new work per poll, until every host took some
                self.enqueue(4 * len(self.workers))
            return not waiting

        try:
            wait_until(all_took, WAIT, "every host taking work", interval=1.0)
        except AssertionError:
            records = self.records()
            states = collections.Counter(
                "none" if r is None else r.state.value
                for label, r in records.items()
                if int(label[1:]) >= first
            )
            raise AssertionError(
                f"hosts (worker pids) {sorted(waiting)} started no task in {WAIT} s after the "
                f"faults; the records of the tasks enqueued meanwhile: {dict(states)}\n"
                + self.log_tails()
            ) from None

    def check(self) -> None:
        """Nothing lost, records complete, duplicates only of in-flight tasks."""
        executions = self.executions()
        finished = {e.item for e in executions if e.kind == "work" and e.end is not None}
        problems = []
        for label, record in self.records().items():
            if record is None or record.state.value != "succeeded":
                problems.append(f"task {label}: record {record and record.state.value}")
            if label not in finished:
                problems.append(f"task {label}: no execution ran to its end")
        limits = {p.pid: CONCURRENCY for p in self.workers.values()}
        self.figures.peak_concurrency, over = check_concurrency(executions, self.faults, limits)
        problems += over
        unexplained = explained_duplicates(executions, self.faults, SLACK, self.figures)
        problems += [f"duplicate not explained by a fault: {u}" for u in unexplained[:20]]
        self.figures.tasks = len(self.labels)
        self.figures.executions = len(executions)
        FIGURES.append(self.figures)
        print(self.figures.line())
        assert not problems, "invariants broken:\n" + "\n".join(problems[:40])


def _observation_server(address: str, workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A plain ``redis-server`` on ``address`` (never partitioned) for the observations."""
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--bind",
            address,
            "--protected-mode",
            "no",  # the test's own address, reachable from its namespaces only
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(workdir),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def answers() -> bool:
        try:
            with redis.Redis(host=address, port=port, socket_timeout=2) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            if proc.poll() is not None:
                raise AssertionError("the observation server exited") from None
            return False

    wait_until(answers, 60.0, "the observation server")
    return proc, port


@pytest.fixture
def hosts(chaos: ChaosSettings, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Hosts]:
    """A started :class:`Hosts` with one worker per host; everything it made is deleted
    after the test (processes, servers, namespaces, links), whatever happened."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces cannot be made here: {reason}")
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        pytest.skip("redis-server and redis-cli are needed to start a local Redis Cluster")
    try:
        net = HostNetwork(3)
    except NamespaceUnavailable as e:
        pytest.skip(f"network namespaces cannot be made here: {e}")
    cluster: LocalCluster | None = None
    observer: subprocess.Popen[bytes] | None = None
    made: Hosts | None = None
    try:
        cluster = LocalCluster(
            server, cli, host=net.server_address, replicas=1, node_timeout=NODE_TIMEOUT
        )
        assert cluster.start(WAIT), "the local Redis Cluster with replicas did not start"
        observer, port = _observation_server(net.observer_address, tmp_path)
        made = Hosts(net, cluster, port, tmp_path)
        for host in range(1, net.hosts + 1):
            made.spawn(host)
        yield made
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            sys.stderr.write(made.log_tails())
    finally:
        if made is not None:
            made.close()
            if made.figures in FIGURES:
                record_figures(request.node, made.figures)
        if cluster is not None:
            cluster.stop()
        if observer is not None:
            observer.kill()
            observer.wait(30)
        net.close()


@pytest.mark.timeout(3600)
def test_hosts_partitioned_and_a_primary_killed_lose_nothing(
    hosts: Hosts, chaos: ChaosSettings
) -> None:
    started = time.monotonic()
    cluster = hosts.cluster
    hosts.figures.seed = chaos.seed
    first = cluster.owner("{" + hosts.namespace + "}:")  # the namespace's own slot first
    for round_ in range(chaos.pick(1, 6)):
        host = 1 + round_ % hosts.net.hosts
        hosts.enqueue(chaos.pick(120, 200))
        hosts.settle_replicas()
        hosts.partition(host)
        hosts.enqueue(chaos.pick(120, 200))
        hosts.settle_replicas()
        primaries = sorted(cluster.primaries())
        victim = first if round_ == 0 else primaries[round_ % len(primaries)]
        hosts.kill_primary(victim)
        if chaos.long:
            cluster.restart(victim)  # rejoins as the replica of its promoted one
            wait_until(lambda: cluster.replicated(5.0), WAIT, "the restarted node a replica")
    hosts.enqueue(60)  # after the faults: the promoted primaries take new work
    hosts.probe()
    hosts.settle()
    hosts.figures.seconds = time.monotonic() - started
    hosts.check()
    dead = {h: p.returncode for h, p in hosts.workers.items() if p.poll() is not None}
    assert not dead, f"workers exited: {dead}\n{hosts.log_tails()}"
