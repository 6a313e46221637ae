"""blitzq's pytest plugin (entry point ``pytest11``): the fixtures ``blitzq_eager`` and
``blitzq_worker`` (see :mod:`blitzq.testing`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..queue import Queue
from .eager import EagerMode, eager
from .harness import WorkerHarness


@pytest.fixture
def blitzq_eager() -> Iterator[EagerMode]:
    """While the test runs, every Queue of the process runs what it enqueues in-process,
    on the memory backend, before the enqueue returns (:func:`blitzq.testing.eager`)."""
    with eager() as mode:
        yield mode


@pytest.fixture
def blitzq_worker() -> Any:
    """A factory of worker harnesses:
    ``async with blitzq_worker(queue, concurrency=4) as w: ...; await w.drain()`` runs a real
    Worker on the queue's own backend (:class:`blitzq.testing.WorkerHarness`)."""

    def make(queue: Queue, **options: Any) -> WorkerHarness:
        return WorkerHarness(queue, **options)

    return make
