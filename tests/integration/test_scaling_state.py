"""The broker's part of autoscaling on a real server: the setpoint, supervisor status with its
expiry, and the enqueue time of the oldest waiting message (what the sampler reads)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from blitzq import Queue

pytestmark = pytest.mark.timeout(30)


async def test_setpoint_and_supervisor_status(make_queue: Callable[..., Queue]) -> None:
    q = make_queue()
    broker = q.broker
    try:
        assert await broker.state.operations.scale() is None
        await broker.state.operations.set_scale(2, 5)
        minimum, maximum, at = await broker.state.operations.scale() or (0, 0, 0.0)
        assert (minimum, maximum) == (2, 5)
        assert at > 0
        assert await broker.state.operations.clear_scale() is True
        assert await broker.state.operations.clear_scale() is False
        assert await broker.state.operations.scale() is None

        await broker.state.operations.publish_supervisor("h:1", b'{"processes": 2}', ttl=60.0)
        await broker.state.operations.publish_supervisor("h:2", b"{}", ttl=-1.0)  # already expired
        assert await broker.state.operations.supervisors() == {"h:1": b'{"processes": 2}'}
        await broker.state.operations.unpublish_supervisor("h:1")
        assert await broker.state.operations.supervisors() == {}
    finally:
        await q.close()


@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_oldest_waiting(make_queue: Callable[..., Queue], mode: str) -> None:
    q = make_queue(name="ow", mode=mode)
    broker = q.broker
    try:
        assert await broker.oldest_waiting(["ow"]) == {}
        await q.send("some.task")
        await q.send("some.task")
        oldest = await broker.oldest_waiting(["ow", "other"])
        if mode == "fast":
            assert oldest == {}  # lists cannot tell without decoding messages
            return
        assert list(oldest) == ["ow"]
        assert 0.0 <= await broker.server_time() - oldest["ow"] < 60.0
    finally:
        await q.close()
