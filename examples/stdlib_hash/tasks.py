"""The demo's task: hash one file.

Both sides import this module: ``run_demo.py`` enqueues ``hash_file`` calls, and the worker
loads the same Queue with ``python -m blitzq worker examples.stdlib_hash.tasks:queue``.

No ``redis_url`` is given, so (unless ``BLITZQ_REDIS_URL`` is set) the Queue starts or reuses
the embedded Valkey server whose data lives in ``./.blitzq``.
"""

from __future__ import annotations

import hashlib
from typing import Any

from blitzq import Queue, RetryPolicy

#: The demo's own key namespace, so it never touches another app's queues on the same server.
NAMESPACE = "stdlib-hash-demo"

# Records (results) are kept an hour, not the default day: each run stores one per file.
queue = Queue("files", namespace=NAMESPACE, mode="reliable", result_ttl=3600)


@queue.task(
    # A file that cannot be read is tried three times in all (two retries, 0.2 s then up to
    # 0.4 s apart), then dead-lettered with its error.
    retries=2,
    retry_policy=RetryPolicy(base=0.2, factor=2.0, max_delay=1.0),
)
def hash_file(path: str) -> dict[str, Any]:
    """Return the SHA-256 (hex), size in bytes and line count of the file at ``path``.

    A plain (sync) function, so the worker runs it on its thread pool.

    Raises:
        OSError: the path is missing, a directory, or unreadable (the task is then retried).
    """
    digest = hashlib.sha256()
    size = lines = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            digest.update(chunk)
            size += len(chunk)
            lines += chunk.count(b"\n")
    return {"path": path, "sha256": digest.hexdigest(), "bytes": size, "lines": lines}
