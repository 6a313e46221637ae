"""A priority level whose key holds another type does not stop the queue's other levels.

``DEL {ns}:s:<q>:low`` then ``SET {ns}:s:<q>:low oops`` used to make every fetch of the queue
fail with ``WRONGTYPE`` (one script call, one blocking read over all levels), logged as a
warning that named no key, until the key was deleted. Now the worker names the key in one
ERROR, sets that level aside and fetches the others; it tries the level again later and takes
its messages once the key is fixed. Runs on the session's server and on the embedded Valkey
(a blocked read over several streams answers differently there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue
from blitzq.broker.redis.keys import Keys
from blitzq.worker import bad_keys

from .proc_tasks import make_worker, running

pytestmark = [pytest.mark.timeout(90), pytest.mark.both_servers]


@pytest.fixture(params=["reliable", "fast"])
def mode(request: pytest.FixtureRequest) -> str:
    """Broker mode of the Queue under test."""
    return str(request.param)


@pytest.mark.parametrize("level", ["low", "high"])
async def test_a_level_of_the_wrong_type_is_named_and_the_others_go_on(
    make_queue: Callable[..., Queue],
    namespace: str,
    raw_redis: Any,
    mode: str,
    level: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bad_keys, "RECHECK", 0.5)  # the level is tried again soon
    queue = make_queue(mode=mode)

    @queue.task(name="levels.echo")
    async def echo(x: Any) -> Any:
        return x

    keys = Keys(namespace)
    physical = f"{queue.name}:{level}"
    key = keys.stream(physical) if mode == "reliable" else keys.list(physical)
    kind = "stream" if mode == "reliable" else "list"
    caplog.set_level(logging.WARNING, logger="blitzq.worker")
    try:
        async with running(make_worker(queue)):
            assert await (await echo.enqueue("before")).result(timeout=20) == "before"
            await raw_redis.delete(key)
            await raw_redis.set(key, "oops")
            other = "high" if level == "low" else "low"
            for priority in ("normal", other):
                bound = echo.options(priority=priority)
                assert await (await bound.enqueue(priority)).result(timeout=20) == priority
            named = [r for r in caplog.records if key in r.getMessage()]
            assert named, [r.getMessage() for r in caplog.records]
            assert named[0].levelno == logging.ERROR
            assert "holds a string" in named[0].getMessage()
            assert len(named) == 1  # rate-limited: once a minute per key
            stats = await queue.stats([queue.name, physical])
            assert stats["wrong_type_keys"] == {key: f"holds a string, not a {kind}"}
            assert stats["queues"][physical] == {"waiting": 0, "in_flight": 0}
            # Maintenance (recovery, handed messages) skips the key instead of failing.
            failed = [
                r.getMessage()
                for r in caplog.records
                if r.getMessage().startswith(("maintenance", "taking handed"))
            ]
            assert failed == []
            # Fixed by hand: the level's messages run again, without a restart.
            await raw_redis.delete(key)
            handle = await echo.options(priority=level).enqueue(level)
            assert await handle.result(timeout=20) == level
    finally:
        await queue.close()
