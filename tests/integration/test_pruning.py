"""A worker prunes its streams' idle consumers one stream at a time, in turn
(``worker/pruning.py``, issue 25): every stream of every queue is pruned in a cycle, one
per step, the caller's own consumer kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from blitzq import Queue
from blitzq.broker.redis.keys import GROUP
from blitzq.worker import pruning
from blitzq.worker.pruning import Pruning

from .proc_tasks import eventually

pytestmark = pytest.mark.timeout(60)


async def test_each_stream_is_pruned_in_turn_one_per_step(
    make_queue: Callable[..., Queue], raw_redis: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pruning, "PRUNE_EVERY", 0.0)
    monkeypatch.setattr(pruning, "PRUNE_GAP", 0.0)  # a step prunes whenever it is called
    queue = make_queue(name="p0", mode="reliable")
    broker = queue.broker
    levels = [f"p{i}{level}" for i in range(2) for level in (":high", "", ":low")]
    keys = [broker.transport.keys.stream(q) for q in levels]
    for key in keys:
        await raw_redis.xgroup_create(key, GROUP, id="0", mkstream=True)
        await raw_redis.xgroup_createconsumer(key, GROUP, "ghost")

    async def ghosts() -> list[str]:
        """The streams whose ghost consumer is still there, idle over 1 ms."""
        out = []
        for key in keys:
            for c in await raw_redis.xinfo_consumers(key, GROUP):
                if c["name"] in (b"ghost", "ghost") and c["idle"] > 1:
                    out.append(key)
        return out

    await eventually(ghosts, lambda found: len(found) == len(keys), timeout=30)
    pruner = Pruning(broker, 0.9)
    pruner.idle = 0.001  # a consumer idle over 1 ms that holds nothing is pruned
    try:
        for step in range(1, len(levels) + 1):
            await pruner.step(levels)
            assert await ghosts() == keys[step:]  # one more stream pruned, in order
    finally:
        await queue.close()
