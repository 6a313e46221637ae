"""Worker processes on one queue: how the drain scales from one process to two, and what
saturates (issue 13).

Starts a private ``redis-server`` (see ``bench.py``), enqueues ``--tasks`` no-op tasks
(reliable mode, results stored) and drains them with 1, then 2 worker processes
(``Worker(queue, concurrency=200)`` each, a fresh process per run), alternately, ``--reps``
times. Each worker process is started and made ready (imports, queue, worker built) before
the clock starts; the clock stops when the broker shows every task acked and the last
record written. For each run it prints tasks/s and, over the same span, the CPU each side
used (user + system seconds from ``/proc/<pid>/stat`` for the workers, ``INFO cpu`` for
Redis) as a share of the wall time, and Redis's busiest commands (``INFO commandstats``):
the profile that says which resource saturates. ``--profile`` also runs cProfile in the
first worker of the two-worker run and prints its top frames.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench as harness  # noqa: E402  (its private server)

from blitzq import Queue  # noqa: E402
from blitzq.broker.redis.keys import GROUP, Keys  # noqa: E402

_CHILD = textwrap.dedent(
    """
    import asyncio, cProfile, os, pstats, sys
    from blitzq import Queue, Worker

    url, ns, profile = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    queue = Queue("default", redis_url=url, namespace=ns, mode="reliable")

    @queue.task(name="noop")
    async def noop() -> int:
        return 1

    async def main() -> None:
        worker = Worker(queue, concurrency=200)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        prof = cProfile.Profile() if profile else None
        if prof:
            prof.enable()
        runner = asyncio.create_task(worker.run())
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        worker.stop()
        await runner
        if prof:
            prof.disable()
            stats = pstats.Stats(prof, stream=sys.stderr)
            stats.sort_stats("tottime").print_stats(25)

    asyncio.run(main())
    """
)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _done(client: redis.Redis, keys: Keys, last_id: str) -> bool:
    stream = keys.stream("default")
    if client.xlen(stream):
        return False
    if client.xpending(stream, GROUP)["pending"]:
        return False
    return bool(client.exists(keys.record(last_id)))


def one_run(url: str, workers: int, n: int, profile: bool) -> dict[str, float]:
    """Drain ``n`` tasks with ``workers`` processes; rates, CPU shares and commandstats."""
    ns = "two-" + uuid.uuid4().hex[:8]
    queue = Queue("default", redis_url=url, namespace=ns, mode="reliable")
    task = queue.task(name="noop")(_noop)

    async def fill() -> str:
        handles = []
        for start in range(0, n, 1000):
            handles += await task.enqueue_many([()] * min(1000, n - start))
        await queue.close()
        return handles[-1].id

    last_id = asyncio.run(fill())
    env = dict(
        os.environ,
        PYTHONPATH=f"{HERE.parent / 'src'}{os.pathsep}" + os.environ.get("PYTHONPATH", ""),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, url, ns, "1" if profile and i == 0 else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if profile else subprocess.DEVNULL,
            text=True,
            env=env,
        )
        for i in range(workers)
    ]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "ready"
    client = redis.Redis.from_url(url)
    keys = Keys(ns)
    client.config_resetstat()
    s0, c0 = _server_cpu(client), [_cpu_seconds(p.pid) for p in procs]
    t0 = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    while not _done(client, keys, last_id):
        time.sleep(0.002)
    wall = time.perf_counter() - t0
    s1, c1 = _server_cpu(client), [_cpu_seconds(p.pid) for p in procs]
    stats = client.info("commandstats")
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("stop\n")
        p.stdin.flush()
    for p in procs:
        p.wait(timeout=60)
    for key in client.scan_iter(match="{" + ns + "}*", count=5000):
        client.delete(key)
    top = sorted(stats.items(), key=lambda kv: -kv[1]["usec"])[:4]
    out = {
        "rate": n / wall,
        "redis": (s1 - s0) / wall,
        "workers": sum(b - a for a, b in zip(c0, c1, strict=True)) / wall,
    }
    out["top"] = ", ".join(f"{k[8:]} {v['usec'] / 1e3 / wall / 10:.0f}%" for k, v in top)  # type: ignore[assignment]
    client.close()
    return out


async def _noop() -> int:
    return 1


def main() -> None:
    """Parse arguments, run the pairs, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=60000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile one worker of two")
    args = parser.parse_args()
    rows: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with harness.private_redis() as url:
        for rep in range(args.reps):
            for workers in (1, 2) if rep % 2 == 0 else (2, 1):
                r = one_run(url, workers, args.tasks, args.profile and workers == 2 and rep == 0)
                rows[workers].append(r)
                print(
                    f"rep {rep + 1}, {workers} worker(s): {r['rate']:,.0f}/s, CPU: workers "
                    f"{r['workers']:.2f}, Redis {r['redis']:.2f} (of 2 cores); Redis busiest: "
                    f"{r['top']}",
                    file=sys.stderr,
                )
    print(
        "| worker processes | tasks/s | worker CPU (cores) | Redis CPU (cores) "
        "| worker CPU per task | Redis CPU per task | 2 cores / CPU per task |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for workers, runs in rows.items():
        med = {
            k: statistics.median(float(r[k]) for r in runs) for k in ("rate", "workers", "redis")
        }
        w_us = statistics.median(1e6 * float(r["workers"]) / float(r["rate"]) for r in runs)
        r_us = statistics.median(1e6 * float(r["redis"]) / float(r["rate"]) for r in runs)
        print(
            f"| {workers} | {med['rate']:,.0f} | {med['workers']:.2f} | {med['redis']:.2f} "
            f"| {w_us:.1f} us | {r_us:.1f} us | {2e6 / (w_us + r_us):,.0f}/s |"
        )
    ratios = [b["rate"] / a["rate"] for a, b in zip(rows[1], rows[2], strict=True)]
    each = ", ".join(f"{x:.2f}" for x in ratios)
    load = os.getloadavg()[0]
    print(f"\n2 workers / 1 worker, median of pairs: {statistics.median(ratios):.2f} ({each}); ")
    print(f"load average at the end {load:.2f}")


if __name__ == "__main__":
    main()
