"""Shared fixtures: a real Redis (or the embedded Valkey) and a unique namespace per test.

``BLITZQ_TEST_REDIS_URL`` picks the server: a ``redis://`` URL, or ``embedded`` for a private
embedded Valkey in a temporary directory. By default the tests use 127.0.0.1:6379, starting a
``redis-server`` there if none answers, and fall back to the embedded Valkey when no
``redis-server`` binary exists. Tests never flush the server: each one uses its own namespace
and deletes its keys afterwards, so tests can run in parallel against one server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from blitzq import Queue

DEFAULT_URL = "redis://127.0.0.1:6379/0"


def _answers(url: str) -> bool:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1).ping()
    except (redis.RedisError, OSError):
        return False
    return True


def _start_local_redis() -> bool:
    binary = shutil.which("redis-server")
    if binary is None:
        return False
    workdir = tempfile.mkdtemp(prefix="blitzq-test-redis-")
    subprocess.run(
        [
            binary,
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            "--logfile",
            os.path.join(workdir, "log"),
        ],
        check=False,
    )
    for _ in range(50):
        if _answers(DEFAULT_URL):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of the Redis/Valkey server the tests use."""
    wanted = os.environ.get("BLITZQ_TEST_REDIS_URL", "")
    if wanted and wanted != "embedded":
        yield wanted
        return
    if wanted != "embedded" and (_answers(DEFAULT_URL) or _start_local_redis()):
        yield DEFAULT_URL
        return
    from blitzq.broker.redis.embedded import ensure_server, stop_server

    data_dir = Path(tempfile.mkdtemp(prefix="blitzq-test-valkey-"))
    url = ensure_server(data_dir)
    try:
        yield url
    finally:
        stop_server(data_dir)


@pytest.fixture
def namespace(redis_url: str) -> Iterator[str]:
    """A fresh namespace; its keys are deleted after the test."""
    ns = "test-" + uuid.uuid4().hex[:12]
    yield ns
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match="{" + ns + "}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def make_queue(redis_url: str, namespace: str) -> Callable[..., Queue]:
    """Factory of Queues on the test server and namespace; keyword arguments pass through."""

    def factory(**kwargs: Any) -> Queue:
        kwargs.setdefault("redis_url", redis_url)
        kwargs.setdefault("namespace", namespace)
        return Queue(**kwargs)

    return factory


@pytest.fixture
async def raw_redis(redis_url: str) -> AsyncIterator[Any]:
    """A plain redis.asyncio client on the test server (to plant or inspect keys by hand)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
