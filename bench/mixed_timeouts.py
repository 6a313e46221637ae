"""What a recovery call costs when a live worker with a longer visibility timeout holds the
pending entries (``claim_idle.lua``: ``XPENDING IDLE`` in pages, none claimed) against the
one ``XAUTOCLAIM`` every recovery made before (a recoverer whose timeout covers them all:
none claimed either), on the same pending list.

Usage::

    .venv/bin/python bench/mixed_timeouts.py [--entries 2000] [--pairs 7] [--calls 30]

Starts a private ``redis-server`` like ``bench.py`` (never the shared 6379). One consumer
(``patient``) fetches ``--entries`` messages and keeps them pending; once they are idle, for
``--pairs`` pairs (the order alternating), a second consumer makes ``--calls`` recovery calls
each way. Reported: the median time per call of each way and the median of the per-pair
ratios (holder scan / XAUTOCLAIM). A maintenance round makes one such call per occupied
queue, and reads the live timeouts once (``worker_timeouts.lua``: one ``ZRANGEBYSCORE``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench as harness  # the sibling script: its private server

from blitzq.broker.redis import ReliableRedisBroker
from blitzq.serialization import Envelope, encode_envelope

QUEUE = "q"


async def _calls(broker: ReliableRedisBroker, holders: dict[str, float] | None, n: int) -> float:
    """Seconds per recovery call (``n`` calls, none of which may claim anything)."""
    min_idle = 3600.0 if holders is None else 0.05  # XAUTOCLAIM: every entry is too young
    start = time.perf_counter()
    for _ in range(n):
        assert await broker.recover(QUEUE, min_idle, 200, 5, 86400, holders) == (0, 0)
    return (time.perf_counter() - start) / n


async def main(entries: int, pairs: int, calls: int) -> None:
    """Run the pairs on a private server and print the figures."""
    with harness.private_redis() as url:
        namespace = harness.new_namespace("mixedvt")
        patient, rescuer = ReliableRedisBroker(url, namespace), ReliableRedisBroker(url, namespace)
        try:
            await patient.prepare_consumer([QUEUE], "patient")
            await rescuer.prepare_consumer([QUEUE], "rescuer")
            payloads = [
                encode_envelope(Envelope(f"t{i}", "bench.noop", QUEUE, []), 1 << 20)
                for i in range(entries)
            ]
            for i in range(0, entries, 500):
                await patient.publish(QUEUE, payloads[i : i + 500])
            fetched = 0
            while fetched < entries:
                fetched += len(await patient.fetch(QUEUE, 500, 0))
            await asyncio.sleep(0.1)  # every entry idle past the rescuer's 0.05 s
            holders = {"patient": 3600.0}
            scan: list[float] = []
            plain: list[float] = []
            for i in range(pairs):
                if i % 2:
                    scan.append(await _calls(rescuer, holders, calls))
                    plain.append(await _calls(rescuer, None, calls))
                else:
                    plain.append(await _calls(rescuer, None, calls))
                    scan.append(await _calls(rescuer, holders, calls))
            ratio = statistics.median(s / p for s, p in zip(scan, plain, strict=True))
            print(
                f"{entries} pending entries of a live patient holder: "
                f"XAUTOCLAIM {statistics.median(plain) * 1e3:.2f} ms/call, "
                f"holder scan {statistics.median(scan) * 1e3:.2f} ms/call, "
                f"median ratio {ratio:.2f}"
            )
        finally:
            await patient.close()
            await rescuer.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    asyncio.run(main(args.entries, args.pairs, args.calls))
