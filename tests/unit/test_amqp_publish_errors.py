"""What a failed RabbitMQ publish tells the caller: certain failures (a returned, unroutable
message; a refusal) read as such, and a failure after the message was sent (connection lost,
confirm timed out, a quorum queue's nack) says the outcome is unknown ("unconfirmed"), since
RabbitMQ may have queued the message all the same."""

from __future__ import annotations

import aiormq
import pytest

from blitzq.broker.amqp.channels import unconfirmed
from blitzq.exceptions import BrokerError, ConfigurationError


@pytest.mark.parametrize(
    "exc",
    [
        aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - shutdown"),
        TimeoutError(),
        aiormq.exceptions.DeliveryError(None, aiormq.spec.Basic.Nack(delivery_tag=1)),
    ],
)
def test_a_publish_lost_after_sending_is_unconfirmed(exc: BaseException) -> None:
    error = unconfirmed(exc, "publishing to 'ns.q'")
    assert isinstance(error, BrokerError)
    assert error.transient
    assert "unconfirmed" in str(error)
    assert "task_id" in str(error)  # how to enqueue again without a duplicate


def test_a_returned_message_is_certainly_not_queued() -> None:
    frame = aiormq.spec.Basic.Return(reply_code=312, reply_text="NO_ROUTE", routing_key="ns.q")
    error = unconfirmed(aiormq.exceptions.DeliveryError(None, frame), "publishing to 'ns.q'")
    assert isinstance(error, BrokerError)
    assert "unconfirmed" not in str(error)


def test_a_refusal_keeps_its_type() -> None:
    refused = aiormq.exceptions.ChannelPreconditionFailed("PRECONDITION_FAILED")
    error = unconfirmed(refused, "publishing to 'ns.q'")
    assert isinstance(error, ConfigurationError)
    assert "unconfirmed" not in str(error)
