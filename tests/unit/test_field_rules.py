"""One rule per message field, held at enqueue and at decode alike.

``CallOptions`` (``task.options(...)``) and the worker's decode check
(:func:`blitzq.envelope_checks.envelope_fault`) read the same :data:`FIELD_RULES`: every value
one refuses, the other refuses too, so a message written by hand carries nothing a call
could not. RabbitMQ's delivery count headers are read the way a stream's ``d`` field is.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest

from blitzq import ConfigurationError
from blitzq.broker.amqp.channels import DELIVERIES, delivery_count
from blitzq.envelope_checks import envelope_fault, options_fault, usable_id
from blitzq.extensions.expiry import Expiry
from blitzq.options import CallOptions
from blitzq.serialization import Envelope

pytestmark = pytest.mark.timeout(30)

#: (CallOptions field, Envelope field, a value both must refuse).
REFUSED: list[tuple[str, str, Any]] = [
    ("task_id", "id", ""),
    ("task_id", "id", "a b"),
    ("task_id", "id", "x{y}"),
    ("task_id", "id", "line\nbreak"),
    ("timeout", "timeout", -1.0),
    ("timeout", "timeout", 0.0),
    ("timeout", "timeout", math.nan),
    ("timeout", "timeout", 1e300),
    ("correlation_id", "correlation_id", ""),
    ("unique_key", "unique_key", ""),
]


@pytest.mark.parametrize(("option", "field", "value"), REFUSED)
def test_enqueue_and_decode_refuse_the_same_values(option: str, field: str, value: Any) -> None:
    with pytest.raises(ConfigurationError):
        CallOptions(**{option: value})
    fault = envelope_fault(Envelope(**{"id": "t1", "task": "t", "queue": "q", field: value}), 0)
    assert fault is not None
    assert fault.startswith(f"{field} is {value!r}: "), fault


@pytest.mark.parametrize("value", [-1, 0, True, 2**31])
def test_a_deferrals_counter_out_of_range_is_a_fault(value: int) -> None:
    fault = envelope_fault(Envelope("t1", "t", "q", deferrals=value), time.time())
    assert fault is not None
    assert fault.startswith("deferrals is "), fault


def test_valid_fields_pass() -> None:
    env = Envelope("t-1:x", "t", "q", timeout=5, correlation_id="c", unique_key="u", deferrals=3)
    assert envelope_fault(env, time.time()) is None
    assert usable_id("abc")
    assert not usable_id("")
    assert not usable_id("a b")


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"max_age": "abc"}, "options.max_age is 'abc'"),
        ({"max_age": -1}, "options.max_age is -1"),
        ({"max_age": math.inf}, "options.max_age is inf"),
        ({"nobody": 1}, "options.nobody is 1: no middleware"),
    ],
)
def test_per_call_options_hold_their_middleware_check(options: dict[str, Any], needle: str) -> None:
    fault = options_fault(options, Expiry.call_options)
    assert fault is not None
    assert fault.startswith(needle), fault


def test_valid_per_call_options_pass() -> None:
    assert options_fault({"max_age": 30, "other": None}, Expiry.call_options) is None


@pytest.mark.parametrize(
    ("headers", "count"),
    [
        ({}, 1),
        ({"x-delivery-count": 2}, 3),
        ({"x-delivery-count": 1, DELIVERIES: 3}, 5),
        ({DELIVERIES: "abc"}, 0),
        ({DELIVERIES: -1}, 0),
        ({"x-delivery-count": True}, 0),
        ({"x-delivery-count": 1.5}, 0),
    ],
)
def test_amqp_delivery_count_headers(headers: dict[str, Any], count: int) -> None:
    """0: a planted header, which the worker dead-letters as a malformed message."""
    assert delivery_count(headers) == count
