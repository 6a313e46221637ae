"""Polling a condition from synchronous test code (processes, raw Redis clients).

One helper for every harness (``reliability/``, ``chaos/``, the CLI and scheduler
subprocess tests): wait for an event with a generous deadline, never "sleep long enough"
(docs/testing.md). A test module that also runs as a worker script
(``reliability/test_chord_crash.py``) cannot import ``tests`` and keeps its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy;
    return that value.

    Args:
        predicate: called with no arguments; any truthy answer ends the wait.
        timeout: seconds to wait at most.
        what: what is awaited, for the failure message.
        interval: seconds between two calls.

    Raises:
        AssertionError: ``timeout`` seconds passed first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for: {what}")
        time.sleep(interval)
