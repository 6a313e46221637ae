"""The app of the Docker example: a Queue, two tasks, one periodic task, and a producer.

Every setting comes from the environment (``BLITZQ_REDIS_URL``, ``BLITZQ_NAMESPACE``,
``BLITZQ_WORKER_CONCURRENCY``, ...: see ``compose.yaml``), so the same image runs the worker
(``blitzq worker app:queue``), the scheduler (``blitzq scheduler run app:queue``) and the
producer (``python app.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from blitzq import Queue
from blitzq.schedules import Every

queue = Queue()  # BLITZQ_REDIS_URL and BLITZQ_NAMESPACE decide where it connects


@queue.task(retries=3)
async def checksum(text: str) -> str:
    """The SHA-256 of ``text``, in hex."""
    await asyncio.sleep(0.01)  # stands for I/O
    return hashlib.sha256(text.encode()).hexdigest()


@queue.task
def word_count(text: str) -> int:
    """Words in ``text`` (a sync task: it runs on the worker's thread pool)."""
    return len(text.split())


@queue.periodic(Every(30))
async def heartbeat() -> float:
    """Dispatched by the scheduler every 30 s; returns the time it ran."""
    return time.time()


async def produce(count: int = 20) -> None:
    """Enqueue ``count`` tasks of each kind and print their results."""
    try:
        handles = [await checksum.enqueue(f"document {i}") for i in range(count)]
        handles += [await word_count.enqueue("the quick brown fox " * i) for i in range(count)]
        results = [await h.result(timeout=60) for h in handles]
    finally:
        await queue.close()
    print(f"{len(results)} tasks done; first checksum {results[0][:16]}..., words {results[-1]}")


if __name__ == "__main__":
    asyncio.run(produce())
