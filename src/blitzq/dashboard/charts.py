"""The dashboard's charts as data (:func:`series_doc`): the workers' 10 s slots
(:mod:`blitzq.worker.series`) read back and turned into points: tasks finished and failed
per second, each queue's depth, and the wait and run latency percentiles (p50, p95, p99,
upper bounds of the histogram bucket each falls in)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ..worker.series import BOUNDS, SLOT

if TYPE_CHECKING:
    from ..queue import Queue

__all__ = ["percentile", "series_doc"]


def percentile(counts: list[int], fraction: float) -> float | None:
    """The upper bound (seconds) of the bucket holding the ``fraction`` percentile of a
    histogram over :data:`~blitzq.worker.series.BOUNDS` (the last bucket, above them all,
    reads as its lower bound); ``None`` for an empty one."""
    total = sum(counts)
    if not total:
        return None
    rank = fraction * total
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank:
            return BOUNDS[min(i, len(BOUNDS) - 1)]
    return BOUNDS[-1]


async def series_doc(queue: Queue, minutes: int = 30) -> dict[str, Any]:
    """The last ``minutes`` of the series, oldest first.

    Returns:
        ``{"slot": 10, "points": [{"at", "done_per_s", "failed_per_s", "wait_p50",
        "wait_p95", "wait_p99", "run_p50", "run_p95", "run_p99", "depth": {queue: n}}, …]}``:
        ``at`` a slot's start (Unix seconds), latencies in seconds (``None`` in a slot
        without runs), ``depth`` what the workers saw (``{}`` when no worker sampled). The
        slot in progress is left out.

    Raises:
        BrokerError: the broker could not be reached.
    """
    now_slot = int(time.time()) // SLOT
    slots = list(range(now_slot - minutes * 60 // SLOT, now_slot))
    raw = await queue.broker.state.browse.samples(slots)
    points = []
    width = len(BOUNDS) + 1
    for slot, fields in zip(slots, raw, strict=True):
        wait = [fields.get(f"w{i}", 0) for i in range(width)]
        run = [fields.get(f"r{i}", 0) for i in range(width)]
        point: dict[str, Any] = {
            "at": slot * SLOT,
            "done_per_s": fields.get("done", 0) / SLOT,
            "failed_per_s": fields.get("failed", 0) / SLOT,
            "depth": {k[2:]: v for k, v in fields.items() if k.startswith("q:")},
        }
        for name, hist in (("wait", wait), ("run", run)):
            for label, fraction in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
                point[f"{name}_{label}"] = percentile(hist, fraction)
        points.append(point)
    return {"slot": SLOT, "points": points}
