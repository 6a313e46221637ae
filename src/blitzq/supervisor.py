"""Where the supervisor used to live: it is :mod:`blitzq.worker.supervisor` now.

This module re-exports its public names so ``from blitzq.supervisor import RestartBudget`` (and
:class:`Supervisor`, :func:`supervise`, :func:`worker_command`, :func:`die_with_parent`) keep
working, and it is the guard process's entry point: ``python -m blitzq.supervisor`` runs
:func:`~blitzq.worker.processes.guard_main` on its stdin.
"""

from __future__ import annotations

import sys

from .worker.launch import supervise
from .worker.processes import _prctl as _prctl
from .worker.processes import die_with_parent, guard_main, worker_command
from .worker.restarts import RestartBudget
from .worker.supervisor import Supervisor

__all__ = ["RestartBudget", "Supervisor", "die_with_parent", "supervise", "worker_command"]


if __name__ == "__main__":
    guard_main(sys.stdin.buffer)
