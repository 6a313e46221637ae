"""Testing helpers: the eager mode and a worker harness, also offered as pytest fixtures.

- :func:`eager` / fixture ``blitzq_eager`` (marker ``blitzq_eager(...)`` for its options):
  every Queue of the process runs what it enqueues in-process, on the memory backend, through
  the worker's per-delivery path, before the enqueue returns; delays and retries in virtual
  time; ``result()`` raises a failed task's own exception (:mod:`blitzq.testing.eager`);
- :class:`WorkerHarness` / fixture ``blitzq_worker``: a real Worker on a Queue's own backend
  for an ``async with`` block, with ``await w.drain()`` (:mod:`blitzq.testing.harness`).

The fixtures come from the pytest plugin ``blitzq.testing.pytest_plugin``, registered through
the ``pytest11`` entry point when blitzq is installed: nothing to configure. See
docs/testing.md ("Testing your tasks").
"""

from .eager import EagerMode, eager
from .harness import WorkerHarness, drain

__all__ = ["EagerMode", "WorkerHarness", "drain", "eager"]
