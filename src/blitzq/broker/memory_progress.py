"""In-memory side of task progress (mixed into :class:`~.memory.MemoryBroker`).

Mirrors ``redis/lua/progress.lua`` and the ``progress`` completion op: the newest update of a
task is kept (an older one arriving later is dropped) and pushed to watchers, who are also
told of every record written for the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator
from typing import Any

_Watcher = tuple[asyncio.AbstractEventLoop, "asyncio.Queue[tuple[str, bytes]]"]


class MemoryProgress:
    """Progress operations of the memory broker (state lives in the broker's ``__init__``)."""

    _lock: threading.Lock
    _progress: dict[str, tuple[bytes, float, float]]  # id -> (data, at, monotonic expiry)
    _progress_watchers: dict[str, list[_Watcher]]
    _leases: dict[str, dict[bytes, Any]]  # queue -> token -> lease (fencing)

    def _get_record(self, task_id: str) -> bytes | None:  # provided by MemoryBroker
        raise NotImplementedError

    def _tell_watchers(self, task_id: str, kind: str, data: bytes) -> None:
        """Push ``(kind, data)`` to the watchers of ``task_id`` (lock held)."""
        for loop, inbox in self._progress_watchers.get(task_id, ()):
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens there
                loop.call_soon_threadsafe(inbox.put_nowait, (kind, data))

    def _store_progress(self, task_id: str, data: bytes, at: float, ttl: float) -> bool:
        """Keep ``data`` unless a newer update is stored; tell watchers (lock held)."""
        stored = self._progress.get(task_id)
        if stored is not None and stored[2] > time.monotonic() and stored[1] > at:
            return False
        self._progress[task_id] = (data, at, time.monotonic() + ttl)
        self._tell_watchers(task_id, "progress", data)
        return True

    def _op_progress(self, op: tuple[Any, ...]) -> None:
        """``("progress", task_id, at, data, ttl)`` (lock held)."""
        self._store_progress(op[1], op[3], float(op[2]), float(op[4]))

    async def set_progress(
        self,
        task_id: str,
        data: bytes,
        at: float,
        ttl: int,
        fence: tuple[str, bytes] | None = None,
    ) -> bool:
        """Store and push a progress update unless a newer one is stored, or ``fence``
        ``(queue, token)`` names a delivery no longer leased."""
        with self._lock:
            if fence is not None and fence[1] not in self._leases.get(fence[0], {}):
                return False
            return self._store_progress(task_id, data, at, ttl)

    async def get_progress(self, task_id: str) -> bytes | None:
        """The latest unexpired progress update of a task, or ``None``."""
        with self._lock:
            stored = self._progress.get(task_id)
            if stored is None:
                return None
            if stored[2] <= time.monotonic():
                del self._progress[task_id]
                return None
            return stored[0]

    async def watch_progress(self, task_id: str) -> AsyncGenerator[tuple[str, bytes], None]:
        """The stored update and record, then each update and record as they are written."""
        inbox: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        entry: _Watcher = (asyncio.get_running_loop(), inbox)
        with self._lock:
            self._progress_watchers.setdefault(task_id, []).append(entry)
            stored = self._progress.get(task_id)
            record = self._get_record(task_id)
        try:
            if stored is not None and stored[2] > time.monotonic():
                yield "progress", stored[0]
            if record is not None:
                yield "record", record
            while True:
                yield await inbox.get()
        finally:
            with self._lock:
                watchers = self._progress_watchers.get(task_id, [])
                if entry in watchers:
                    watchers.remove(entry)
                if not watchers:
                    self._progress_watchers.pop(task_id, None)
