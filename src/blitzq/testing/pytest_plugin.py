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

from ..exceptions import ConfigurationError
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

    A marker with positional arguments, an unknown option or a bad value fails the test's
    setup with a one-line message naming it (no traceback).
    """
    marker = request.node.get_closest_marker("blitzq_eager")
    options: dict[str, Any] = {}
    if marker is not None:
        unknown = sorted(set(marker.kwargs) - set(MARKER_OPTIONS))
        if marker.args or unknown:
            pytest.fail(
                f"@pytest.mark.blitzq_eager takes only the keyword options "
                f"{', '.join(MARKER_OPTIONS)}; got "
                + ", ".join([*map(repr, marker.args), *unknown]),
                pytrace=False,
            )
        options = dict(marker.kwargs)
    activation = eager(**options)
    try:
        mode = activation.__enter__()  # the options are checked here
    except ConfigurationError as exc:
        problem = str(exc)
    else:
        problem = ""
    if problem:
        pytest.fail(f"@pytest.mark.blitzq_eager: {problem}", pytrace=False)
    try:
        yield mode
    finally:
        activation.__exit__(None, None, None)


@pytest.fixture
def blitzq_worker() -> Any:
    """A factory of worker harnesses:
    ``async with blitzq_worker(queue, concurrency=4) as w: ...; await w.drain()`` runs a real
    Worker on the queue's own backend (:class:`blitzq.testing.WorkerHarness`)."""

    def make(queue: Queue, **options: Any) -> WorkerHarness:
        return WorkerHarness(queue, **options)

    return make
