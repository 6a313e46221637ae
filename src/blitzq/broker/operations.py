"""The facade's delegation of the operations role: state kept for the operator tools.

Run-time periodic entries (``blitzq schedule add``), the autoscale setpoint and the
supervisors' published status (``blitzq control``), and what the server tells about itself
(``blitzq check``): the role :class:`~.state.OperationsState` of the state seam;
:class:`OperationsFacade` is the :class:`~blitzq.broker.Broker`'s delegation of its methods
to the state store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import StateStore


class OperationsFacade:
    """The Broker's delegation of :class:`~.state.OperationsState` to its state store."""

    state: StateStore

    async def runtime_periodic(self) -> dict[str, bytes]:
        """See :meth:`~.state.OperationsState.runtime_periodic`."""
        return await self.state.runtime_periodic()

    async def set_runtime_periodic(self, name: str, definition: bytes) -> None:
        """See :meth:`~.state.OperationsState.set_runtime_periodic`."""
        await self.state.set_runtime_periodic(name, definition)

    async def remove_runtime_periodic(self, name: str) -> bool:
        """See :meth:`~.state.OperationsState.remove_runtime_periodic`."""
        return await self.state.remove_runtime_periodic(name)

    async def set_scale(self, minimum: int, maximum: int, group: str | None = None) -> None:
        """See :meth:`~.state.OperationsState.set_scale`."""
        await self.state.set_scale(minimum, maximum, group)

    async def clear_scale(self, group: str | None = None) -> bool:
        """See :meth:`~.state.OperationsState.clear_scale`."""
        return await self.state.clear_scale(group)

    async def scale(self, group: str | None = None) -> tuple[int, int, float] | None:
        """See :meth:`~.state.OperationsState.scale`."""
        return await self.state.scale(group)

    async def setpoint(self, group: str | None = None) -> dict[str, str] | None:
        """See :meth:`~.state.OperationsState.setpoint`."""
        return await self.state.setpoint(group)

    async def publish_supervisor(self, supervisor_id: str, status: bytes, ttl: float) -> None:
        """See :meth:`~.state.OperationsState.publish_supervisor`."""
        await self.state.publish_supervisor(supervisor_id, status, ttl)

    async def unpublish_supervisor(self, supervisor_id: str) -> None:
        """See :meth:`~.state.OperationsState.unpublish_supervisor`."""
        await self.state.unpublish_supervisor(supervisor_id)

    async def supervisors(self) -> dict[str, bytes]:
        """See :meth:`~.state.OperationsState.supervisors`."""
        return await self.state.supervisors()

    async def server_info(self) -> dict[str, str]:
        """See :meth:`~.state.OperationsState.server_info`."""
        return await self.state.server_info()
