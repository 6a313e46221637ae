"""A program that enqueues through RabbitMQ and never closes its Queue (the README's
Quick start does not) exits cleanly: the AMQP connection is closed as the event loop shuts
down, so no ``Task was destroyed but it is pending!`` / ``Event loop is closed`` noise
reaches its stderr, from the async API or the sync one."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from blitzq import Queue
from tests.amqp_server import amqp_or_skip, delete_amqp_queues

pytestmark = pytest.mark.timeout(120)

SRC = str(Path(__file__).resolve().parents[2] / "src")

PROGRAM = """
import asyncio, sys
from blitzq import Queue

queue = Queue("exit", redis_url=sys.argv[1], namespace=sys.argv[2], amqp_url=sys.argv[3])

@queue.task(name="exit.add")
async def add(a: int, b: int) -> int:
    return a + b

async def main() -> None:
    print((await add.enqueue(1, 2)).id)

if sys.argv[4] == "async":
    asyncio.run(main())
else:
    print(add.enqueue_sync(1, 2).id)
"""


@pytest.mark.parametrize("api", ["async", "sync"])
async def test_a_producer_that_never_closes_its_queue_exits_cleanly(
    tmp_path: Path, server_url: str, namespace: str, api: str
) -> None:
    url = amqp_or_skip()
    script = tmp_path / "producer.py"
    script.write_text(textwrap.dedent(PROGRAM))
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(script), server_url, namespace, url, api],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )
    try:
        assert done.returncode == 0, done.stderr
        assert len(done.stdout.strip()) == 24  # the task id: the enqueue went through
        assert "Task was destroyed" not in done.stderr
        assert "Event loop is closed" not in done.stderr
        assert "Traceback" not in done.stderr
    finally:
        q = Queue("exit", redis_url=server_url, namespace=namespace, amqp_url=url)
        await q.broker.publish("exit", [])  # declares nothing; records what to delete
        await q.broker.prepare_consumer(["exit"], "cleanup")
        await delete_amqp_queues(url, [q.broker])
        await q.close()
