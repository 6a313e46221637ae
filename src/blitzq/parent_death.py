"""Dying with the parent process on Linux (``PR_SET_PDEATHSIG``).

Used by everything that starts a process that must not outlive its starter: the supervisor's
workers (:mod:`blitzq.worker.supervisor`), a worker's process pool
(:mod:`blitzq.worker.executors`) and the private Valkey servers
(:mod:`blitzq.broker.redis.server_proc`). It sits below all of them and imports nothing of
blitzq. The mechanism is ``prctl(2)``'s ``PR_SET_PDEATHSIG`` (Linux man-pages, prctl(2)).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable

#: ``prctl`` option: signal this process gets when the thread that created it exits.
PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux only), looked up once, before any fork."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here: a worker that forks nothing loads no ctypes (~0.4 MB)

    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has prctl
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent exits (``PR_SET_PDEATHSIG``).

    Safe in a ``preexec_fn`` (after fork, before exec) when the parent called it, or
    :func:`_prctl`, once before forking, and as the ``initializer`` of a process pool. The
    signal follows the *thread* that created the process: create children from a thread that
    lives as long as the parent (the main thread).

    Args:
        parent_pid: pid of the expected parent; if this process already has another parent
            (the parent died before the call), it exits at once with code 1.
        sig: the signal number (default SIGKILL).

    Returns:
        Whether the request was made (``False`` on systems other than Linux).
    """
    prctl = _prctl()
    if prctl is None:
        return False
    prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)
    return True
