"""Workers of one namespace with different visibility timeouts (the F16 report).

A worker registers its visibility timeout; :meth:`~blitzq.broker.Broker.worker_timeouts`
reports the live workers whose timeout is longer than the reader's, and a recovery given them
as ``holders`` leaves their deliveries alone until idle that long: a worker with a short
timeout never takes the running task of a healthy worker with a long one, and still takes a
dead worker's at once.

RabbitMQ is left out of the recovery tests: its custody leases carry the expiry their holder
gave them, and another process cannot recover a delivery whose holder's channel is open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from blitzq.broker import Broker
from blitzq.serialization import decode_envelope
from tests.broker_kinds import is_amqp

from .test_broker_contract import Q, eventually, message, needs_recovery


async def test_worker_timeouts_are_the_live_registrations_above_the_readers(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    other = make_broker()
    await other.workers()  # connected before the short registration's clock starts
    await broker.register_worker("w-patient", b"i", 60, visibility_timeout=30.0)
    await broker.register_worker("w-same", b"i", 60, visibility_timeout=2.0)
    await broker.register_worker("w-older", b"i", 60)  # an older version: no timeout
    await broker.register_worker("w-lapsing", b"i", 0.3, visibility_timeout=45.0)
    await eventually(other.workers, lambda w: "w-lapsing" not in w)
    # Lapsed (dead or stalled): left out before and after a reaper takes it out.
    assert await other.worker_timeouts(2.0) == {"w-patient": 30.0}
    assert await other.lapsed_workers() == {"w-lapsing": b"i"}
    assert await other.worker_timeouts(2.0) == {"w-patient": 30.0}
    assert await other.worker_timeouts(0.5) == {"w-patient": 30.0, "w-same": 2.0}
    assert await other.worker_timeouts(30.0) == {}
    await broker.unregister_worker("w-patient")
    assert await other.worker_timeouts(2.0) == {}


async def test_recovery_waits_for_a_live_holders_own_timeout(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    needs_recovery(broker)
    if is_amqp(broker):
        pytest.skip("RabbitMQ: custody leases carry their holder's expiry (see the docstring)")
    patient, dead, rescuer = broker, make_broker(), make_broker()
    await patient.prepare_consumer([Q], "patient")
    await dead.prepare_consumer([Q], "dead")
    await rescuer.prepare_consumer([Q], "rescuer")
    await patient.publish(Q, [message(f"p{i}") for i in range(3)])
    assert len(await patient.fetch(Q, 3, 0)) == 3  # the older entries: first in the scan
    await patient.publish(Q, [message("d0"), message("d1")])
    assert len(await dead.fetch(Q, 2, 0)) == 2
    await asyncio.sleep(0.15)  # every entry idle past the rescuer's 0.05 s
    # Two at most per call: the scan goes past the patient holder's three to the dead one's.
    assert await rescuer.recover(Q, 0.05, 2, 5, holders={"patient": 30.0}) == (2, 0)
    assert await rescuer.recover(Q, 0.05, 10, 5, holders={"patient": 30.0}) == (0, 0)
    again = await rescuer.fetch(Q, 10, 0)
    assert sorted(decode_envelope(d.payload).id for d in again) == ["d0", "d1"]
    assert (await rescuer.queue_stats([Q]))[Q] == {"waiting": 0, "in_flight": 5}
    # Once idle past the patient holder's own timeout, its entries are taken too.
    assert await rescuer.recover(Q, 0.05, 10, 5, holders={"patient": 0.1}) == (3, 0)
    late = await rescuer.fetch(Q, 10, 0)
    assert sorted(decode_envelope(d.payload).id for d in late) == ["p0", "p1", "p2"]
    assert all(d.deliveries == 2 for d in late)
