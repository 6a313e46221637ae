"""JSON that a user hands blitzq at an edge: one parser for every command option and API body.

:func:`parse_json` is what ``blitzq schedule add --args``/``--kwargs`` and the dashboard's
request bodies go through. It accepts only what blitzq can carry as plain data, and refuses
the rest with a :class:`~blitzq.exceptions.ConfigurationError` naming the input:

* text that is not JSON (or bytes that are not UTF-8);
* nesting deeper than :data:`~blitzq.limits.MAX_JSON_DEPTH` levels (Python's own parser
  would otherwise raise ``RecursionError`` on a deep enough document);
* numbers that are not finite: ``NaN``, ``Infinity``, ``-Infinity`` (not JSON, though
  Python's parser takes them) and literals such as ``1e999`` that overflow to an infinity;
* integers outside the 64-bit range a message can hold (``-2**63`` to ``2**64 - 1``);
* strings (keys included) that are not valid Unicode: a ``"\\ud800"`` escape decodes to a
  lone surrogate, which no message can encode;
* a document of another type than the one expected (a list for ``--args``, an object for
  ``--kwargs`` or a request body).
"""

from __future__ import annotations

import json
import math
from typing import Any

from .exceptions import ConfigurationError
from .limits import MAX_JSON_DEPTH

__all__ = ["parse_json"]

#: The integers a message can hold (MessagePack's int64 and uint64).
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1
_KIND_NAMES = {list: "list", dict: "object"}


class _Refused(ValueError):
    """A value the parser's hooks refuse; its message is shown after the input's name."""


def _constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number (only finite numbers are)")


def _float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _Refused(f"{literal} is not a finite number (it overflows a 64-bit float)")
    return value


def _int(literal: str) -> int:
    # More than 20 digits is out of range whatever they are (and int() of thousands of
    # digits is slow, or refused past Python's own limit).
    value = int(literal) if len(literal.lstrip("-")) <= 20 else _INT_MAX + 1
    if not _INT_MIN <= value <= _INT_MAX:
        raise _Refused(f"{literal[:40]} is outside the 64-bit integer range")
    return value


def _type_name(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return "a string" if isinstance(value, str) else "a number"


def _check(value: Any, max_depth: int) -> str | None:
    """What is wrong with parsed ``value`` (too deep, a string that is not valid Unicode),
    or ``None``; walks it without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | dict):
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                bad = exc.object[exc.start : exc.end]
                return f"the string {bad!r} is not valid Unicode text (a lone surrogate)"
    return None


def parse_json(
    text: str | bytes,
    what: str,
    *,
    expect: type[list[Any]] | type[dict[str, Any]] | None = None,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Parse ``text`` as JSON that blitzq can carry as plain data (see the module docstring).

    Args:
        text: the JSON document, as text or as UTF-8 bytes.
        what: the input's name for the error message (``"--args"``, ``"the request body"``).
        expect: ``list`` or ``dict`` to require a document of that type, or ``None``.
        max_depth: deepest nesting of lists and objects allowed (levels; the document itself
            is level 1).

    Returns:
        The parsed value: ``None``, ``bool``, ``int``, ``float``, ``str``, ``list`` or
        ``dict`` with ``str`` keys.

    Raises:
        ConfigurationError: ``text`` is not JSON, is nested too deep, holds a non-finite or
            out-of-range number or a string that is not valid Unicode, or is not of the
            ``expect``-ed type; the message starts with ``what``.
    """
    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int)
    except _Refused as exc:
        raise ConfigurationError(f"{what}: {exc}") from None
    except RecursionError:
        raise ConfigurationError(f"{what}: nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, int digits limit
        raise ConfigurationError(f"{what}: not JSON: {exc}") from None
    problem = _check(value, max_depth)
    if problem is not None:
        raise ConfigurationError(f"{what}: {problem}")
    if expect is not None and not isinstance(value, expect):
        raise ConfigurationError(
            f"{what}: expected a JSON {_KIND_NAMES[expect]}, got {_type_name(value)}"
        )
    return value
