"""An idle worker's wake-up on a Redis Cluster: arrivals announced on the event channel.

On one server an idle worker blocks on all its queues in one command (``blocking.py``). A
cluster refuses a command whose keys are in several slots (``CROSSSLOT``), and the spread
layout gives each queue a slot of its own, so a blocking read covers one queue: a worker on N
queues would hold N blocked connections and send N reads per block. Instead, on a cluster:

1. the worker looks at each queue's levels once, without blocking, and in the same script
   (``idle_look.lua``, in the queue's slot) marks the queue *watched* (``{..}:idle:<queue>``,
   a key that lapses :data:`WATCH_TTL` seconds later) when they are empty;
2. every write of a message into a queue's stream (an enqueue: ``publish_ring.lua``; a
   relay's hand-off, a requeue, a recovery: ``SpreadStreamsTransport.ring``) announces it
   on the namespace's event
   channel (``ready:<queue>``, a ``PUBLISH`` a cluster forwards to every node) when the
   queue is watched, and only then: a busy queue's enqueues publish nothing once its mark
   lapsed;
3. the worker waits on this :class:`Doorbell`, rung by its event listener (one pub/sub
   connection it holds anyway), then looks again at the queues rung (at all of them after
   the listener subscribed again: a push may have been missed while it was not subscribed).

An idle worker's cost does not grow with its queues: a queue whose last look left it watched
and that no ring named since is not looked at again by the next read (the doorbell keeps
which, :attr:`Doorbell.looked`), so a read costs nothing until a ring. A safety look (a
write that did not ring, a mark lost with a failed-over node) takes the queue looked at
least recently, one every :func:`revisit_gap` seconds: each queue every
:data:`IDLE_BLOCK` seconds when the worker has a few, every ``queues x``
:data:`REVISIT_GAP` seconds past :data:`IDLE_BLOCK` / :data:`REVISIT_GAP` queues, so at most
one look per :data:`REVISIT_GAP` seconds, whatever the number of queues.

No arrival is missed: the look and the mark are one step in the queue's slot, and a writer
reads the mark after its write in one step too, so either the look sees the message or the
writer sees the mark. A push lost with the listener's connection is covered by the look
made when it subscribes again. While the listener is not subscribed the doorbell is not
*armed*: the worker then looks every ``block_timeout`` as a poll would. On the spread layout
every write into a queue rings: an enqueue, a relay's hand-off (delays, retries, periodic
tasks, workflow steps), a requeue in a completion and a recovery's re-add (the last two
from the client, after the write). A write that does not ring (a hand-made ``XADD``) waits
for an idle worker's safety look of its queue (:func:`revisit_period`; a busy worker reads
it at its next fetch). Only the spread layout needs this: ``?layout=slot`` keeps every stream in the
namespace's slot, and blocks on all of them in one read as a single server does
(``blocking.NodePool``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from ...routing import base_queue
from .keys import GROUP

#: Seconds between two safety looks of one queue by an idle worker on a cluster with a few
#: queues (:func:`revisit_period`): every write into a queue on the spread layout rings, so
#: this only bounds a message that reached a stream some other way (a hand-made XADD) or
#: whose queue's mark was lost, and how stale the looks' view of which queues hold anything
#: (for recovery) may get.
IDLE_BLOCK = 120.0
#: Fewest seconds between two safety looks of an idle worker (of one queue each), so that
#: their cost stays flat in the number of queues: about 6 commands (a look at 3 levels) per
#: 15 s at most.
REVISIT_GAP = 15.0
#: Fewest seconds a queue stays watched after the last look that found it empty (it stays
#: twice :func:`revisit_period`: a worker looks again before it lapses; a ring deletes it at
#: once anyway).
WATCH_TTL = 2 * IDLE_BLOCK
#: The event channel's kind letter of an arrival (``<letter>:<queue>``).
READY = "q"


def revisit_period(queues: int) -> float:
    """Seconds between two safety looks of each of ``queues`` queues by an idle worker:
    :data:`IDLE_BLOCK`, or ``queues x`` :data:`REVISIT_GAP` when that is longer."""
    return max(IDLE_BLOCK, queues * REVISIT_GAP)


def revisit_gap(queues: int) -> float:
    """Seconds between two safety looks (of one queue each) of an idle worker on ``queues``
    queues: :func:`revisit_period` shared among them, at least :data:`REVISIT_GAP`."""
    return revisit_period(queues) / max(1, queues)


def watch_ttl(queues: int) -> float:
    """Seconds a look's watch mark lives, for a worker on ``queues`` queues: twice
    :func:`revisit_period`, at least :data:`WATCH_TTL`."""
    return max(WATCH_TTL, 2 * revisit_period(queues))


class Read:
    """The rings one idle read has heard since it started looking (:meth:`Doorbell.start`)."""

    def __init__(self) -> None:
        self.rung: set[str] = set()
        self.everything = False
        self.woken = False
        self.waiting = False
        self.event = asyncio.Event()


class Doorbell:
    """Which queues were announced while each idle read looked or waited, and a way to wake
    those reads.

    One per connection; the event listener rings it (:meth:`ring`), the transport's idle
    reads wait on it (:meth:`wait`), each with rings of its own (two workers in one process
    may read at once).
    """

    def __init__(self) -> None:
        self._reads: set[Read] = set()
        #: Whether the event listener is subscribed (pushes are heard): only then may an
        #: idle read wait longer than ``block_timeout``.
        self.armed = False
        #: Base queues watched since a look found them empty (loop time of that look, set
        #: when it started): no ring named them since, so a read need not look again.
        self.looked: dict[str, float] = {}
        #: Loop time of the last safety look (the next is due :func:`revisit_gap` later).
        self.revisited = -math.inf
        self._turns = 0

    @property
    def waiting(self) -> bool:
        """Whether an idle read waits for a ring now (its looks done)."""
        return any(read.waiting for read in self._reads)

    def ring(self, queue: str | None) -> None:
        """``queue`` (a base queue) got a message; ``None``: any queue may have (look at
        all)."""
        if queue is None:
            self.looked.clear()
        else:
            self.looked.pop(queue, None)
        for read in self._reads:
            if queue is None:
                read.everything = True
            else:
                read.rung.add(queue)
            read.event.set()

    def arm(self, on: bool) -> None:
        """The event listener subscribed (``True``: rings every queue, a push may have been
        missed before) or lost its subscription (``False``: what was looked at is
        forgotten, its rings may go unheard)."""
        self.armed = on
        if on:
            self.ring(None)
        else:
            self.looked.clear()

    def next_revisit(self, queues: int) -> float:
        """Loop time the next safety look of a read of ``queues`` base queues is due."""
        return self.revisited + revisit_gap(queues)

    def to_look(self, queues: Collection[str], now: float, vacant: Mapping[str, bool]) -> list[str]:
        """Which of ``queues`` (base queues) a read starting at loop time ``now`` looks at:
        all of them while not :attr:`armed`; else those not watched since a look
        (:attr:`looked`), and, when a safety look is due, the one looked at least recently
        (the next one is due :meth:`next_revisit`). Every other safety look
        goes first to a queue whose last look found messages (``vacant`` false: recovery
        rounds read it until a look finds it empty) if that look is :data:`IDLE_BLOCK` s
        old."""
        if not self.armed:
            return list(queues)
        out = [q for q in queues if q not in self.looked]
        if now >= self.next_revisit(len(queues)):
            self.revisited = now
            self._turns += 1
            kept = [q for q in queues if q in self.looked]
            held = [q for q in kept if not vacant.get(q) and now - self.looked[q] >= IDLE_BLOCK]
            pool = held if held and self._turns % 2 else kept
            if pool:
                out.append(min(pool, key=self.looked.__getitem__))
        return out

    def start(self) -> Read:
        """A read starts looking: the rings from now on are kept for it."""
        read = Read()
        self._reads.add(read)
        return read

    def end(self, read: Read) -> None:
        """The read ended."""
        self._reads.discard(read)

    def wake(self) -> bool:
        """End the idle reads in flight (:meth:`wait` returns ``None``, at once when a read
        is still looking); ``False`` when none is."""
        for read in self._reads:
            read.woken = True
            read.event.set()
        return bool(self._reads)

    async def wait(self, read: Read, queues: Collection[str], timeout: float) -> set[str] | None:
        """Wait up to ``timeout`` seconds for a ring of one of ``queues`` heard by ``read``.

        Returns:
            the queues of ``queues`` rung (all of them after a ring of every queue), an
            empty set at the timeout, ``None`` when woken (:meth:`wake`).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        read.waiting = True
        try:
            while True:
                read.event.clear()
                if read.woken:
                    read.woken = False
                    return None
                if read.everything:
                    read.everything = False
                    read.rung.clear()
                    return set(queues)
                hit = read.rung.intersection(queues)
                if hit:
                    read.rung.difference_update(hit)
                    return hit
                left = deadline - loop.time()
                if left <= 0:
                    return set()
                try:
                    await asyncio.wait_for(read.event.wait(), left)
                except TimeoutError:
                    return set()
        finally:
            read.waiting = False


