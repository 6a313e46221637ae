"""Run N worker processes and keep them running: ``blitzq worker MODULE:ATTR --workers N``.

Each worker is a fresh interpreter running the single-worker command line
(``python -m blitzq worker … --workers 1``), started with :func:`subprocess.Popen`: the
application module is imported from scratch in every worker (no fork of an interpreter that
already holds threads, event loops or connections), a crash stays in its process, and what runs
under the supervisor is exactly what runs without it.

The supervisor

- restarts a worker that exits while no stop was asked, after a short backoff
  (0.25 s, 0.5 s, 1 s, … at most 5 s), and gives up on a slot after ``max_restarts`` restarts
  within ``restart_window`` seconds (a rolling window; an error is logged; the other slots go
  on; when every slot has given up the supervisor exits 1). Only the deaths of workers that
  made no progress count: a worker that got a task done (it writes a byte to a second pipe,
  ``BLITZQ_PROGRESS``, once the completion of its first run was applied:
  :func:`~blitzq.worker.heartbeat.progress_mark`) is restarted after the shortest delay,
  uncounted, and the slot's count starts over (:class:`~blitzq.worker.restarts.RestartBudget`),
  so poison tasks killing workers now and then never exhaust the budget; a crash loop (a
  worker that cannot start or cannot get one task done) does. A worker that exits with code 2
  (a usage error) or 78 (``EXIT_CONFIG``, a configuration error) is not restarted: that would
  fail again; when every slot stopped so, the supervisor exits with that code. A worker that
  exits with
  code 75 (``EXIT_RESTART``: it stopped gracefully to be replaced, e.g. too many threads
  abandoned at their hard timeout) is a *planned* restart, not a crash: it is logged as such,
  does not count toward the restart budget, and is restarted at most once per
  ``PLANNED_RESTART_INTERVAL`` (1 s) per slot, so it cannot spin hot. A worker that exits
  with code 71 (``EXIT_FORKSERVER``: its CPU pool's forkserver could not fork,
  :mod:`~blitzq.worker.cpu`) is answered with a fresh worker, logged as such, counted as a
  crash (a fork the OS keeps refusing ends in the slot giving up);
- replaces a worker whose heartbeat stops (:mod:`~blitzq.worker.heartbeat`: a byte its event
  loop writes to a pipe every ``heartbeat_timeout / 5`` seconds, at most 1 s): no beat for
  ``heartbeat_timeout`` seconds (before the first beat: ``max(heartbeat_timeout,
  STARTUP_GRACE)`` seconds after the start) means a stopped process or a blocked event loop;
  the worker's process group is SIGKILLed and the slot restarted as after a crash. A turn of
  the supervisor's own loop that came far later than it asked for (the whole host or the
  supervisor was paused: a VM freeze, a suspend, SIGSTOP; :mod:`~blitzq.stall_clock`)
  judges no one: every worker gets a fresh heartbeat grace (one WARNING says how long the
  supervisor was paused), and the deadlines of a stop shift by the pause;
- forwards SIGTERM / SIGINT to every worker (a graceful stop), waits for them, SIGKILLs what is
  left ``shutdown_timeout + 5`` seconds after the signal, and exits 0. A second signal kills at
  once;
- leaves no orphan: every worker leads its own process group, which the supervisor SIGKILLs
  when the worker ends; a worker dies with the supervisor, and a small *guard* process takes
  the workers' process groups down with a SIGKILLed supervisor (see
  :mod:`~blitzq.worker.processes`);
- reloads every worker on SIGHUP or :meth:`Supervisor.reload` (``--reload``,
  :mod:`~blitzq.worker.reload`): a new worker starts in each slot and the old one gets
  SIGTERM (it finishes what it runs); and with ``autoscale`` adds and removes slots as
  :mod:`~blitzq.worker.autoscale` decides from the samples of
  :mod:`~blitzq.worker.sampler`, a removed worker stopping the same graceful way.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

from ..stall_clock import StallClock, heartbeat_slack
from .autoscale import Autoscaler, AutoscaleSettings, Sample
from .cpu import EXIT_FORKSERVER
from .elastic import Elastic, _Slot
from .heartbeat import HEARTBEAT_ENV, PROGRESS_ENV
from .identity import SUPERVISOR_ENV
from .ports import PORT_WAIT_ENV, SLOT_ENV
from .processes import Guard, _prctl, die_with_parent, group_alive, killpg, signal_name
from .reload import SourceWatcher
from .restarts import RestartBudget
from .sampler import Sampler
from .worker import EXIT_RESTART

__all__ = ["Supervisor"]

logger = logging.getLogger("blitzq.supervisor")

#: Exit code of a worker that hit a usage error (never restarted).
EXIT_USAGE = 2
#: Exit code of a worker that hit a configuration error (``EX_CONFIG``; never restarted).
EXIT_CONFIG = 78
#: Seconds a new worker has for its first heartbeat when ``heartbeat_timeout`` is shorter
#: (importing the application and connecting take time).
STARTUP_GRACE = 60.0
#: Seconds after a stop signal's ``shutdown_timeout`` before workers are SIGKILLed.
KILL_GRACE = 5.0
#: Seconds a worker that exited cleanly gives its process group to empty itself.
GROUP_GRACE = 1.0
#: Least seconds between two starts of one slot when its worker asked to be restarted
#: (exit code ``EXIT_RESTART``); such planned restarts are not counted in the restart budget.
PLANNED_RESTART_INTERVAL = 1.0
#: Seconds past ``2 * shutdown_timeout + KILL_GRACE`` a replacement worker retries a port its
#: predecessor still holds (``BLITZQ_OPS_PORT_WAIT``, :mod:`~blitzq.worker.endpoints`).
PORT_WAIT_MARGIN = 30.0


class Supervisor(Elastic):
    """Keep ``workers`` copies of ``command`` running; see the module docstring.

    Args:
        command: argv of one worker process.
        workers: number of worker processes (>= 1).
        shutdown_timeout: seconds the workers get to stop gracefully after a stop signal; what
            still runs ``KILL_GRACE`` (5) seconds later is SIGKILLed with its process group.
        max_restarts: restarts of one slot allowed within ``restart_window`` seconds, after
            deaths of workers that made no progress (see the module docstring).
        restart_window: seconds of the restart budget's rolling window.
        heartbeat_timeout: seconds without a heartbeat after which a worker is replaced
            (``None``: no heartbeat is watched).
        backoff: seconds before the first restart in a window (doubling, at most
            ``max_backoff``).
        max_backoff: the longest restart delay in seconds.
        env: environment of the workers (default: this process's); each also gets
            ``BLITZQ_WORKER_SLOT`` (0 … workers-1; the lowest free index for a slot added)
            and ``BLITZQ_SUPERVISOR`` (this process's pid: the worker ids of two
            supervisors on one host differ, :mod:`.identity`).
        autoscale: scale between its bounds (``workers`` is then the starting count).
        sampler: makes the sampler the autoscaler reads, given the ``processes``, ``status``
            and ``wake`` callbacks (see :class:`~blitzq.worker.sampler.Sampler`); required with
            ``autoscale``.
        watch: reload every worker when a ``.py`` file under it changes
            (:class:`~blitzq.worker.reload.SourceWatcher`); a slot that gave up on a usage
            error then starts again, and the supervisor does not exit over such slots.

    Raises:
        ValueError: ``workers`` < 1 or an empty command.
    """

    def __init__(
        self,
        command: Sequence[str],
        workers: int,
        shutdown_timeout: float = 30.0,
        *,
        max_restarts: int = 5,
        restart_window: float = 3600.0,
        heartbeat_timeout: float | None = 30.0,
        backoff: float = 0.25,
        max_backoff: float = 5.0,
        env: Mapping[str, str] | None = None,
        autoscale: AutoscaleSettings | None = None,
        sampler: Callable[..., Sampler] | None = None,
        watch: Path | Sequence[Path] | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if not command:
            raise ValueError("command must not be empty")
        self.command = list(command)
        self.shutdown_timeout = shutdown_timeout
        self.heartbeat_timeout = heartbeat_timeout or None
        self.env = dict(os.environ if env is None else env)
        self._budget = functools.partial(
            RestartBudget, max_restarts, restart_window, backoff, max_backoff
        )
        self.slots = [_Slot(i, self._budget()) for i in range(workers)]
        #: workers replaced or removed, stopping gracefully.
        self._retiring: list[subprocess.Popen[bytes]] = []
        self._reload: str | None = None
        self._wake_w = -1
        self.autoscaler = Autoscaler(autoscale) if autoscale is not None else None
        self._sampler = None
        if sampler is not None:
            self._sampler = sampler(
                processes=self._started_map, status=self._status, wake=self._wake
            )
        self._sample: Sample | None = None
        self._watching = watch is not None
        self._watcher = (
            SourceWatcher(watch, lambda paths: self.reload("changed: " + ", ".join(paths)))
            if watch is not None
            else None
        )
        self._bounds = (autoscale.minimum, autoscale.maximum) if autoscale else (workers,) * 2
        self._signals: list[int] = []
        self._stopping = False
        self._kill_at: float | None = None
        #: process groups of ended workers that may still hold members: pgid -> kill time.
        self._groups: dict[int, float] = {}
        self._live_groups: set[int] = set()
        self._guard = Guard(self.env, lambda: self._live_groups | set(self._groups))
        #: this loop's own pauses (``stall_clock.py``): then no worker is judged.
        self.stall = StallClock(heartbeat_slack(self.heartbeat_timeout))

    # ------------------------------------------------------------------ public
    def run(self) -> int:
        """Start the workers and supervise them until a stop signal or until every slot gave up.

        Must run in the main thread (it installs signal handlers).

        Returns:
            0 after a stop signal once every worker has exited; 78 (2) when every slot gave up
            on a configuration (usage) error, 1 when every slot gave up otherwise.
        """
        _prctl()  # look libc up before forking
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        self._wake_w = wake_w
        handled = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        previous_fd = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        try:
            self._guard.start()
            for slot in self.slots:
                self._spawn(slot, first=True)
            for helper in (self._sampler, self._watcher):
                if helper is not None:
                    helper.start()
            return self._loop(wake_r)
        finally:
            for helper in (self._watcher, self._sampler):
                if helper is not None:
                    helper.stop()
            self._kill_everything()
            signal.set_wakeup_fd(previous_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_r)
            os.close(wake_w)
            self._guard.stop()

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Ask for a graceful stop as if ``sig`` had arrived (call from the supervising thread)."""
        self._signals.append(sig)

    def reload(self, why: str) -> None:
        """Ask for a graceful reload of every worker (safe from any thread): each slot starts
        a new worker and the old one gets SIGTERM, finishing what it runs; a slot that gave
        up (an import that failed, a crash loop) is started again. ``why`` is logged."""
        self._reload = why
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"\0")

    # ---------------------------------------------------------------- the loop
    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            self._reload = "SIGHUP"
        elif signum != signal.SIGCHLD:
            self._signals.append(signum)

    def _loop(self, wake_r: int) -> int:
        while True:
            self._handle_signals()
            now = time.monotonic()
            paused = self.stall.stalled()
            if paused:
                self._resumed(paused, now)
            for slot in self.slots:
                self._read_beats(slot, now)
                self._read_progress(slot)
                if slot.proc is not None and slot.proc.poll() is not None:
                    self._ended(slot, now)
                elif slot.proc is not None and not self._stopping:
                    self._check_heartbeat(slot, now)
                if not self._stopping and slot.restart_at is not None and now >= slot.restart_at:
                    self._spawn(slot)
            for proc in [p for p in self._retiring if p.poll() is not None]:
                self._retiring.remove(proc)
                self._live_groups.discard(proc.pid)
                self._groups[proc.pid] = now + (GROUP_GRACE if proc.returncode == 0 else 0.0)
                logger.info("retired worker (pid %d) exited with %s", proc.pid, proc.returncode)
            if self._reload is not None and not self._stopping:
                self._reload_all(self._reload)
            if self.autoscaler is not None and not self._stopping:
                self._autoscale(now)
            self._sweep_groups(now)
            if not self._stopping:
                self._guard.check()
            if self._stopping:
                idle = all(s.proc is None for s in self.slots) and not self._retiring
                if idle and not self._groups:
                    logger.info("supervisor stopped: every worker exited")
                    return 0
                if self._kill_at is not None and now >= self._kill_at:
                    logger.error(
                        "workers still running %.1f s after the stop signal: killing them",
                        self.shutdown_timeout + KILL_GRACE,
                    )
                    self._kill_at = None
                    self._kill_workers()
            elif all(s.gave_up for s in self.slots) and not (
                self._watching and all(s.usage_error for s in self.slots)
            ):
                logger.error("every worker slot gave up: supervisor exits")
                if all(s.usage_error for s in self.slots):
                    return max(s.fatal_code for s in self.slots)
                return 1
            pipes = [s.beat_fd for s in self.slots if s.beat_fd >= 0]
            pipes += [s.progress_fd for s in self.slots if s.progress_fd >= 0]
            timeout = max(0.0, self._next_deadline(now) - now)
            self.stall.expect(timeout)
            self._wait(wake_r, timeout, pipes)

    def _resumed(self, paused: float, now: float) -> None:
        """This loop did not run for ``paused`` seconds more than it asked: the workers were
        most likely paused with it (a whole-host freeze), so their silence is not judged.
        Each worker gets a fresh heartbeat grace from ``now``; the deadlines of a stop (and
        of ended workers' groups) and the autoscaler's idle times shift by the pause."""
        logger.warning(
            "supervisor was paused for %.1f s (the host, or this process, did not run): every "
            "worker gets a fresh heartbeat grace instead of being judged on a silence it "
            "likely shared",
            paused,
        )
        for slot in self.slots:
            slot.beat_at = now
        if self._kill_at is not None:
            self._kill_at += paused
        self._groups = {pgid: at + paused for pgid, at in self._groups.items()}
        if self.autoscaler is not None:
            self.autoscaler.paused(paused)

    def _next_deadline(self, now: float) -> float:
        deadlines = [now + 1.0]
        deadlines += [s.restart_at for s in self.slots if s.restart_at is not None]
        deadlines += list(self._groups.values())
        if self._kill_at is not None:
            deadlines.append(self._kill_at)
        if not self._stopping:
            deadlines += [self._beat_deadline(s) for s in self.slots if s.beat_fd >= 0]
        # Group membership is polled: look again soon while a group empties itself.
        if self._groups:
            deadlines.append(now + 0.05)
        return min(deadlines)

    @staticmethod
    def _wait(wake_r: int, timeout: float, beats: Sequence[int] = ()) -> None:
        with contextlib.suppress(InterruptedError):
            select.select([wake_r, *beats], [], [], max(0.0, timeout))
        with contextlib.suppress(BlockingIOError):
            while os.read(wake_r, 512):
                pass

    def _handle_signals(self) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            if self._stopping:
                logger.warning("second stop signal (%s): killing the workers now", signal_name(sig))
                self._kill_workers()
                continue
            self._stopping = True
            self._kill_at = time.monotonic() + self.shutdown_timeout + KILL_GRACE
            logger.info("supervisor got %s: stopping the workers", signal_name(sig))
            for slot in self.slots:
                slot.restart_at = None
                if slot.proc is not None and slot.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(slot.proc.pid, sig)

    # ------------------------------------------------------------------ slots
    @property
    def port_wait(self) -> float:
        """Seconds a replacement worker retries a port its predecessor still holds."""
        return 2 * self.shutdown_timeout + KILL_GRACE + PORT_WAIT_MARGIN

    def _spawn(self, slot: _Slot, *, first: bool = False) -> None:
        """Start a worker in ``slot``; any but a ``first`` one waits for the slot's ports."""
        slot.restart_at = None
        env = {**self.env, SLOT_ENV: str(slot.index), SUPERVISOR_ENV: str(os.getpid())}
        env.pop(PORT_WAIT_ENV, None)
        env.pop(HEARTBEAT_ENV, None)
        if not first:
            env[PORT_WAIT_ENV] = repr(self.port_wait)
        self._close_beats(slot)
        self._close_progress(slot)
        beat_r = beat_w = -1
        if self.heartbeat_timeout is not None:
            beat_r, beat_w = os.pipe()
            os.set_blocking(beat_r, False)
            env[HEARTBEAT_ENV] = f"{beat_w},{min(1.0, self.heartbeat_timeout / 5)!r}"
        progress_r, progress_w = os.pipe()
        os.set_blocking(progress_r, False)
        env[PROGRESS_ENV] = str(progress_w)
        passed = (beat_w, progress_w) if beat_w >= 0 else (progress_w,)
        try:
            proc = subprocess.Popen(
                self.command,
                env=env,
                stdin=subprocess.DEVNULL,
                process_group=0,
                pass_fds=passed,
                preexec_fn=functools.partial(die_with_parent, os.getpid()),
            )
        except OSError as exc:
            logger.error("worker slot %d could not start: %s", slot.index, exc)
            for fd in (beat_r, progress_r):
                if fd >= 0:
                    os.close(fd)
            self._schedule_restart(slot, time.monotonic())
            return
        finally:
            for fd in passed:
                with contextlib.suppress(OSError):
                    os.close(fd)
        slot.beat_fd, slot.beating = beat_r, False
        slot.progress_fd, slot.progressed = progress_r, False
        slot.proc = proc
        slot.started_at = slot.beat_at = time.monotonic()
        slot.pids.append(proc.pid)
        self._live_groups.add(proc.pid)
        self._guard.tell(f"+{proc.pid}")
        logger.info("worker slot %d started: pid %d", slot.index, proc.pid)

    # -------------------------------------------------------------- heartbeats
    def _beat_deadline(self, slot: _Slot) -> float:
        timeout = self.heartbeat_timeout or 0.0
        return slot.beat_at + (timeout if slot.beating else max(timeout, STARTUP_GRACE))

    @staticmethod
    def _close_beats(slot: _Slot) -> None:
        if slot.beat_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(slot.beat_fd)
            slot.beat_fd = -1

    def _read_beats(self, slot: _Slot, now: float) -> None:
        """Take the beats waiting on the slot's pipe; at end-of-file (the worker closed it,
        e.g. on its way out) stop watching it."""
        if slot.beat_fd < 0:
            return
        try:
            data = os.read(slot.beat_fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_beats(slot)
            return
        slot.beat_at, slot.beating = now, True

    @staticmethod
    def _close_progress(slot: _Slot) -> None:
        if slot.progress_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(slot.progress_fd)
            slot.progress_fd = -1

    def _read_progress(self, slot: _Slot) -> None:
        """Take the worker's progress mark when it is there (logged once); at end-of-file
        (the worker exited or closed the pipe) stop watching the pipe."""
        if slot.progress_fd < 0:
            return
        try:
            data = os.read(slot.progress_fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self._close_progress(slot)  # the mark is one byte, written once
        if data and not slot.progressed and slot.proc is not None:
            slot.progressed = True
            logger.info(
                "worker slot %d (pid %d) made progress (a task completed, or a suspect ran "
                "alone): its death would not count against the restart budget",
                slot.index,
                slot.proc.pid,
            )

    def _check_heartbeat(self, slot: _Slot, now: float) -> None:
        """SIGKILL the process group of a worker whose heartbeat stopped; the exit that
        follows restarts the slot as after a crash."""
        if slot.beat_fd < 0 or slot.proc is None or now < self._beat_deadline(slot):
            return
        logger.error(
            "worker slot %d (pid %d) sent no heartbeat for %.1f s (process stopped or event "
            "loop blocked): killing its process group to replace it",
            slot.index,
            slot.proc.pid,
            now - slot.beat_at,
        )
        self._close_beats(slot)
        killpg(slot.proc.pid)

    def _ended(self, slot: _Slot, now: float) -> None:
        proc = slot.proc
        assert proc is not None
        self._read_progress(slot)  # a mark written just before the exit still counts
        slot.proc = None
        self._close_beats(slot)
        self._close_progress(slot)
        code = proc.returncode
        self._live_groups.discard(proc.pid)
        # A clean exit shut its pool down; give stragglers (resource tracker) a moment.
        self._groups[proc.pid] = now + (GROUP_GRACE if code == 0 else 0.0)
        how = f"signal {signal_name(-code)}" if code < 0 else f"code {code}"
        if self._stopping:
            logger.info("worker slot %d (pid %d) exited with %s", slot.index, proc.pid, how)
            return
        if code in (EXIT_USAGE, EXIT_CONFIG):
            slot.gave_up = slot.usage_error = True
            slot.fatal_code = code
            logger.error(
                "worker slot %d (pid %d) exited with a %s error (code %d): not restarting it",
                slot.index,
                proc.pid,
                "configuration" if code == EXIT_CONFIG else "usage",
                code,
            )
            return
        if code == EXIT_RESTART:
            # Planned: the worker stopped gracefully to be replaced. Not a crash, so the
            # crash budget is untouched; the interval keeps a slot from restarting hot.
            slot.planned_restarts += 1
            slot.restart_at = max(now, slot.started_at + PLANNED_RESTART_INTERVAL)
            logger.warning(
                "worker slot %d (pid %d) asked to be restarted (code %d): planned restart "
                "#%d in %.2f s, not counted as a crash",
                slot.index,
                proc.pid,
                code,
                slot.planned_restarts,
                slot.restart_at - now,
            )
            return
        if code == EXIT_FORKSERVER:
            logger.error(
                "worker slot %d (pid %d): its CPU pool's forkserver could not start a child "
                "(code %d): starting a fresh worker",
                slot.index,
                proc.pid,
                code,
            )
        else:
            logger.warning("worker slot %d (pid %d) exited with %s", slot.index, proc.pid, how)
        if slot.progressed:
            slot.restart_at = now + slot.budget.progressed()
            logger.info(
                "restarting worker slot %d in %.2f s (its worker had made progress: not "
                "counted against the restart budget)",
                slot.index,
                slot.restart_at - now,
            )
            return
        self._schedule_restart(slot, now)

    def _schedule_restart(self, slot: _Slot, now: float) -> None:
        delay = slot.budget.next_delay()
        if delay is None:
            slot.gave_up = True
            logger.error(
                "worker slot %d restarted %d times within %.0f s: giving up on it (none of "
                "those workers made progress)",
                slot.index,
                slot.budget.limit,
                slot.budget.window,
            )
            return
        slot.restart_at = now + delay
        logger.info("restarting worker slot %d in %.2f s", slot.index, delay)

    # ---------------------------------------------------------- process groups
    def _sweep_groups(self, now: float) -> None:
        for pgid, kill_at in list(self._groups.items()):
            if not group_alive(pgid):
                del self._groups[pgid]
            elif now >= kill_at:
                killpg(pgid)
                del self._groups[pgid]
            else:
                continue
            self._guard.tell(f"-{pgid}")

    def _kill_workers(self) -> None:
        for proc in [s.proc for s in self.slots if s.proc is not None] + self._retiring:
            killpg(proc.pid)
        for pgid in self._groups:
            killpg(pgid)

    def _kill_everything(self) -> None:
        """Last resort on the way out (also after an exception): nothing may outlive us."""
        self._kill_workers()
        for proc in [s.proc for s in self.slots if s.proc is not None] + self._retiring:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(5.0)
        for slot in self.slots:
            slot.proc = None
            self._close_beats(slot)
            self._close_progress(slot)
        self._retiring.clear()
        for pgid in list(self._groups):
            self._guard.tell(f"-{pgid}")
        self._groups.clear()
        self._live_groups.clear()
