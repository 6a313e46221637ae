"""The supervisor's slots that change while it runs: graceful reload and autoscaling.

:class:`Elastic` is the part of :class:`~blitzq.worker.supervisor.Supervisor` that replaces
or removes a slot's worker without a crash: the old worker gets SIGTERM and stops gracefully
(it stops fetching and finishes its running tasks within its ``--shutdown-timeout``) while
the supervisor keeps watching it as *retiring* (its process group is cleaned up as any
other); a reload starts a new worker in every slot at the same time, and the autoscaler adds
slots (the lowest free ``BLITZQ_WORKER_SLOT``) and removes the ones it names.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .autoscale import Autoscaler, Decision, Sample
from .restarts import RestartBudget
from .sampler import Sampler

logger = logging.getLogger("blitzq.supervisor")


@dataclass
class _Slot:
    index: int
    budget: RestartBudget
    proc: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    gave_up: bool = False
    usage_error: bool = False
    pids: list[int] = field(default_factory=list)
    started_at: float = -math.inf
    planned_restarts: int = 0
    #: exit code of the usage or configuration error it gave up on (2 or 78).
    fatal_code: int = 0
    #: read end of the worker's heartbeat pipe (-1: none) and when it last beat.
    beat_fd: int = -1
    beat_at: float = -math.inf
    #: whether a beat arrived from the current worker (before that, a startup grace).
    beating: bool = False
    #: read end of the worker's progress pipe (-1: none or closed), and whether the worker
    #: wrote its progress mark (:func:`~blitzq.worker.heartbeat.progress_mark`).
    progress_fd: int = -1
    progressed: bool = False


class Elastic:
    """Reload and autoscale of :class:`~blitzq.worker.supervisor.Supervisor` (a mixin: the
    supervisor sets the attributes and implements :meth:`_spawn`)."""

    slots: list[_Slot]
    autoscaler: Autoscaler | None
    _retiring: list[subprocess.Popen[bytes]]
    _reload: str | None
    _sampler: Sampler | None
    _sample: Sample | None
    _bounds: tuple[int, int]
    _budget: Callable[[], RestartBudget]

    def _spawn(self, slot: _Slot, *, first: bool = False) -> None:
        raise NotImplementedError

    # ------------------------------------------------------ reload, autoscale
    def _retire(self, slot: _Slot) -> None:
        """Stop the slot's worker gracefully (SIGTERM) without restarting it."""
        proc, slot.proc = slot.proc, None
        for fd in (slot.beat_fd, slot.progress_fd):  # a retiring worker is not watched
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        slot.beat_fd = slot.progress_fd = -1
        if proc is not None:
            self._retiring.append(proc)
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)

    def _reload_all(self, why: str) -> None:
        self._reload = None
        logger.warning("reloading every worker (%s): new workers start, old ones finish", why)
        for slot in self.slots:  # a slot that gave up gets its chance with the new code
            slot.gave_up = slot.usage_error = False
            self._retire(slot)
            self._spawn(slot)

    def _started_map(self) -> dict[int, float]:
        return {s.proc.pid: s.started_at for s in self.slots if s.proc is not None}

    def _status(self) -> dict[str, Any]:
        """The supervisor's own fields of its published status: processes (and their pids),
        the bounds in force and those of its command line (``arguments``)."""
        low, high = self._bounds
        started = self._started_map()
        out: dict[str, Any] = {"processes": len(started), "pids": sorted(started)}
        out.update(min=low, max=high)
        if self.autoscaler is not None:
            s = self.autoscaler.settings
            out["arguments"] = [s.minimum, s.maximum]
        return out

    def _autoscale(self, now: float) -> None:
        sample = self._sampler.latest if self._sampler is not None else None
        assert self.autoscaler is not None
        if sample is None or sample is self._sample:
            return
        self._sample = sample
        self._bounds = self.autoscaler.bounds(sample)
        if any(s.proc is None for s in self.slots):  # a restart is pending: decide later
            return
        self._apply(self.autoscaler.decide(now, self._started_map(), sample))

    def _apply(self, decision: Decision) -> None:
        for pid in decision.remove:
            slot = next(s for s in self.slots if s.proc is not None and s.proc.pid == pid)
            logger.info("autoscale: removing worker slot %d (%s)", slot.index, decision.reason)
            self._retire(slot)
            self.slots.remove(slot)
        for _ in range(decision.add):
            used = {s.index for s in self.slots}
            slot = _Slot(min(set(range(len(self.slots) + 1)) - used), self._budget())
            logger.info("autoscale: adding worker slot %d (%s)", slot.index, decision.reason)
            self.slots.append(slot)
            self._spawn(slot)