async def look_then_wait(
    conn: Any,
    consumer: str,
    queues: Sequence[str],
    timeout: float,
    vacant: dict[str, bool],
) -> list[tuple[str, bytes, list[bytes]]]:
    """An idle worker's read of ``queues`` (physical queues, priority levels of one or more
    base queues) on a cluster: look at the base queues :meth:`Doorbell.to_look` names
    (``idle_look.lua``, which marks each watched when its levels have nothing new), then wait
    for a ring of one of them and look at those again, until one look takes a message or the
    wait ends.

    Args:
        conn: the :class:`~.connection.RedisConnection` (its ``doorbell``, ``scripts`` and
            ``keys``).
        consumer: this worker's consumer name in the groups.
        queues: the physical queues, most urgent level first within each base queue.
        timeout: seconds to wait when the doorbell is not armed (the worker's
            ``block_timeout``; every queue is looked at each time); armed, the wait lasts
            until the next safety look is due (:func:`revisit_gap`; rings end it).
        vacant: set for each base queue looked at: whether its streams hold nothing at
            all (no message waiting or in flight: nothing a recovery could find).

    Returns:
        ``(physical queue, entry id, fields)`` of at most one entry per level, in the order
        of ``queues``; nothing at the end of the wait or when woken.

    Raises:
        redis.exceptions.RedisError: a look failed.
    """
    bell: Doorbell = conn.doorbell
    levels: dict[str, list[str]] = {}
    for q in queues:
        levels.setdefault(base_queue(q), []).append(q)
    loop = asyncio.get_running_loop()
    read = bell.start()  # before choosing what to look at: a ring from now on is heard
    try:
        now = loop.time()
        looking = bell.to_look(levels, now, vacant)
        deadline = now + timeout
        if bell.armed:  # until the next safety look is due (the next read makes it)
            deadline = max(deadline, bell.next_revisit(len(levels)))
        return await _look_and_wait(conn, read, consumer, queues, levels, looking, deadline, vacant)
    finally:
        bell.end(read)


