"""In-process unique keys and task locks, mixed into :class:`~.memory.MemoryBroker`.

Same semantics as ``broker/redis/lua/unique_claim.lua``, ``lock_acquire.lua``,
``lock_renew.lua`` and the ``unique_release`` / ``lock_release`` completion ops, on this
process's monotonic clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any


class MemoryControl:
    """Unique-key and lock state of the memory broker (a mixin; needs ``_lock``)."""

    _lock: threading.Lock

    def _control_state(self) -> tuple[dict[str, tuple[str, float]], dict[str, dict[str, float]]]:
        """``(unique: key -> (task id, expiry), locks: key -> {holder: expiry})`` (lock held)."""
        state: Any = self.__dict__.get("_control")
        if state is None:
            state = self.__dict__["_control"] = ({}, {})
        return state  # type: ignore[no-any-return]

    async def claim_unique(self, items: Sequence[tuple[str, str, float]]) -> list[str | None]:
        """Claim ``(key, task_id, ttl seconds)`` unique keys; see the broker contract."""
        now = time.monotonic()
        out: list[str | None] = []
        with self._lock:
            unique, _ = self._control_state()
            for key, task_id, ttl in items:
                held = unique.get(key)
                if held is not None and held[1] > now:
                    out.append(held[0])
                else:
                    unique[key] = (task_id, now + ttl)
                    out.append(None)
        return out

    def _free_unique_of(self, task_id: str) -> None:
        """Free the unique key ``task_id`` holds, if any (lock held; for cancel)."""
        unique, _ = self._control_state()
        for key, (holder, _expiry) in list(unique.items()):
            if holder == task_id:
                del unique[key]

    async def acquire_lock(self, key: str, holder: str, limit: int, lease: float) -> float:
        """Take a place of lock ``key``; see the broker contract."""
        now = time.monotonic()
        with self._lock:
            _, locks = self._control_state()
            holders = {h: exp for h, exp in locks.get(key, {}).items() if exp > now}
            locks[key] = holders
            if holder in holders or len(holders) < limit:
                holders[holder] = now + lease
                return 0.0
            return max(0.0, min(holders.values()) - now)

    async def renew_locks(self, items: Sequence[tuple[str, str, float]]) -> int:
        """Renew ``(key, holder, lease seconds)`` places still held; return how many."""
        now = time.monotonic()
        renewed = 0
        with self._lock:
            _, locks = self._control_state()
            for key, holder, lease in items:
                holders = locks.get(key, {})
                if holders.get(holder, 0.0) > now:
                    holders[holder] = now + lease
                    renewed += 1
        return renewed

    def _op_unique_release(self, op: tuple[Any, ...]) -> None:
        """``("unique_release", key, task_id)`` (lock held)."""
        unique, _ = self._control_state()
        held = unique.get(op[1])
        if held is not None and held[0] == op[2]:
            del unique[op[1]]

    def _op_lock_release(self, op: tuple[Any, ...]) -> None:
        """``("lock_release", key, holder)`` (lock held)."""
        _, locks = self._control_state()
        locks.get(op[1], {}).pop(op[2], None)
