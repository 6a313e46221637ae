"""``value_size``: what ``max_result_size`` counts, an encoded value without its outermost
MessagePack type-and-length header, for every header width."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from typing import Any

import pytest

from blitzq.envelope_checks import value_size
from blitzq.serialization import dumps


@pytest.mark.parametrize("length", [0, 1, 31, 32, 255, 256, 65535, 65536, 70000])
def test_bytes_and_str_count_their_length(length: int) -> None:
    assert value_size(dumps(b"x" * length)) == length
    assert value_size(dumps("x" * length)) == length
    assert value_size(dumps("\u00e9" * length)) == 2 * length  # UTF-8 bytes


@pytest.mark.parametrize("count", [0, 15, 16, 65535, 65536])
def test_lists_and_dicts_count_their_encoded_items(count: int) -> None:
    assert value_size(dumps([1] * count)) == count
    mapping = {f"{i:06d}": None for i in range(count)}
    assert value_size(dumps(mapping)) == count * 8  # a 6-character fixstr key (7) and nil (1)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (None, 1),
        (True, 1),
        (5, 1),
        (2**40, 9),
        (1.5, 9),
        (dt.date(2026, 1, 2), len(b"2026-01-02")),
        (uuid.UUID(int=7), 16),
        (decimal.Decimal("1.25"), 4),
    ],
    ids=repr,
)
def test_scalars_and_extensions(value: Any, size: int) -> None:
    assert value_size(dumps(value)) == size


def test_empty_input_is_zero() -> None:
    assert value_size(b"") == 0