async def _look_and_wait(
    conn: Any,
    read: Read,
    consumer: str,
    queues: Sequence[str],
    levels: dict[str, list[str]],
    looking: Collection[str],
    deadline: float,
    vacant: dict[str, bool],
) -> list[tuple[str, bytes, list[bytes]]]:
    """:func:`look_then_wait` once ``read`` hears the rings, ``looking`` the base queues to
    look at first."""
    bell: Doorbell = conn.doorbell
    loop = asyncio.get_running_loop()
    ttl = str(int(watch_ttl(len(levels)) * 1000))
    while True:
        out: list[tuple[str, bytes, list[bytes]]] = []
        for base in looking:
            names = levels[base]
            keys = [conn.keys.idle(base), *(conn.keys.stream(n) for n in names)]
            # Noted before the look: a ring heard while it runs forgets it again.
            bell.looked[base] = loop.time()
            try:
                reply = await conn.scripts.call("idle_look", keys=keys, args=[GROUP, consumer, ttl])
            except BaseException:
                bell.looked.pop(base, None)
                raise
            if int(reply[0]) == 0:
                vacant[base] = int(reply[1]) == 0
                continue
            bell.looked.pop(base, None)  # it took messages: not watched
            vacant[base] = False
            for j in range(1, len(reply) - 2, 3):
                out.append((names[int(reply[j]) - 1], reply[j + 1], reply[j + 2]))
        if out:
            order = {q: i for i, q in enumerate(queues)}
            return sorted(out, key=lambda row: order[row[0]])
        left = deadline - loop.time()
        if left <= 0:
            return []
        rung = await bell.wait(read, levels, left)
        if not rung:  # woken (None) or the wait ended (empty)
            return []
        looking = [b for b in levels if b in rung]
