"""Which replicas a durable write on ``redis+sentinel://`` waits for (``replicas.py``).

A private primary and replica (``redis-server`` on free ports, stopped at the end): a replica
that leaves the primary's list because it was promoted keeps being waited for and marks the
primary superseded (a failover is under way: a write there would be lost); a replica that
leaves because it stopped is forgotten (the primary is still the primary); one that leaves
and does not answer (alive, silent) holds the primary in doubt until it answers, for at most
``DOUBT_SECONDS``; a watch that is told of another primary starts over.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from blitzq.broker.redis import replicas
from blitzq.broker.redis.replicas import ReplicaWatch

from ..conftest import free_port
from ..polling import wait_until

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="needs the redis-server binary"
)


class Pair:
    """A primary and its replica on free ports of 127.0.0.1."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="blitzq-replicas-"))
        self.primary, self.replica = free_port(), free_port()
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self._server(self.primary)
        self._server(self.replica, "--replicaof", "127.0.0.1", str(self.primary))
        wait_until(lambda: self.connected() == 1, 30, "the replica connected to the primary")

    def _server(self, port: int, *extra: str) -> None:
        args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(self.dir), *extra]
        self.procs[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL)

    def connected(self) -> int | None:
        """Replicas the primary lists as connected (``None`` while it does not answer)."""
        try:
            role = redis.Redis(port=self.primary, socket_timeout=2).execute_command("ROLE")
        except (redis.RedisError, OSError):
            return None
        return len(role[2])

    def stop(self, port: int | None = None) -> None:
        for each in [port] if port is not None else list(self.procs):
            proc = self.procs.pop(each)
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if port is None:
            shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def pair() -> Iterator[Pair]:
    servers = Pair()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.mark.timeout(60)
async def test_a_promoted_replica_supersedes_its_primary(pair: Pair) -> None:
    watch = ReplicaWatch({})
    primary = ("127.0.0.1", pair.primary)
    client = aioredis.Redis(port=pair.primary)
    try:
        assert await watch.count(client, primary) == 1
        assert watch.superseded is None
        redis.Redis(port=pair.replica).execute_command("REPLICAOF", "NO", "ONE")
        wait_until(lambda: pair.connected() == 0, 30, "the primary lost its replica")
        watch.forget()
        # Still waited for (a WAIT there fails), and the primary is known to be replaced.
        assert await watch.count(client, primary) == 1
        assert watch.superseded == primary
        # The pool moved to the promoted replica: a new primary, with no replica yet.
        promoted = aioredis.Redis(port=pair.replica)
        try:
            assert await watch.count(promoted, ("127.0.0.1", pair.replica)) == 0
            assert watch.superseded is None
        finally:
            await promoted.aclose()
    finally:
        await client.aclose()


@pytest.mark.timeout(60)
async def test_a_replica_that_stops_is_forgotten(pair: Pair) -> None:
    watch = ReplicaWatch({})
    primary = ("127.0.0.1", pair.primary)
    client = aioredis.Redis(port=pair.primary)
    try:
        assert await watch.count(client, primary) == 1
        pair.stop(pair.replica)
        wait_until(lambda: pair.connected() == 0, 30, "the primary lost its replica")
        watch.forget()
        # It does not answer: taken as crashed, writes go on unwaited by it.
        assert await watch.count(client, primary) == 0
        assert watch.superseded is None
    finally:
        await client.aclose()


def _silence(pair: Pair) -> None:
    """Stop the replica's process (SIGSTOP: its port still accepts connections, it answers
    nothing, as a replica being promoted on a starved machine) and cut its link, so the
    primary lists it no more."""
    pair.procs[pair.replica].send_signal(signal.SIGSTOP)
    redis.Redis(port=pair.primary).client_kill_filter(_type="replica")
    wait_until(lambda: pair.connected() == 0, 30, "the primary lost its replica")


@pytest.mark.timeout(60)
async def test_a_replica_that_leaves_and_does_not_answer_holds_the_primary_in_doubt(
    pair: Pair,
) -> None:
    """Before, a gone replica whose probe timed out was forgotten at once (taken as crashed):
    a replica being promoted on a loaded machine then let a worker fetch, run and record
    tasks on the old primary alone (issue 25's CI run: a task that ran without a record)."""
    watch = ReplicaWatch({})
    primary = ("127.0.0.1", pair.primary)
    client = aioredis.Redis(port=pair.primary)
    try:
        assert await watch.count(client, primary) == 1
        _silence(pair)
        watch.forget()
        assert await watch.count(client, primary) == 0
        assert watch.superseded == primary  # durable writes held: it may be being promoted
        watch.forget()
        assert await watch.count(client, primary) == 0
        assert watch.superseded == primary  # asked again at each look, still in doubt
        pair.procs[pair.replica].send_signal(signal.SIGCONT)
        wait_until(lambda: pair.connected() == 1, 30, "the replica connected again")
        watch.forget()
        assert await watch.count(client, primary) == 1
        assert watch.superseded is None
    finally:
        pair.procs[pair.replica].send_signal(signal.SIGCONT)
        await client.aclose()


@pytest.mark.timeout(60)
async def test_a_silent_replica_is_taken_as_crashed_after_the_doubt(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replicas, "DOUBT_SECONDS", 0.5)
    watch = ReplicaWatch({})
    primary = ("127.0.0.1", pair.primary)
    client = aioredis.Redis(port=pair.primary)
    try:
        assert await watch.count(client, primary) == 1
        _silence(pair)
        watch.forget()
        assert await watch.count(client, primary) == 0
        assert watch.superseded == primary
        # Each look asks it again (up to a second while it does not answer): after the doubt
        # it is taken as crashed, the writes go on unwaited, and it is asked no more.
        async with asyncio.timeout(20):
            while watch.superseded is not None:
                await asyncio.sleep(0.1)
                watch.forget()
                assert await watch.count(client, primary) == 0
        watch.forget()
        assert await watch.count(client, primary) == 0
        assert watch.superseded is None
    finally:
        pair.procs[pair.replica].send_signal(signal.SIGCONT)
        await client.aclose()


@pytest.mark.timeout(60)
async def test_a_pool_named_back_to_the_old_primary_finds_it_superseded_again(
    pair: Pair,
) -> None:
    """During a failover the sentinels disagree for a moment (one names the new primary,
    another, not yet told, the old one), so the pool can move to the promoted replica and
    back. Before, the watch started over on each move: back on the old primary it knew no
    replica, counted 0 and let the durable writes go there unwaited, to be lost with its data
    (a CI run of ``test_sentinel_failover.py``: a task that ran without a record)."""
    watch = ReplicaWatch({})
    old, new = ("127.0.0.1", pair.primary), ("127.0.0.1", pair.replica)
    client = aioredis.Redis(port=pair.primary)
    promoted = aioredis.Redis(port=pair.replica)
    try:
        assert await watch.count(client, old) == 1
        redis.Redis(port=pair.replica).execute_command("REPLICAOF", "NO", "ONE")
        wait_until(lambda: pair.connected() == 0, 30, "the primary lost its replica")
        watch.forget()
        await watch.count(client, old)
        assert watch.superseded == old
        assert await watch.count(promoted, new) == 0
        assert watch.superseded is None
        await watch.count(client, old)  # a sentinel not yet told names the old one again
        assert watch.superseded == old
    finally:
        await client.aclose()
        await promoted.aclose()
