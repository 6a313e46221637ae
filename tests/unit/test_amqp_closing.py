"""What a lost RabbitMQ connection logs (``broker/amqp/closing.py``): aiormq's reader
traceback is dropped only for an expected loss of blitzq's own connections (the error type
only blitzq's frame reader raises), every other one keeps its traceback, and the one line
says what happened and that the worker connects again."""

from __future__ import annotations

import asyncio
import logging
import sys

import aiormq
import pytest

from blitzq.broker.amqp.closing import _READER, _quiet, lost
from blitzq.broker.amqp.frames import ConnectionLost

pytestmark = pytest.mark.timeout(10)


def _reader_record(exc: BaseException) -> logging.LogRecord:
    """aiormq's WARNING when its reader task ended with ``exc`` (with the traceback)."""
    try:
        raise exc
    except BaseException:
        exc_info = sys.exc_info()
    return logging.LogRecord(
        "aiormq.connection", logging.WARNING, __file__, 1, _READER, (), exc_info
    )


def _lost_socket(cause: OSError | None) -> ConnectionLost:
    exc = ConnectionLost(f"Server communication error: {cause!r}")
    exc.__cause__ = cause
    return exc


def test_an_expected_loss_of_blitzqs_connection_drops_aiormqs_traceback() -> None:
    assert not _quiet.filter(_reader_record(_lost_socket(ConnectionResetError(104, "reset"))))
    assert not _quiet.filter(_reader_record(_lost_socket(None)))  # EOF: closed, no close frame


@pytest.mark.parametrize(
    "exc",
    [
        aiormq.exceptions.InvalidFrameError("bad frame"),  # a malformed frame: a bug somewhere
        aiormq.exceptions.AMQPConnectionError("from aiormq's own reader (a lent connection)"),
        RuntimeError("anything else"),
    ],
)
def test_any_other_reader_error_keeps_its_traceback(exc: BaseException) -> None:
    assert _quiet.filter(_reader_record(exc))


def test_the_line_says_what_happened_and_what_follows() -> None:
    name = "blitzq app pid 1"
    reset = lost(name, _lost_socket(ConnectionResetError(104, "reset")))
    assert reset.startswith(f"lost connection {name!r} to RabbitMQ: its socket was reset")
    assert "heartbeats" in reset
    assert "socket was closed" in lost(name, _lost_socket(None))
    assert lost(name, asyncio.CancelledError()).startswith(f"gave up connection {name!r}")
    closed = aiormq.exceptions.ConnectionClosed(320, "CONNECTION_FORCED - closed by a test")
    assert lost(name, closed) == (
        f"RabbitMQ closed connection {name!r} (320 CONNECTION_FORCED - closed by a test)"
    )
