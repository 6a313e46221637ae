"""A Queue whose one sync task blocks past its hard timeout (``blitzq worker`` subprocess
tests of abandoned threads)."""

from __future__ import annotations

import time

from blitzq import Queue

#: The application's Queue; the command line sets URL and namespace.
queue = Queue("hang")


@queue.task(timeout=0.3, retries=0)
def hang(seconds: float) -> None:
    """Block the thread ``seconds`` seconds (past the 0.3 s hard timeout)."""
    time.sleep(seconds)
