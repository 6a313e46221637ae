"""Chords survive SIGKILLed workers (reliable mode): the callback runs exactly once per
completed chord, and the workflow completes once.

- a member SIGKILLs its own worker the first time it runs: the member is recovered and run
  again by the surviving worker, its result counts once, the callback runs once;
- the callback SIGKILLs its worker the first time: it is redelivered and the workflow
  completes, once;
- every member's message is delivered twice (as a redelivery after a crash would), before
  and after the chord fired: each member runs twice, the callback still runs once.

The worker processes run this file as a script (``python test_chord_crash.py URL NS VT``);
task bodies count their runs with Redis INCRs under ``{ns}:cc:*``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from blitzq import Queue, Worker, chord

VT = 1.0
MEMBERS = ["m0", "m1", "m2", "m3"]


def key(namespace: str, suffix: str) -> str:
    """``{ns}:cc:<suffix>``: observation keys (deleted with the namespace)."""
    return "{" + namespace + "}:cc:" + suffix


def build_queue(url: str, namespace: str) -> Queue:
    """The Queue of these tests, with ``cc.member`` and ``cc.merge`` registered.

    ``{ns}:cc:kill`` names who SIGKILLs its worker on its first run: a member label, or
    ``"callback"``.
    """
    queue = Queue(redis_url=url, namespace=namespace, visibility_timeout=VT, max_deliveries=5)
    clients: dict[str, Any] = {}

    def client() -> Any:
        if "c" not in clients:
            import redis.asyncio as aioredis

            clients["c"] = aioredis.Redis.from_url(url)
        return clients["c"]

    @queue.task(name="cc.member")
    async def member(label: str) -> str:
        runs = await client().incr(key(namespace, "runs:" + label))
        if runs == 1 and await client().get(key(namespace, "kill")) == label.encode():
            os.kill(os.getpid(), signal.SIGKILL)
        await asyncio.sleep(0.05)
        return label.upper()

    @queue.task(name="cc.merge")
    async def merge(results: list[str]) -> dict[str, Any]:
        runs = await client().incr(key(namespace, "callback"))
        if runs == 1 and await client().get(key(namespace, "kill")) == b"callback":
            os.kill(os.getpid(), signal.SIGKILL)
        await client().incr(key(namespace, "callback_done"))
        return {"results": results}

    del member, merge
    return queue


async def run_worker(url: str, namespace: str) -> None:
    """Worker process body: announce readiness in ``{ns}:cc:ready``, run until stopped."""
    queue = build_queue(url, namespace)

    async def announce() -> None:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url)
        await client.sadd(key(namespace, "ready"), os.getpid())
        await client.aclose()

    queue.on_startup.append(announce)
    await Worker(queue, concurrency=4, handle_signals=True, block_timeout=0.2).run()


# ----------------------------------------------------------------------------- harness
def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` every 50 ms until truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        time.sleep(0.05)


class Cluster:
    """Worker subprocesses of one test, observed through a sync Redis client."""

    def __init__(self, url: str, namespace: str, tmp_path: Path) -> None:
        self.url, self.namespace, self.tmp_path = url, namespace, tmp_path
        self.redis = redis.Redis.from_url(url)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.queue = build_queue(url, namespace)

    def spawn(self) -> subprocess.Popen[bytes]:
        log = open(self.tmp_path / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, __file__, self.url, self.namespace],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log.close()
        self.procs.append(proc)
        wait_until(
            lambda: (
                self.redis.sismember(key(self.namespace, "ready"), proc.pid)
                or proc.poll() is not None
            ),
            20.0,
            f"worker {proc.pid} ready",
        )
        assert proc.poll() is None, self.logs()
        return proc

    def count(self, suffix: str) -> int:
        return int(self.redis.get(key(self.namespace, suffix)) or 0)

    def stream(self) -> str:
        return "{" + self.namespace + "}:s:default"

    def drained(self) -> bool:
        """The queue's stream is empty: nothing waiting, nothing in flight."""
        return int(self.redis.xlen(self.stream())) == 0

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-2000:]}"
            for p in sorted(self.tmp_path.glob("worker-*.log"))
        )

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)
        self.queue.close_sync()
        self.redis.close()


