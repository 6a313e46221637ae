"""A worker's identity: its id, stable per supervisor slot (``host:supervisor-slot``, the
supervisor's pid and the slot's index), and the process instance behind it (``pid:random``),
new at every start (docs/supervisor.md, "Worker ids"). A leaf: it reads the slot and the
supervisor the supervisor set (``BLITZQ_WORKER_SLOT``, ``BLITZQ_SUPERVISOR``) and imports no
other worker module but :mod:`.ports`.
"""

from __future__ import annotations

import os
import socket
import uuid

from .ports import SLOT_ENV

#: Environment variable the supervisor sets in each worker process: its own pid, which tells
#: apart the slots of two supervisors on one host (both have a slot 0).
SUPERVISOR_ENV = "BLITZQ_SUPERVISOR"


def new_instance() -> str:
    """A new process instance of a worker: ``pid:random`` (6 hex digits)."""
    return f"{os.getpid()}:{uuid.uuid4().hex[:6]}"


def process_slot() -> int | None:
    """The supervisor's slot this process runs in (``BLITZQ_WORKER_SLOT``), or ``None``."""
    slot = os.environ.get(SLOT_ENV, "")
    return int(slot) if slot.isdigit() else None


def slot_name(slot: int) -> str:
    """The name of ``slot`` of this process's supervisor: ``<supervisor pid>-<slot>``
    (``4211-0``), or the bare index when no supervisor pid is set (``BLITZQ_SUPERVISOR``:
    a slot set by hand)."""
    supervisor = os.environ.get(SUPERVISOR_ENV, "")
    return f"{supervisor}-{slot}" if supervisor.isdigit() else str(slot)


def default_worker_id(instance: str) -> str:
    """The id of a worker that was given no name: ``host:supervisor-slot`` in a slot of the
    supervisor (``vm:4211-0``: the same across the slot's restarts, so metrics and logs keep
    continuity, and unlike the slot of another supervisor on the host), else
    ``host:instance`` (``instance``: :func:`new_instance`, unique per process)."""
    slot = process_slot()
    return f"{socket.gethostname()}:{slot_name(slot) if slot is not None else instance}"


__all__ = ["SUPERVISOR_ENV", "default_worker_id", "new_instance", "process_slot", "slot_name"]
