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
from blitzq.limits import MAX_TASK_ID
from blitzq.options import CallOptions
from blitzq.routing import check_task_id
from blitzq.serialization import Envelope

pytestmark = pytest.mark.timeout(30)

#: (CallOptions field, Envelope field, a value both must refuse).
REFUSED: list[tuple[str, str, Any]] = [
    ("task_id", "id", ""),
    ("task_id", "id", "a b"),
    ("task_id", "id", "x{y}"),
    ("task_id", "id", "line\nbreak"),
    ("task_id", "id", "x" * (MAX_TASK_ID + 1)),  # alphanumeric: the decode's fast path too
    ("task_id", "id", "order:" + "7" * MAX_TASK_ID),
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
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:60]  # a long one is cut
    assert fault.startswith(f"{field} is {shown}"), fault


@pytest.mark.parametrize("value", [-1, 0, True, 2**31])
def test_a_deferrals_counter_out_of_range_is_a_fault(value: int) -> None:
    fault = envelope_fault(Envelope("t1", "t", "q", deferrals=value), time.time())
    assert fault is not None
    assert fault.startswith("deferrals is "), fault


#: Ids enqueue refuses (``task.options(task_id=...)``): every lookup refuses them too.
BAD_IDS: list[Any] = ["", " ", "a b", "x{y}", "line\nbreak", "cr\r", "nul\0", "x" * 513]
#: Ids enqueue takes, chosen by a caller: every lookup takes them too.
GOOD_IDS = ["order:42/retry-1", "x" * 512, "ünïcødé-😀", "periodic:hourly:1700000000"]


def test_the_ids_above_straddle_the_limit() -> None:
    assert MAX_TASK_ID == 512


@pytest.mark.parametrize("value", [*BAD_IDS, 5, b"raw"], ids=repr)
def test_one_task_id_rule_for_enqueue_decode_and_lookups(value: Any) -> None:
    with pytest.raises(ConfigurationError):
        CallOptions(task_id=value)
    with pytest.raises(ConfigurationError):
        check_task_id("task id", value)
    assert not usable_id(value)


@pytest.mark.parametrize("value", GOOD_IDS, ids=lambda v: v[:20])
def test_ids_enqueue_takes_pass_every_check(value: str) -> None:
    assert CallOptions(task_id=value).task_id == value
    assert check_task_id("task id", value) == value
    assert usable_id(value)
    assert envelope_fault(Envelope(value, "t", "q"), time.time()) is None


def test_an_absurd_id_is_refused_without_quoting_it_whole() -> None:
    with pytest.raises(ConfigurationError) as caught:
        check_task_id("task id", "y" * 1_000_000)
    assert f"at most {MAX_TASK_ID} characters, got 1000000" in str(caught.value)
    assert len(str(caught.value)) < 200


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
    ],
)
def test_per_call_options_hold_their_middleware_check(options: dict[str, Any], needle: str) -> None:
    fault = options_fault(options, Expiry.call_options)
    assert fault is not None
    assert fault.startswith(needle), fault


def test_valid_per_call_options_pass() -> None:
    assert options_fault({"max_age": 30, "other": None}, Expiry.call_options) is None


def test_an_option_no_middleware_here_declares_is_left_alone() -> None:
    """A newer producer's option reaching an older worker (a rolling deploy) does not
    dead-letter the message; enqueue still refuses an unknown option at the edge."""
    assert options_fault({"nobody": 1, "max_age": 30}, Expiry.call_options) is None


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


def test_a_fault_quotes_a_huge_value_cut_with_its_length() -> None:
    huge = "x" * 100_000  # a hand-written message: its reason is shown on one line
    fault = envelope_fault(Envelope(huge, "t", "q"), time.time())
    assert fault is not None
    assert fault.startswith("id is 'xxxx")
    assert "... (100002 characters)" in fault
    assert len(fault) < 300, fault
