"""Run one chaos-suite process: a worker or a scheduler.

Usage::

    python tests/chaos/run_chaos.py ROLE URL OBSERVE_URL NAMESPACE [--concurrency N]
        [--visibility-timeout S] [--queues A,B,...]

``ROLE`` is ``worker`` or ``scheduler``. ``URL`` is the broker URL the process uses (a fault
proxy, or the server itself); ``OBSERVE_URL`` the server itself (observations). A worker
consumes ``--queues`` (comma-separated; default: the Queue's own). Once started
the pid is added to ``{ns}:chaos:ready``. SIGTERM/SIGINT stop it gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chaos_app import build_queue, key, log_claims

from blitzq import Worker
from blitzq.scheduler import Scheduler


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("role", choices=["worker", "scheduler"])
    p.add_argument("url")
    p.add_argument("observe_url")
    p.add_argument("namespace")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--visibility-timeout", type=float, default=2.0)
    p.add_argument("--queues", default="", help="queues a worker consumes, comma-separated")
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    """Build the queue, announce readiness, run until stopped."""
    queue, observer = build_queue(
        args.url, args.namespace, args.observe_url, args.visibility_timeout
    )

    async def announce() -> None:
        await observer.write(("SADD", key(args.namespace, "ready"), str(os.getpid())))

    try:
        if args.role == "worker":
            announcing: list[asyncio.Task[None]] = []

            async def announce_later() -> None:
                # Runs once Worker.run is under way (its signal handlers are installed).
                announcing.append(asyncio.get_running_loop().create_task(announce()))

            queue.on_startup.append(announce_later)
            worker = Worker(
                queue,
                concurrency=args.concurrency,
                handle_signals=True,
                shutdown_timeout=5.0,
                block_timeout=0.5,
                queues=[q for q in args.queues.split(",") if q] or None,
            )
            await worker.run()
        else:
            log_claims(queue, observer)
            scheduler = Scheduler(queue, poll_interval=0.5, handle_signals=True)
            runner = asyncio.ensure_future(scheduler.run())
            await asyncio.sleep(0)  # let run() install its signal handlers first
            await announce()
            await runner
    finally:
        await observer.close()
        await queue.close()


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {os.getpid()} %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    asyncio.run(main(parse(sys.argv[1:])))
