"""The pruning of the consumer groups' idle consumers, one stream at a time (issue 25).

Each worker process that reads a stream leaves a consumer in its group; a consumer that has
been idle over ``max(600, 10 * visibility_timeout)`` s and holds nothing is deleted
(``prune.lua``), so a group does not grow by one consumer per worker ever started. A worker's
maintenance rounds prune its streams in turn, one per :func:`prune_gap` seconds at most:
each stream every :data:`PRUNE_EVERY` s with a few queues, and never more than one pruning per
:data:`PRUNE_GAP` s however many queues the worker serves, so an idle worker's cost does not
grow with its queues.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..broker import Broker
from ..exceptions import BrokerError
from .bad_keys import wrong_type

#: Seconds between two prunings of each stream with a few queues (they are pruned after
#: ``max(600, 10 * visibility_timeout)`` s idle, so this keeps the group bounded).
PRUNE_EVERY = 300.0
#: Fewest seconds between two prunings (of one stream each): past ``PRUNE_EVERY /
#: PRUNE_GAP`` streams each is pruned every ``streams x PRUNE_GAP`` s instead.
PRUNE_GAP = 30.0


def prune_gap(streams: int) -> float:
    """Seconds between two prunings of a worker on ``streams`` physical queues (one stream
    each, in turn): each is pruned every :data:`PRUNE_EVERY` s, or every ``streams x``
    :data:`PRUNE_GAP` s when that is longer."""
    return max(PRUNE_EVERY / max(1, streams), PRUNE_GAP)


class Pruning:
    """Which stream a worker prunes next, and when.

    Args:
        broker: the worker's broker (its ``prune_consumers``).
        visibility_timeout: the queue's visibility timeout (seconds); a consumer idle over
            ``max(600, 10 x`` it ``)`` seconds that holds nothing is deleted.
    """

    def __init__(self, broker: Broker, visibility_timeout: float) -> None:
        self.broker = broker
        self.idle = max(600.0, 10 * visibility_timeout)
        #: Streams pruned so far (the next in turn follows the last one).
        self.done = 0
        #: Monotonic time the next pruning is due.
        self.due = time.monotonic()

    async def step(self, levels: Sequence[str]) -> None:
        """Prune the next of ``levels`` (physical queues) in turn when one is due.

        Raises:
            BrokerError: the pruning failed (a key of the wrong type is skipped: the fetch
                loop names it).
        """
        if not levels or time.monotonic() < self.due:
            return
        self.due = time.monotonic() + prune_gap(len(levels))
        queue = levels[self.done % len(levels)]
        self.done += 1
        try:
            await self.broker.prune_consumers(queue, self.idle)
        except BrokerError as exc:
            if not wrong_type(exc):
                raise
