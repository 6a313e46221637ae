"""blitzq workflow example: a chord that measures every file of a directory in parallel.

One ``measure`` task per file of the standard library's ``json`` package (size, lines,
SHA-256), then ``merge`` adds the measurements up (the chord's callback, given the list of
results in file order), then ``report`` formats the totals (a chain step after the chord)::

    chain(chord([measure.s(path) for path in files], merge.s()), report.s())

Run it with ``python examples/chord_files.py [DIRECTORY]``. It uses ``BLITZQ_REDIS_URL`` when
set, else the embedded Valkey server (started on first use in ``./.blitzq``); a worker runs in
this process. The totals are checked against a local computation; the script exits 0 when
they match and 1 otherwise.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from blitzq import Queue, Worker, chain, chord

# A namespace of its own per run, so repeated runs never see each other's keys.
queue = Queue(namespace="example-chord-" + uuid.uuid4().hex[:8], result_ttl=600)


def measure_file(path: str) -> dict[str, Any]:
    """Size in bytes, number of lines and SHA-256 of one file."""
    data = Path(path).read_bytes()
    return {
        "path": path,
        "bytes": len(data),
        "lines": data.count(b"\n"),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


#: One chord member per file (a plain function: it runs in a worker thread).
measure = queue.task(name="example.measure")(measure_file)


@queue.task(name="example.merge")
async def merge(measurements: list[dict[str, Any]]) -> dict[str, Any]:
    """The chord's callback: totals over every file, plus a digest of all the digests."""
    digest = hashlib.sha256()
    for item in measurements:
        digest.update(item["sha256"].encode())
    return {
        "files": len(measurements),
        "bytes": sum(item["bytes"] for item in measurements),
        "lines": sum(item["lines"] for item in measurements),
        "largest": max(measurements, key=lambda item: item["bytes"])["path"],
        "digest": digest.hexdigest(),
    }


@queue.task(name="example.report")
async def report(totals: dict[str, Any]) -> str:
    """Format the totals (a chain step after the chord: it gets the callback's result)."""
    return (
        f"{totals['files']} files, {totals['bytes']} bytes, {totals['lines']} lines; "
        f"largest {Path(totals['largest']).name}; digest {totals['digest'][:16]}…"
    )


def local_totals(files: list[str]) -> dict[str, Any]:
    """The same totals computed here, without the queue (to check the workflow's answer)."""
    measured = [measure_file(path) for path in files]
    digest = hashlib.sha256()
    for item in measured:
        digest.update(item["sha256"].encode())
    return {
        "files": len(measured),
        "bytes": sum(item["bytes"] for item in measured),
        "lines": sum(item["lines"] for item in measured),
        "digest": digest.hexdigest(),
    }


async def main(directory: Path) -> int:
    """Apply the workflow, wait for its result, check it; return the exit code."""
    files = sorted(str(p) for p in directory.rglob("*") if p.is_file())
    if not files:
        print(f"no files under {directory}", file=sys.stderr)
        return 1
    worker = Worker(queue, concurrency=16, block_timeout=0.2)
    running = asyncio.create_task(worker.run())
    try:
        started = time.perf_counter()
        workflow = chain(chord([measure.s(path) for path in files], merge.s()), report.s())
        handle = await queue.apply(workflow)
        print(f"workflow {handle.id}: {len(files)} files of {directory}")
        summary = await handle.get(timeout=60)
        elapsed = time.perf_counter() - started
        print(f"{summary}  ({elapsed:.2f} s, status {await handle.status()})")
        # The chord's callback is the last-but-one step; read its record for the totals.
        steps = await handle.children()
        totals = await steps[-2].result(timeout=5)
    finally:
        worker.stop()
        await running
        await queue.close()
    expected = local_totals(files)
    got = {k: totals[k] for k in expected}
    if got != expected:
        print("MISMATCH:\n" + json.dumps({"workflow": got, "local": expected}, indent=2))
        return 1
    print("totals match a local computation")
    return 0


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(json.__file__).parent
    sys.exit(asyncio.run(main(target)))
