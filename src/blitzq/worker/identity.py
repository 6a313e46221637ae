"""A worker's identity: its id, stable per supervisor slot (``host:slot``), and the process
instance behind it (``pid:random``), new at every start (docs/supervisor.md, "Worker ids").
A leaf: it reads the slot the supervisor set (``BLITZQ_WORKER_SLOT``) and imports no other
worker module but :mod:`.ports`.
"""

from __future__ import annotations

import os
import socket
import uuid

from .ports import SLOT_ENV


def new_instance() -> str:
    """A new process instance of a worker: ``pid:random`` (6 hex digits)."""
    return f"{os.getpid()}:{uuid.uuid4().hex[:6]}"


def process_slot() -> int | None:
    """The supervisor's slot this process runs in (``BLITZQ_WORKER_SLOT``), or ``None``."""
    slot = os.environ.get(SLOT_ENV, "")
    return int(slot) if slot.isdigit() else None


def default_worker_id(instance: str) -> str:
    """The id of a worker that was given no name: ``host:slot`` in a slot of the supervisor
    (the same across the slot's restarts, so metrics and logs keep continuity), else
    ``host:instance`` (``instance``: :func:`new_instance`)."""
    slot = process_slot()
    return f"{socket.gethostname()}:{slot if slot is not None else instance}"


__all__ = ["default_worker_id", "new_instance", "process_slot"]
