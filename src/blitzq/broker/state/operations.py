"""The operations role of the state seam: state kept for the operator tools, not for tasks.

Run-time periodic entries (``blitzq schedule add``), the autoscale setpoint and the
supervisors' published status (``blitzq control``), and what the server tells about itself
(``blitzq check``); a backend that keeps none of it inherits the defaults.
"""

from __future__ import annotations

import abc

__all__ = ["OperationsState"]


class OperationsState(abc.ABC):  # noqa: B024 - every method has a default
    """Operator state of a state store (module docstring)."""

    async def runtime_periodic(self) -> dict[str, bytes]:
        """Periodic entries defined at run time (``blitzq schedule add``): name to its
        definition (opaque bytes)."""
        return {}

    async def set_runtime_periodic(self, name: str, definition: bytes) -> None:
        """Store (or replace) the run-time periodic entry ``name``."""
        raise NotImplementedError(f"{type(self).__name__} does not store periodic entries")

    async def remove_runtime_periodic(self, name: str) -> bool:
        """Delete the run-time periodic entry ``name`` and its last-run record; ``True``
        when it existed."""
        raise NotImplementedError(f"{type(self).__name__} does not store periodic entries")

    async def set_scale(self, minimum: int, maximum: int, group: str | None = None) -> None:
        """Store the autoscale setpoint of the supervisors of ``group`` (``None``: those in
        no group): ``minimum`` <= ``maximum`` processes per supervisor (the caller checks the
        range; each supervisor checks it against its own headroom)."""
        raise NotImplementedError(f"{type(self).__name__} does not keep an autoscale setpoint")

    async def clear_scale(self, group: str | None = None) -> bool:
        """Remove the autoscale setpoint of ``group``; return whether there was one."""
        raise NotImplementedError(f"{type(self).__name__} does not keep an autoscale setpoint")

    async def scale(self, group: str | None = None) -> tuple[int, int, float] | None:
        """The autoscale setpoint of ``group`` ``(min, max, set at in Unix seconds)``, or
        ``None`` (none, or unreadable)."""
        return None

    async def setpoint(self, group: str | None = None) -> dict[str, str] | None:
        """The raw fields of the setpoint of ``group`` as text (``None``: none is set), for
        the supervisor to check and accept or reject with a reason."""
        return None

    async def publish_supervisor(self, supervisor_id: str, status: bytes, ttl: float) -> None:
        """Record a supervisor's status for ``ttl`` seconds (refreshed every sample)."""
        return

    async def unpublish_supervisor(self, supervisor_id: str) -> None:
        """Remove a supervisor's status."""
        return

    async def supervisors(self) -> dict[str, bytes]:
        """Live supervisors: id to the status they published."""
        return {}

    async def server_info(self) -> dict[str, str]:
        """What the server says about itself for ``blitzq check`` (read-only): ``server``,
        ``version``, ``aof_enabled``, ``save`` (RDB snapshot rules), ``rdb_last_bgsave_status``,
        ``role``; keys the backend does not know are absent."""
        return {}
