"""A producer's write the primary applied and its replicas did not confirm (``WAIT`` short).

``replicas.check_acknowledged`` raises a :class:`~blitzq.BrokerError` marked ``unreplicated``
(and ``unavailable``: a worker retries its completion as before); a producer's
``unknown_outcome`` turns it into :class:`~blitzq.OutcomeUnknown` (the write is on the primary:
not "nothing sent"), while a plain ``unavailable`` error (a superseded primary: the command
was not sent) passes through unchanged.
"""

from __future__ import annotations

import pytest

from blitzq import BrokerError, OutcomeUnknown
from blitzq.broker.redis.replicas import ReplicaWatch, check_acknowledged
from blitzq.exceptions import unknown_outcome


def _short_wait() -> BrokerError:
    with pytest.raises(BrokerError) as raised:
        check_acknowledged(ReplicaWatch({}), "XADD", 0, 1, 0.5)
    return raised.value


def test_a_short_wait_is_an_unreplicated_unavailable_error() -> None:
    error = _short_wait()
    assert error.unreplicated
    assert error.unavailable
    assert error.transient
    assert not error.outcome_unknown
    assert "acknowledged by 0 of 1 replica(s) within 0.5 s" in str(error)


def test_a_producer_sees_it_as_an_unknown_outcome() -> None:
    error = _short_wait()
    with pytest.raises(OutcomeUnknown) as raised, unknown_outcome("enqueue", ["t1"]):
        raise error
    assert raised.value.unreplicated
    assert raised.value.task_ids == ("t1",)
    assert raised.value.__cause__ is error
    assert "the primary applied it, its replicas did not confirm it" in str(raised.value)


def test_a_command_never_sent_passes_through() -> None:
    not_sent = BrokerError("the primary may be being replaced", unavailable=True)
    with pytest.raises(BrokerError) as raised, unknown_outcome("enqueue", ["t1"]):
        raise not_sent
    assert raised.value is not_sent
    assert not raised.value.unreplicated


def test_a_lost_reply_says_so() -> None:
    lost = BrokerError("Timeout reading from socket")
    with pytest.raises(OutcomeUnknown) as raised, unknown_outcome("enqueue", ["t1"]):
        raise lost
    assert not raised.value.unreplicated
    assert "stopped answering after the command was sent" in str(raised.value)
