"""Run one blitzq worker process for the reliability suite.

Usage::

    python tests/reliability/run_worker.py URL NAMESPACE MODE CONCURRENCY VISIBILITY_TIMEOUT
        [--shutdown-timeout S] [--max-deliveries N] [--block-timeout S] [--fast-task]

``URL`` ``-`` means no URL (the embedded default server, from ``BLITZQ_DATA_DIR``). Once the
worker has prepared its consumer, its pid is added to ``{ns}:obs:ready``. It stops gracefully
on SIGTERM/SIGINT and exits 0 after a graceful stop.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reliability_app import async_redis, build_queue, obs_key

from blitzq import Worker


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("url")
    p.add_argument("namespace")
    p.add_argument("mode", choices=["reliable", "fast"])
    p.add_argument("concurrency", type=int)
    p.add_argument("visibility_timeout", type=float)
    p.add_argument("--shutdown-timeout", type=float, default=5.0)
    p.add_argument("--max-deliveries", type=int, default=5)
    p.add_argument("--block-timeout", type=float, default=0.5)
    p.add_argument("--fast-task", action="store_true", help="register rel.fast_work too")
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    """Build the queue, announce readiness, run the worker until it is stopped."""
    queue = build_queue(
        None if args.url == "-" else args.url,
        args.namespace,
        args.mode,
        args.visibility_timeout,
        args.max_deliveries,
        args.fast_task,
    )

    async def announce() -> None:
        client = async_redis(queue.url)
        try:
            await client.sadd(obs_key(args.namespace, "ready"), os.getpid())
        finally:
            await client.aclose()

    announcing: list[asyncio.Task[None]] = []

    async def announce_later() -> None:
        # Runs once Worker.run first yields, i.e. after its signal handlers are installed,
        # so a test may SIGTERM the worker as soon as it reads the announcement.
        announcing.append(asyncio.get_running_loop().create_task(announce()))

    queue.on_startup.append(announce_later)
    worker = Worker(
        queue,
        concurrency=args.concurrency,
        handle_signals=True,
        shutdown_timeout=args.shutdown_timeout,
        block_timeout=args.block_timeout,
    )
    try:
        await worker.run()
    finally:
        await queue.close()


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    asyncio.run(main(parse(sys.argv[1:])))
