"""The scheduler: dispatch periodic tasks, exactly once per occurrence however many run.

Each :meth:`Scheduler.tick` reads the broker's clock (Redis ``TIME``) and the last dispatched
occurrence of every periodic task, works out which occurrences in ``(last, now]`` to dispatch
under the task's missed-run policy, and dispatches each with the broker's ``claim_periodic``:
one atomic compare-and-set of the stored last occurrence that also publishes the message,
and refuses an occurrence not yet due by the server's clock. A scheduler that loses the race
publishes nothing, so any number of schedulers may run.

One clock: what is due is decided on the broker's clock, never on a scheduler's (a
scheduler whose clock is fast does not dispatch early, one whose clock is slow not late).
The scheduler's own clocks serve only to sleep (``monotonic``) and to stamp messages with
an informational ``enqueued_at`` (``clock``).

Missed-run policies, for the occurrences due since the last dispatched one:

* ``run_once`` (default): dispatch only the newest due occurrence.
* ``run_all``: dispatch each due occurrence, oldest first, but at most the newest
  ``max_catch_up`` (100) of them; older ones are dropped with a warning.
* ``skip``: dispatch the newest due occurrence only if it is at most ``poll_interval + grace``
  seconds old (it is "due now"); older ones are dropped (logged once per occurrence).

Signals (through the Queue's handlers, :mod:`blitzq.extensions.signals`):
``SCHEDULER_STARTED`` and ``SCHEDULER_STOPPED`` around :meth:`Scheduler.run`,
``SCHEDULER_DISPATCHED`` for each claim this scheduler won, ``SCHEDULER_MISSED`` for an
occurrence the policy drops: a ``skip`` entry's late one when found, or the newest one a won
claim skipped over (``run_once``, ``run_all`` past ``max_catch_up``, a forward step).

The entries themselves (:class:`~blitzq.periodic.PeriodicTask`, their validation and their
messages) live in :mod:`blitzq.periodic`; this module re-exports them. Each tick also reads
the run-time entries (``blitzq schedule add``, :mod:`blitzq.runtime_schedules`).

The claim enforces ``run_once`` and ``skip`` on the server's clock too (see
:meth:`Scheduler.claim_until`): an occurrence is refused once a newer one is due (``skip``:
also once it is ``poll_interval + grace`` late), and each entry of a tick is decided on the
broker's time as of that entry. So schedulers frozen together (SIGSTOP, a VM pause), even
half-way through a tick, resume with ``skip`` entries on time and one catch-up per
``run_once`` entry: what was decided before the freeze is not dispatched after it.

A periodic task with no history (never dispatched in this namespace) starts from the moment a
scheduler first sees it: nothing before that is treated as missed.

Clock steps of the broker's clock:

* backwards: a stored last occurrence later than the server's now can only come from a step
  back (each one was due when claimed). The entry restarts from the moment the step is seen,
  so it keeps its real-time spacing (its next occurrence fires) instead of falling silent for
  the length of the step; nothing older than that moment is re-dispatched. A step of at most
  :data:`JUMP_TOLERANCE` (or ``poll_interval``) is waited out instead, so that the usual small
  corrections never dispatch an occurrence twice.
* forwards: the scheduler compares the server time that passed between two ticks with the
  real time that passed (its monotonic clock). A forward step is not downtime: it fires at
  most one catch-up occurrence, whatever the policy. Time the scheduler really did not run
  (down, or never started) is downtime, and the missed-run policy applies.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import logging
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._checks import flag, integer, seconds
from .exceptions import BrokerError, ConfigurationError, SerializationError
from .extensions.signals import Signal, SignalEvent
from .limits import MAX_SECONDS
from .log_episodes import Episode
from .periodic import MissedPolicy, PeriodicTask, periodic_status
from .periodic import as_schedule as as_schedule
from .periodic import build_message as build_message
from .periodic import make_periodic as make_periodic
from .runtime_schedules import RuntimeEntries

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["MissedPolicy", "PeriodicTask", "Scheduler", "periodic_status"]

logger = logging.getLogger("blitzq.scheduler")

#: Seconds before a dispatched occurrence up to which an older one counts as skipped over
#: (``SCHEDULER_MISSED``): occurrences are never this close.
MISSED_EPSILON = 1e-3

#: Server time that may pass beyond real (monotonic) time between two ticks before the
#: difference counts as a forward step of the server's clock (seconds): round trips and
#: scheduling delays on a loaded machine stay well under it.
JUMP_TOLERANCE = 5.0


class Scheduler:
    """Dispatches the periodic tasks of a Queue; run any number of them.

    Args:
        queue: the Queue whose ``periodic_tasks`` to dispatch.
        clock: this process's wall clock (Unix seconds), used only for the informational
            ``enqueued_at`` of the messages; what is due is decided on the broker's clock.
        poll_interval: most seconds between two ticks (also how soon a clock step is
            noticed); a tick also happens right when the next occurrence is due.
        grace: seconds of lateness, beyond ``poll_interval``, after which the ``skip`` policy
            treats an occurrence as missed.
        max_catch_up: most occurrences the ``run_all`` policy dispatches after downtime.
        promote: also move due delayed tasks and retries to their queues on each tick (as
            workers do), so a scheduler alone keeps delayed work flowing.
        handle_signals: stop on SIGTERM / SIGINT (the CLI turns this on).
        monotonic: this process's monotonic clock (seconds), measuring the real time between
            ticks (to sleep, and to tell a forward step of the broker's clock from downtime);
            injectable for tests.

    Raises:
        ConfigurationError: a ``poll_interval`` that is not a finite number of seconds in
            (0, 3600], a non-finite ``grace``, ``max_catch_up`` not an int >= 1, or a bool
            option that is not a bool.
    """

    def __init__(
        self,
        queue: Queue,
        clock: Callable[[], float] = time.time,
        poll_interval: float = 1.0,
        *,
        grace: float = 1.0,
        max_catch_up: int = 100,
        promote: bool = True,
        handle_signals: bool = False,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        poll_interval = seconds("poll_interval", poll_interval, maximum=3600.0)
        grace = seconds("grace", grace, minimum=-MAX_SECONDS, strict=False)
        integer("max_catch_up", max_catch_up, minimum=1)
        flag("promote", promote)
        flag("handle_signals", handle_signals)
        self.queue = queue
        self.clock = clock
        self.poll_interval = float(poll_interval)
        self.grace = max(0.0, float(grace))
        self.max_catch_up = max_catch_up
        self.promote = promote
        self.handle_signals = handle_signals
        self.dispatched = 0
        """Occurrences this scheduler dispatched (won the claim for)."""
        self.monotonic = monotonic
        self._first_seen: dict[str, float] = {}
        #: name -> (stored last occurrence found in the server's future, server time when
        #: that was first seen): the restart point after a backward step.
        self._stepped_back: dict[str, tuple[float, float]] = {}
        #: name -> the newest occurrence a ``skip`` entry dropped (logged once).
        self._skipped: dict[str, float] = {}
        #: name -> the occurrence ``due`` counted from in the current tick (the stored last
        #: one, or where the entry starts or restarts): what a won claim skipped over.
        self._since: dict[str, float] = {}
        #: (server time, monotonic time) of the previous tick.
        self._last_tick: tuple[float, float] | None = None
        self._known_queues: set[str] = set()
        #: (name, problem) of entries whose message could not be made (logged once each).
        self._unbuildable: set[tuple[str, str]] = set()
        self._stopping = False
        #: A claim of the last tick was refused as superseded: tick again at once.
        self._behind = False
        self._wake: asyncio.Event | None = None
        #: The run-time entries (``blitzq schedule add``), read again on each tick.
        self.runtime = RuntimeEntries(queue)

    def __repr__(self) -> str:
        return f"<Scheduler {self.queue.name} entries={len(self.queue.periodic_tasks)}>"

    # ------------------------------------------------------------------- tick
    def due(
        self, entry: PeriodicTask, last: float | None, now: float, jumped: bool = False
    ) -> list[float]:
        """Occurrences of ``entry`` to dispatch at ``now`` after ``last``, per its policy.

        Args:
            entry: the periodic entry.
            last: its last dispatched occurrence, or ``None`` when it has none.
            now: the broker's current time (Unix seconds).
            jumped: the broker's clock stepped forward since the previous tick: dispatch at
                most one (the newest) of the occurrences the step passed over.
        """
        name = entry.name
        if last is None:
            # No history: start from the moment this scheduler first saw the entry.
            last = self._first_seen.setdefault(name, now)
        elif last > now:
            # Claimed occurrences are never in the server's future: its clock stepped back.
            if last - now <= max(JUMP_TOLERANCE, self.poll_interval):
                return []  # a small step: wait it out, so nothing is dispatched twice
            stored, restart = self._stepped_back.get(name, (None, now))
            if stored != last:
                logger.warning(
                    "periodic %s: the broker's clock went back (last run %s, now %s); "
                    "continuing from now",
                    name,
                    _iso(last),
                    _iso(now),
                )
                restart = now
                self._stepped_back[name] = (last, restart)
            last = restart
        if now <= last:
            return []
        self._since[name] = last
        schedule = entry.schedule
        if entry.missed == "run_all" and not jumped:
            found = schedule.latest(last, now, self.max_catch_up + 1)
            if len(found) > self.max_catch_up:
                found = found[1:]
                logger.warning(
                    "periodic %s: more than %d occurrences missed since %s; dispatching the "
                    "newest %d only",
                    name,
                    self.max_catch_up,
                    _iso(last),
                    self.max_catch_up,
                )
            return found
        found = schedule.latest(last, now, 1)
        if found and entry.missed == "skip" and now - found[0] > self.poll_interval + self.grace:
            if self._skipped.get(name) != found[0]:
                self._skipped[name] = found[0]
                logger.info("periodic %s: skipping missed occurrence %s", name, _iso(found[0]))
                self._signal_missed(entry, found[0], None)
            return []
        return found

    def claim_until(self, entry: PeriodicTask, occurrence: float, jumped: bool) -> float | None:
        """The broker time from which the claim of ``occurrence`` is refused, or ``None``.

        ``run_once`` (and any policy after a forward step) dispatches only the newest due
        occurrence: its claim is refused once the next one is due. ``skip`` also refuses it
        once it is more than ``poll_interval + grace`` late. ``run_all`` dispatches every
        due occurrence: no limit. The limit is checked by the claim itself, on the broker's
        clock, so a scheduler paused between its decision and its claim (SIGSTOP, a VM
        pause) cannot dispatch a decision made before the pause.

        Args:
            entry: the periodic entry.
            occurrence: the occurrence to claim (Unix seconds).
            jumped: the broker's clock stepped forward since the previous tick.
        """
        if entry.missed == "run_all" and not jumped:
            return None
        try:
            until = entry.schedule.next_after(occurrence)
        except ConfigurationError:  # no later occurrence: nothing can supersede it
            until = None
        if entry.missed == "skip":
            late = occurrence + self.poll_interval + self.grace
            until = late if until is None else min(until, late)
        return until

    def _forward_step(self, now: float, mono: float) -> bool:
        """Whether the broker's clock ran ahead of real time since the previous tick."""
        previous, self._last_tick = self._last_tick, (now, mono)
        if previous is None:
            return False
        step = (now - previous[0]) - (mono - previous[1])
        if step > max(JUMP_TOLERANCE, self.poll_interval):
            logger.warning(
                "the broker's clock jumped %.1f s ahead of real time; at most one catch-up "
                "run per periodic task",
                step,
            )
            return True
        return False

    async def tick(self) -> int:
        """One pass over every periodic entry at the broker's current time; return how many
        were dispatched.

        Raises:
            BrokerError: the broker could not be reached (nothing is half-dispatched: each
                occurrence is claimed and published atomically).
        """
        queue = self.queue
        broker = queue.broker
        self._behind = False
        runtime = await self.runtime.refresh()  # `blitzq schedule add`: picked up here
        entries = [*queue.periodic_tasks.values(), *runtime.values()]
        dispatched = 0
        if entries:
            await self._remember_queues(entries)
            history = await broker.periodic_last([e.name for e in entries])
            # Read after the history, so every stored occurrence was claimed at or before
            # ``now``: one later than ``now`` then really means the clock stepped back.
            now = await broker.server_time()
            mono = self.monotonic()
            jumped = self._forward_step(now, mono)
            for entry in entries:
                # The broker's time as of this entry (its clock at the read plus the real
                # time since): a tick over many entries, or one paused half-way (SIGSTOP, a
                # VM pause), decides each entry on the time it claims at, not the tick's.
                at = now + max(0.0, self.monotonic() - mono)
                try:
                    due = self.due(entry, history.get(entry.name), at, jumped)
                except ConfigurationError as exc:  # e.g. a cron with no time left
                    logger.warning("periodic %s: %s", entry.name, exc)
                    continue
                for occurrence in due:
                    try:
                        message = build_message(queue, entry, occurrence, self.clock())
                    except (ConfigurationError, SerializationError) as exc:
                        # This entry's message cannot be made (e.g. too large): the others
                        # are dispatched all the same.
                        if isinstance(exc, BrokerError):
                            raise
                        self._unbuildable_entry(entry, exc)
                        break
                    until = self.claim_until(entry, occurrence, jumped)
                    if await broker.claim_periodic(
                        entry.name, occurrence, message, entry.target_queue(), until=until
                    ):
                        dispatched += 1
                        self.dispatched += 1
                        logger.debug("periodic %s: dispatched %s", entry.name, _iso(occurrence))
                        if self.queue.signals:
                            self._signal_dispatched(entry, occurrence, occurrence == due[0])
                    elif until is not None and now + self.monotonic() - mono >= until:
                        # Refused as superseded (the claim came too late): tick again at
                        # once for the newer occurrence instead of sleeping to the next.
                        self._behind = True
        if self.promote:
            await broker.promote_due(1000)
        return dispatched

    def _unbuildable_entry(self, entry: PeriodicTask, exc: Exception) -> None:
        """Log, once per entry and problem, that ``entry``'s message could not be made."""
        key = (entry.name, str(exc))
        if key not in self._unbuildable:
            self._unbuildable.add(key)
            logger.warning("periodic %s is not dispatched: %s", entry.name, exc)

    def _signal_dispatched(self, entry: PeriodicTask, occurrence: float, first: bool) -> None:
        """``SCHEDULER_DISPATCHED`` for a won claim of ``occurrence`` and, for the first of a
        tick (``first``), ``SCHEDULER_MISSED`` for the newest occurrence it skipped over."""
        signals = self.queue.signals
        if signals.has(Signal.SCHEDULER_DISPATCHED):
            event = SignalEvent(
                Signal.SCHEDULER_DISPATCHED,
                entry.task_id(occurrence),
                entry.task.name,
                entry.target_queue(),
                extra={"periodic": entry.name, "occurrence": occurrence},
            )
            signals.emit_soon(Signal.SCHEDULER_DISPATCHED, event)
        since = self._since.get(entry.name)
        if first and since is not None and signals.has(Signal.SCHEDULER_MISSED):
            try:  # the newest occurrence between the previous one and this one, if any
                older = entry.schedule.latest(since, occurrence - MISSED_EPSILON, 1)
            except ConfigurationError:
                older = []
            if older:
                self._signal_missed(entry, older[-1], occurrence)

    def _signal_missed(
        self, entry: PeriodicTask, occurrence: float, dispatched: float | None
    ) -> None:
        """``SCHEDULER_MISSED`` for ``occurrence`` of ``entry``, dropped by its missed-run
        policy (``dispatched``: the newer occurrence dispatched instead, if any)."""
        signals = self.queue.signals
        if signals.has(Signal.SCHEDULER_MISSED):
            extra = {
                "periodic": entry.name,
                "occurrence": occurrence,
                "policy": entry.missed,
                "dispatched": dispatched,
            }
            event = SignalEvent(
                Signal.SCHEDULER_MISSED, None, entry.task.name, entry.target_queue(), extra=extra
            )
            signals.emit_soon(Signal.SCHEDULER_MISSED, event)

    async def _remember_queues(self, entries: list[PeriodicTask]) -> None:
        new = {e.target_queue() for e in entries} - self._known_queues
        if new:
            await self.queue.broker.remember_queues(sorted(new))
            self._known_queues.update(new)

    def next_wakeup(self, now: float) -> float:
        """Seconds to sleep after a tick at ``now`` (the broker's time): up to the next
        occurrence, at most ``poll_interval``."""
        wait = self.poll_interval
        for entry in [*self.queue.periodic_tasks.values(), *self.runtime.entries.values()]:
            try:
                wait = min(wait, entry.schedule.next_after(now) - now)
            except ConfigurationError:
                continue
        return max(0.005, wait)

    # -------------------------------------------------------------- lifecycle
    def stop(self) -> None:
        """Ask :meth:`run` to return; safe from signal handlers and other coroutines."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Tick until :meth:`stop` (or a signal when ``handle_signals``, or cancellation).

        Broker errors are logged and retried on the next tick; they never end the loop.
        """
        self._wake = asyncio.Event()
        if self._stopping:
            return
        loop = asyncio.get_running_loop()
        if self.handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
        names = ", ".join(sorted(self.queue.periodic_tasks)) or "none"
        logger.info("scheduler started: periodic tasks %s", names)
        signals = self.queue.signals
        await self._emit(Signal.SCHEDULER_STARTED, {"periodic": sorted(self.queue.periodic_tasks)})
        failures = Episode(logger, "scheduler tick failed")
        try:
            while not self._stopping:
                try:
                    await self.tick()
                    failures.cleared()
                except Exception as exc:  # broker down, a bug in one entry: keep going
                    failures.failed(exc)  # once while it lasts, not each tick
                wait = self.poll_interval
                if self._behind:
                    wait = 0.005
                elif self._last_tick is not None:  # server-relative: the broker's clock
                    server_now, mono = self._last_tick
                    elapsed = self.monotonic() - mono
                    wait = self.next_wakeup(server_now + elapsed)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
        finally:
            if self.handle_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)
            logger.info("scheduler stopped: %d occurrence(s) dispatched", self.dispatched)
            if signals:
                await signals.drain()  # dispatched / missed handlers still running
                await self._emit(Signal.SCHEDULER_STOPPED, {"dispatched": self.dispatched})

    async def _emit(self, signal: Signal, extra: dict[str, Any]) -> None:
        signals = self.queue.signals
        if signals.has(signal):
            await signals.emit(signal, SignalEvent(signal, extra=extra))


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="seconds")
