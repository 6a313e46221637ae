"""The one extension mechanism: middleware (which declares the per-task and per-call options
it handles, and observes signals through its ``on_signal`` hook), and the built-in
middleware.

- :mod:`.middleware`: the :class:`~.middleware.Middleware` base, its extension points and the
  narrow :class:`~.middleware.WorkerContext` the worker exposes to it;
- :mod:`.registry`: a Queue's registered middleware and signal handlers, run by the producer
  and the worker;
- :mod:`.signal_events` (the signals and their event) and :mod:`.signals` (where they are
  emitted: the per-signal observers of the chain; ``queue.on`` handlers held by the built-in
  :class:`~.signals.SignalHandlers`);
- built-in middleware, in the order their start checks run: :mod:`.ratelimit`
  (``rate_limit``, ``rate_key``, the Queue's ``queue_rate_limits``), :mod:`.expiry`
  (``max_age``), :mod:`.locks` (``lock``), :mod:`.unique` (``unique``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .middleware import Middleware


@functools.cache
def builtin_middleware() -> tuple[Middleware, ...]:
    """The built-in middleware, one instance each, in the order their start checks run (a
    task waiting for its rate-limit token holds nothing else; an expired task takes no lock;
    a locked-out task keeps its unique key until it starts)."""
    from .expiry import Expiry
    from .locks import Locks
    from .ratelimit import RateLimits
    from .unique import Unique

    return (RateLimits(), Expiry(), Locks(), Unique())


__all__ = ["builtin_middleware"]
