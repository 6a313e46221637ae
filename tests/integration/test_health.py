"""``/health`` and ``/ready`` of a worker over real HTTP, against a private ``redis-server``
that the test stops and starts again: ``/ready`` turns 503 naming the failing part (redis)
within 10 s of the server going down and 200 again once it is back; ``/health`` stays 200.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from blitzq import Queue
from blitzq.worker.health import PROBE_INTERVAL, PROBE_TIMEOUT

from ..conftest import free_port
from ..polling import wait_until
from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)

#: The documented bound: a server that went down is reported within this many seconds.
DETECTION = 10.0


class PrivateRedis:
    """A ``redis-server`` of this test on a fixed free port (AOF on, so a restart keeps the
    worker's consumer groups); :meth:`stop` and :meth:`start` again on the same port."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="blitzq-health-"))
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
             "--appendonly", "yes", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        import redis

        def answers() -> bool:
            try:
                with redis.Redis.from_url(self.url, socket_connect_timeout=1) as client:
                    return bool(client.ping())
            except (redis.RedisError, OSError):
                return False

        wait_until(answers, 30, "the private redis-server to answer")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server binary")
    server = PrivateRedis(binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.dir, ignore_errors=True)


async def get(port: int, path: str) -> tuple[int, Any]:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"http://127.0.0.1:{port}{path}")
    body = response.json() if path != "/metrics" else response.text
    return response.status_code, body


def test_the_detection_bound_holds_by_construction() -> None:
    assert PROBE_INTERVAL + PROBE_TIMEOUT + 1 <= DETECTION * 0.6


async def test_ready_flips_with_redis_and_back(private_redis: PrivateRedis) -> None:
    queue = Queue(redis_url=private_redis.url, namespace="health-" + uuid.uuid4().hex[:8])
    port = free_port()
    worker = make_worker(queue, health_port=port, metrics_port=port, ops_host="127.0.0.1")
    async with running(worker):
        status, body = await eventually(lambda: _probe(port, "/ready"), lambda r: r[0] == 200)
        assert body["status"] == "ready"
        assert body["failing"] == []
        assert body["checks"]["broker"] == {"ok": True, "backend": "redis"}
        assert body["checks"]["state_store"] == {"ok": True, "backend": "redis"}
        assert body["checks"]["fetch_loops"]["ok"] is True
        assert (await get(port, "/health"))[0] == 200
        status, page = await get(port, "/metrics")  # one port serves all three paths
        assert status == 200
        assert "blitzq_tasks_in_progress" in page

        private_redis.stop()
        status, body = await eventually(
            lambda: _probe(port, "/ready"), lambda r: r[0] == 503, timeout=DETECTION
        )
        assert "broker" in body["failing"]
        assert body["checks"]["broker"]["ok"] is False
        assert body["checks"]["broker"]["backend"] == "redis"
        assert body["checks"]["broker"]["error"]
        assert (await get(port, "/health"))[0] == 200  # alive all along

        private_redis.start()
        status, body = await eventually(
            lambda: _probe(port, "/ready"), lambda r: r[0] == 200, timeout=30
        )
        assert body["failing"] == []
    await queue.close()


async def test_ready_names_a_fetch_loop_that_died(make_queue: Callable[..., Queue]) -> None:
    """A fetch loop that ended (here its task, ``blitzq-fetch-<queue>``, is cancelled, as an
    escaped error would end it) makes ``/ready`` answer 503 naming ``fetch_loops`` and the
    queue, within the detection bound; the broker parts stay ok and ``/health`` stays 200."""
    queue = make_queue(name="loops")
    port = free_port()
    worker = make_worker(queue, health_port=port, ops_host="127.0.0.1")
    async with running(worker):
        await eventually(lambda: _probe(port, "/ready"), lambda r: r[0] == 200)
        loop_task = next(t for t in asyncio.all_tasks() if t.get_name() == "blitzq-fetch-loops")

        # A cancel that meets the blocking read's own timeout can end as that timeout, which
        # the loop outlives (it retries a failed fetch): cancel until the task has ended.
        async def stopped() -> bool:
            loop_task.cancel()
            await asyncio.sleep(0.05)
            return loop_task.done()

        await eventually(stopped, bool, timeout=30)
        _, body = await eventually(
            lambda: _probe(port, "/ready"), lambda r: r[0] == 503, timeout=DETECTION
        )
        assert body["status"] == "not ready"
        assert body["failing"] == ["fetch_loops"]
        assert body["checks"]["fetch_loops"] == {
            "ok": False, "queues": ["loops"], "stopped": ["loops"]
        }  # fmt: skip
        assert body["checks"]["broker"]["ok"] is True
        assert (await get(port, "/health"))[0] == 200
    await queue.close()


async def _probe(port: int, path: str) -> tuple[int, Any]:
    try:
        return await get(port, path)
    except httpx.HTTPError:
        return 0, None
