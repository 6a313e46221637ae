"""What an idle worker costs the server: commands per second and connections (issue 25).

Starts a private ``redis-server`` (see ``bench.py``; never the shared one), then for each mode
(reliable, fast) and each number of queues (1, 4, 16 by default; every queue has its
``:high`` and ``:low`` levels) runs one ``Worker`` with default settings in a subprocess of its
own, lets it settle (``--settle`` seconds: start-up reads, registration, and the pooled
connections its start opened closing after 30 s unused), and counts the
commands the server ran over ``--seconds`` seconds (``INFO commandstats``, read before and
after; the two reads themselves are taken off) and the connections it holds (``CLIENT LIST``,
the measuring connection taken off). Prints a Markdown table, and per run the busiest
commands on stderr.

    .venv/bin/python bench/idle_cost.py                  # 1/4/16 queues, both modes, ~6 min
    .venv/bin/python bench/idle_cost.py --queues 4 --seconds 10 --modes reliable
"""

from __future__ import annotations

import argparse
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

_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from blitzq import Queue, Worker

    url, ns, mode, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    queue = Queue("q0", redis_url=url, namespace=ns, mode=mode)

    @queue.task(name="noop")
    async def noop() -> int:
        return 1

    async def main() -> None:
        worker = Worker(queue, queues=[f"q{i}" for i in range(n)])
        runner = asyncio.create_task(worker.run())
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        worker.stop()
        await runner

    asyncio.run(main())
    """
)


def _commands(client: redis.Redis) -> dict[str, int]:
    """Calls per command so far (``INFO commandstats``)."""
    stats = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def measure(url: str, mode: str, queues: int, seconds: float, settle: float) -> dict[str, float]:
    """Run one idle worker on ``queues`` queues in ``mode``; its commands/s and connections.

    Returns:
        ``{"commands_per_s", "connections"}`` and the busiest commands' rates.
    """
    ns = f"idle-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(url)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, url, ns, mode, str(queues)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        assert child.stdin is not None
        child.stdout.readline()
        time.sleep(settle)
        before = _commands(client)
        start = time.monotonic()
        time.sleep(seconds)
        after = _commands(client)
        span = time.monotonic() - start
        clients = client.client_list()
        connections = len(clients) - 1
        held = ", ".join(f"{c['cmd']} (idle {c['idle']} s)" for c in clients)
        print(f"{mode} x{queues} connections: {held}", file=sys.stderr)
        child.stdin.write(b"\n")
        child.stdin.flush()
        child.wait(60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    deltas = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    deltas["info"] = deltas.get("info", 0) - 1  # the "after" read; "before" counted itself
    total = sum(v for v in deltas.values() if v > 0)
    out = {"commands_per_s": total / span, "connections": float(connections)}
    for name, calls in sorted(deltas.items(), key=lambda kv: -kv[1])[:6]:
        if calls > 0:
            out[name] = calls / span
    keys = list(client.scan_iter(match="{" + ns + "}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", default="1,4,16", help="numbers of queues, comma-separated")
    parser.add_argument("--modes", default="reliable,fast")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured span per run")
    parser.add_argument(
        "--settle",
        type=float,
        default=35.0,
        help="seconds before measuring (start-up's extra "
        "pooled connections close after 30 s unused)",
    )
    args = parser.parse_args()
    rows = []
    with harness.private_redis() as url:
        for mode in args.modes.split(","):
            for n in (int(x) for x in args.queues.split(",")):
                got = measure(url, mode, n, args.seconds, args.settle)
                busiest = ", ".join(
                    f"{k} {v:.2f}/s"
                    for k, v in got.items()
                    if k not in ("commands_per_s", "connections")
                )
                print(f"{mode} x{n}: {busiest}", file=sys.stderr)
                rows.append((mode, n, got["commands_per_s"], int(got["connections"])))
    print("| mode | queues (x3 levels) | commands/s | connections |")
    print("|---|---|---|---|")
    for mode, n, rate, conns in rows:
        print(f"| {mode} | {n} | {rate:.2f} | {conns} |")


if __name__ == "__main__":
    main()
