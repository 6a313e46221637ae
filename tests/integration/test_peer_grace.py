"""A worker judges no other worker in the maintenance round right after a pause of its own.

After a whole-host pause (a VM freeze, a suspend, SIGSTOP of a process tree) every worker's
leases and registration look lapsed, yet the workers are healthy and renew within their next
round; a worker that resumed first and recovered the others' running tasks at once ran them
twice. Here one worker's event loop is blocked (its pause) while a message is planted as held
by another consumer, idle far past the visibility timeout (a peer that looks lapsed): the
round right after the pause leaves it alone, a later round recovers it (the peer is really
gone). Real Redis; the pause is a task blocking the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
import redis

from blitzq import Queue

from .proc_tasks import make_worker, running

VISIBILITY = 3.0  # maintenance rounds every second; a sleep 0.75 s late is a pause
GROUP = "blitzq"
GHOST = "ghost-consumer"


@pytest.mark.timeout(90)
async def test_the_round_after_a_pause_recovers_no_peer_and_a_later_round_does(
    server_url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = Queue("grace", redis_url=server_url, namespace=namespace, visibility_timeout=VISIBILITY)
    stream = "{" + namespace + "}:s:grace"
    client = redis.Redis.from_url(server_url)
    planted: dict[str, Any] = {}

    @queue.task(name="grace.victim")
    async def victim() -> str:
        return "recovered"

    @queue.task(name="grace.pause")
    async def pause(seconds: float) -> None:
        # Blocking on purpose: this worker's loop does not run (its pause). Meanwhile a peer
        # appears to have taken the victim long ago and stopped renewing it.
        entry_id = client.xadd(stream, planted["fields"])
        client.xreadgroup(GROUP, GHOST, {stream: ">"}, count=1)
        client.xclaim(stream, GROUP, GHOST, 0, [entry_id], idle=600_000)
        planted["id"] = entry_id
        time.sleep(seconds)

    # The victim's message, taken off the stream before any worker reads it (planted later).
    handle = await victim.enqueue()
    [(first_id, fields)] = client.xrange(stream)
    planted["fields"] = fields
    client.xdel(stream, first_id)

    def ghost_holds() -> bool:
        held = client.xpending_range(stream, GROUP, "-", "+", 10, consumername=GHOST)
        return any(e["message_id"] == planted.get("id") for e in held)

    # (pause noticed?, the ghost still holds the victim) at the end of each round.
    rounds: list[tuple[bool, bool]] = []
    try:
        with caplog.at_level(logging.INFO, logger="blitzq.worker"):
            async with running(make_worker(queue, concurrency=1)) as worker:
                deadline = time.monotonic() + 30
                while getattr(worker, "_maintenance", None) is None:  # started with the worker
                    assert time.monotonic() < deadline, "the worker did not start"
                    await asyncio.sleep(0.01)
                maintenance = worker._maintenance
                peers = maintenance.peers
                sleeping = peers.sleeping

                def noting(seconds: float) -> None:
                    noticed = max(peers.paused_at, maintenance.stalls.noticed_at) > -1e300
                    rounds.append((noticed, "id" in planted and ghost_holds()))
                    sleeping(seconds)

                peers.sleeping = noting  # type: ignore[method-assign]
                await (await pause.enqueue(2.5)).result(timeout=60)
                assert await handle.result(timeout=60) == "recovered"
    finally:
        await queue.close()
        client.close()
    after = [holds for noticed, holds in rounds if noticed]
    assert after, rounds
    assert after[0], f"the round right after the pause recovered a peer's message: {rounds}"
    messages = [r.getMessage() for r in caplog.records]
    # Told by the maintenance loop or the stall watch, whichever noticed the pause first.
    assert any("did not run for" in m for m in messages), messages
    assert any("recovered 1 abandoned message(s)" in m for m in messages), messages
