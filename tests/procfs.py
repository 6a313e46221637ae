"""Process checks through ``/proc`` (Linux) that tolerate a process exiting mid-read.

A process can exit between opening ``/proc/<pid>/...`` and reading it: the read then fails
with ``ProcessLookupError`` (ESRCH), not ``FileNotFoundError``. Both mean "gone".
"""

from __future__ import annotations

import os


def proc_state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``"R"``, ``"S"``, ``"Z"`` ...), or ``None`` if gone.

    Args:
        pid: process id.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:  # FileNotFoundError, or ProcessLookupError when it exited mid-read
        return None
    fields = raw.rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


def pid_gone(pid: int) -> bool:
    """Whether ``pid`` no longer runs: it does not exist or is a zombie (killed, not reaped).

    Args:
        pid: process id.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    state = proc_state(pid)
    return state is None or state == "Z"