@pytest.fixture
def cluster(redis_url: str, namespace: str, tmp_path: Path) -> Iterator[Cluster]:
    """A :class:`Cluster` on the test server and namespace; workers killed afterwards."""
    made = Cluster(redis_url, namespace, tmp_path)
    yield made
    made.close()


def apply_chord(cluster: Cluster) -> Any:
    queue = cluster.queue
    flow = chord([queue.sig("cc.member", label) for label in MEMBERS], queue.sig("cc.merge"))
    return queue.apply_sync(flow)


EXPECTED = {"results": [label.upper() for label in MEMBERS]}


# ------------------------------------------------------------------------------- tests
def test_member_that_kills_its_worker_counts_once(cluster: Cluster) -> None:
    cluster.redis.set(key(cluster.namespace, "kill"), "m2")
    workers = [cluster.spawn(), cluster.spawn()]
    handle = apply_chord(cluster)
    assert handle.get_sync(timeout=VT * 10 + 15) == EXPECTED, cluster.logs()
    killed = [w for w in workers if w.poll() is not None]
    assert [w.returncode for w in killed] == [-signal.SIGKILL]
    assert cluster.count("runs:m2") == 2  # killed once, recovered and run by the survivor
    assert cluster.count("callback") == 1
    wait_until(cluster.drained, 30.0, "an empty stream")
    assert cluster.count("callback") == 1
    assert handle.status_sync() == "succeeded"


def test_callback_that_kills_its_worker_is_redelivered_and_completes_once(
    cluster: Cluster,
) -> None:
    cluster.redis.set(key(cluster.namespace, "kill"), "callback")
    workers = [cluster.spawn(), cluster.spawn()]
    handle = apply_chord(cluster)
    assert handle.get_sync(timeout=VT * 10 + 15) == EXPECTED, cluster.logs()
    assert [w.returncode for w in workers if w.poll() is not None] == [-signal.SIGKILL]
    assert cluster.count("callback") == 2  # the killed run, then the redelivery
    assert cluster.count("callback_done") == 1
    for label in MEMBERS:
        assert cluster.count("runs:" + label) == 1
    wait_until(cluster.drained, 30.0, "an empty stream")
    assert cluster.count("callback_done") == 1
    assert handle.status_sync() == "succeeded"


def test_members_delivered_twice_fire_the_callback_once(cluster: Cluster) -> None:
    handle = apply_chord(cluster)
    # Copy every member's message before any worker runs: redeliveries to inject.
    messages = [fields[b"m"] for _, fields in cluster.redis.xrange(cluster.stream())]
    assert len(messages) == len(MEMBERS)
    for message in messages:  # each member delivered twice while the chord is open
        cluster.redis.xadd(cluster.stream(), {"m": message})
    cluster.spawn()
    cluster.spawn()
    assert handle.get_sync(timeout=15) == EXPECTED, cluster.logs()
    wait_until(cluster.drained, 30.0, "an empty stream")
    for label in MEMBERS:
        assert cluster.count("runs:" + label) == 2
    # And once more after the chord fired (a member redelivered late).
    for message in messages:
        cluster.redis.xadd(cluster.stream(), {"m": message})
    wait_until(
        lambda: all(cluster.count("runs:" + label) == 3 for label in MEMBERS),
        30.0,
        "the late copies to run",
    )
    wait_until(cluster.drained, 30.0, "an empty stream")
    assert cluster.count("callback") == 1
    assert handle.get_sync(timeout=1) == EXPECTED


if __name__ == "__main__":
    asyncio.run(run_worker(sys.argv[1], sys.argv[2]))
