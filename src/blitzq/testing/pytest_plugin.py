"""blitzq's pytest plugin (entry point ``pytest11``): the fixtures ``blitzq_eager`` and
``blitzq_worker`` (see :mod:`blitzq.testing`), and the marker ``blitzq_eager`` that sets the
eager mode's options for one test (or a module, through ``pytestmark``)::

    @pytest.mark.blitzq_eager(propagate=False)   # result() raises TaskFailed, as in production
    def test_failure_is_recorded(blitzq_eager): ...
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ..queue import Queue
from .eager import EagerMode, eager
from .harness import WorkerHarness

#: The options the ``blitzq_eager`` marker takes (those of :func:`blitzq.testing.eager`).
MARKER_OPTIONS = ("horizon", "concurrency", "timeout", "propagate")


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``blitzq_eager`` marker (so ``--strict-markers`` accepts it)."""
    config.addinivalue_line(
        "markers",
        "blitzq_eager(propagate=True, horizon=600.0, concurrency=10, timeout=60.0): options of "
        "the blitzq_eager fixture for this test (blitzq.testing.eager)",
    )


@pytest.fixture
def blitzq_eager(request: pytest.FixtureRequest) -> Iterator[EagerMode]:
    """While the test runs, every Queue of the process runs what it enqueues in-process,
    on the memory backend, before the enqueue returns (:func:`blitzq.testing.eager`).

    Options come from the test's closest ``@pytest.mark.blitzq_eager(...)`` (keyword
    arguments of :func:`~blitzq.testing.eager`); ``propagate`` can also be changed on the
    mode the fixture yields (``blitzq_eager.propagate = False``).

    Raises:
        pytest.UsageError: the marker has positional arguments or an unknown option.
    """
    marker = request.node.get_closest_marker("blitzq_eager")
    options: dict[str, Any] = {}
    if marker is not None:
        unknown = sorted(set(marker.kwargs) - set(MARKER_OPTIONS))
        if marker.args or unknown:
            raise pytest.UsageError(
                f"@pytest.mark.blitzq_eager takes keyword options {', '.join(MARKER_OPTIONS)}; "
                f"got {marker.args!r} {unknown!r}"
            )
        options = dict(marker.kwargs)
    with eager(**options) as mode:
        yield mode


@pytest.fixture
def blitzq_worker() -> Any:
    """A factory of worker harnesses:
    ``async with blitzq_worker(queue, concurrency=4) as w: ...; await w.drain()`` runs a real
    Worker on the queue's own backend (:class:`blitzq.testing.WorkerHarness`)."""

    def make(queue: Queue, **options: Any) -> WorkerHarness:
        return WorkerHarness(queue, **options)

    return make
