"""The one parser of user JSON (:func:`blitzq.json_input.parse_json`): what it refuses, with
the error naming the input, and what it lets through unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from blitzq import ConfigurationError
from blitzq.json_input import parse_json
from blitzq.limits import MAX_JSON_DEPTH

pytestmark = pytest.mark.timeout(30)


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def _nested_list(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1e999]", "--args: 1e999 is not a finite number"),
        ("[-1e999]", "--args: -1e999 is not a finite number"),
        ("[NaN]", "--args: NaN is not a JSON number"),
        ("[Infinity]", "--args: Infinity is not a JSON number"),
        ("[-Infinity]", "--args: -Infinity is not a JSON number"),
        (_nested(MAX_JSON_DEPTH + 1), f"--args: nested deeper than {MAX_JSON_DEPTH} levels"),
        (_nested(100_000), f"--args: nested deeper than {MAX_JSON_DEPTH} levels"),
        ('[{"a": ' * 40 + "1" + "}]" * 40, "--args: nested deeper than"),
        ("[18446744073709551616]", "--args: 18446744073709551616 is outside the 64-bit"),
        ("[-9223372036854775809]", "--args: -9223372036854775809 is outside the 64-bit"),
        ("[" + "9" * 5000 + "]", "is outside the 64-bit integer range"),
        ('["\\ud800"]', "--args: the string '\\ud800' is not valid Unicode text"),
        ('[{"\\udc00": 1}]', "--args: the string '\\udc00' is not valid Unicode text"),
        ("[1, 2", "--args: not JSON: "),
        ("", "--args: not JSON: "),
        (b"[\xff]", "--args: not JSON: "),
        ("{}", "--args: expected a JSON list, got an object"),
        ('"x"', "--args: expected a JSON list, got a string"),
        ("1", "--args: expected a JSON list, got a number"),
        ("null", "--args: expected a JSON list, got null"),
        ("true", "--args: expected a JSON list, got true"),
    ],
    ids=lambda v: repr(v)[:30] if isinstance(v, str | bytes) else None,
)
def test_refused_with_a_configuration_error_naming_the_input(
    text: str | bytes, message: str
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_json(text, "--args", expect=list)
    assert str(caught.value).startswith(message) or message in str(caught.value)
    assert str(caught.value).startswith("--args: ")


@pytest.mark.parametrize(
    ("text", "expect", "value"),
    [
        (_nested(MAX_JSON_DEPTH), list, _nested_list(MAX_JSON_DEPTH)),
        (
            "[1.5, -0.0, 1e308, 18446744073709551615, -9223372036854775808]",
            list,
            [1.5, -0.0, 1e308, 2**64 - 1, -(2**63)],
        ),
        (
            '{"a": [1, {"b": null}], "\\u00e9": "\\ud83d\\ude00"}',
            dict,
            {"a": [1, {"b": None}], "é": "😀"},
        ),
        (b'{"confirm": "ns"}', dict, {"confirm": "ns"}),
        ("3", None, 3),
    ],
)
def test_plain_json_passes_unchanged(text: str | bytes, expect: Any, value: Any) -> None:
    assert parse_json(text, "x", expect=expect) == value


def test_max_depth_is_a_parameter() -> None:
    assert parse_json("[[1]]", "x", max_depth=2) == [[1]]
    with pytest.raises(ConfigurationError, match="x: nested deeper than 1 levels"):
        parse_json("[[1]]", "x", max_depth=1)
