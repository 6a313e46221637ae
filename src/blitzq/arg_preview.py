"""A bounded, JSON-able preview of a task's arguments, kept in its record for debugging.

:func:`preview` turns any ``(args, kwargs)`` into plain JSON data (lists, ``str``-keyed dicts,
strings, finite numbers, booleans, ``None``) whose JSON encoding is at most
:data:`MAX_PREVIEW_BYTES` bytes, and never raises. What is not JSON data is shown as text:
``bytes`` and other objects by their ``repr``, ``datetime``/``date`` in ISO 8601, ``UUID`` and
``Decimal`` as strings, integers beyond 64 bits, NaN and infinities by their ``repr``. What does
not fit is cut and marked: a string keeps its start followed by :data:`CUT`, a list ends with
the string ``"… N more"``, a dict with the key ``"…"`` (value ``"N more"``), and the preview's
``truncated`` is ``True``.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import json
import math
import uuid
from typing import Any, Final

__all__ = ["CUT", "MAX_PREVIEW_BYTES", "preview"]

#: Most bytes of a preview, encoded as compact JSON (UTF-8).
MAX_PREVIEW_BYTES: Final = 2048
#: Appended to a string (or a ``repr``) that was cut.
CUT: Final = "…"

_DEPTH: Final = 12  # containers nested deeper are shown as "[…]" / "{…}"
_MARK: Final = 24  # room kept for a container's "… N more" marker (bytes)
_ROOM: Final = 16  # least budget left (bytes) to show one more item rather than the marker
_FRAME: Final = len('{"args":,"kwargs":,"truncated":false}')
_INT64: Final = (-(1 << 63), (1 << 64) - 1)  # what a MessagePack record can store


def _json_size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _safe_repr(value: Any) -> str:
    try:
        text = repr(value)
    except BaseException:  # a repr that raises still has to be shown
        text = ""
    if not isinstance(text, str) or not text:
        return f"<{type(value).__name__} object>"
    return text


class _Walk:
    """One preview: the budget left (bytes) and whether anything was cut."""

    def __init__(self, budget: int) -> None:
        self.left = budget
        self.cut = False

    def clipped(self, s: str) -> str:
        """``s`` as shown: whole when it fits the budget, else its start and :data:`CUT`."""
        whole = len(s) + 2 <= self.left  # every character is at least one byte
        if not whole:
            s = s[: max(self.left, 0)]
        try:
            s.encode()
        except UnicodeEncodeError:  # lone surrogates: shown escaped
            s = s.encode("utf-8", "backslashreplace").decode()
        if whole:
            size = _json_size(s)
            if size <= self.left:
                self.left -= size
                return s
        keep = len(s)
        while True:
            out = s[:keep] + CUT
            size = _json_size(out)
            if size <= self.left or keep == 0:
                break
            keep = max(0, min(keep - 1, keep * max(self.left - 5, 0) // size))
        self.cut = True
        self.left -= size
        return out

    def value(self, v: Any, depth: int) -> Any:
        try:
            return self._value(v, depth)
        except Exception:  # a str/int subclass, a __str__ that raises, ...
            return self.clipped(_safe_repr(v))

    def _value(self, v: Any, depth: int) -> Any:
        if v is None or isinstance(v, bool):
            self.left -= 5
            return v
        if isinstance(v, int):
            v = int(v)
            if not _INT64[0] <= v <= _INT64[1]:
                return self.clipped(
                    _safe_repr(v) if abs(v) < 1 << 4000 else f"<int of {v.bit_length()} bits>"
                )
            self.left -= len(str(v))
            return v
        if isinstance(v, float):
            v = float(v)
            if not math.isfinite(v):
                return self.clipped(repr(v))
            self.left -= len(repr(v))
            return v
        if isinstance(v, str):
            return self.clipped(str.__str__(v))
        if isinstance(v, list | tuple):
            return self.seq(v, depth)
        if isinstance(v, dict):
            return self.mapping(v, depth)
        if isinstance(v, _dt.date):
            return self.clipped(v.isoformat())
        if isinstance(v, uuid.UUID | decimal.Decimal):
            return self.clipped(str(v))
        if isinstance(v, bytes | bytearray | memoryview):
            head = bytes(v[: max(self.left, 0)])
            if len(head) < len(bytes(v)):
                self.cut = True
                return self.clipped(repr(head) + CUT)
            return self.clipped(repr(head))
        return self.clipped(_safe_repr(v))

    def seq(self, items: list[Any] | tuple[Any, ...], depth: int) -> Any:
        if depth >= _DEPTH:
            self.cut = True
            return self.clipped("[" + CUT + "]")
        self.left -= 2 + _MARK  # the brackets, and room for this list's own marker
        out: list[Any] = []
        more = 0
        for i, item in enumerate(items):
            if self.left < _ROOM:
                more = len(items) - i
                break
            out.append(self.value(item, depth + 1))
            self.left -= 1
        self.left += _MARK
        if more:
            self.cut = True
            out.append(f"{CUT} {more} more")
            self.left -= _json_size(out[-1]) + 1
        return out

    def mapping(self, items: dict[Any, Any], depth: int) -> Any:
        if depth >= _DEPTH:
            self.cut = True
            return self.clipped("{" + CUT + "}")
        self.left -= 2 + _MARK  # the braces, and room for this dict's own marker
        out: dict[str, Any] = {}
        more = 0
        for i, (key, item) in enumerate(items.items()):
            if self.left < _ROOM:
                more = len(items) - i
                break
            name = key if isinstance(key, str) else _safe_repr(key)
            name = self.clipped(str.__str__(name))
            while name in out:  # two keys shown alike (a cut, a repr): keep both
                name += "'"
                self.left -= 1
            self.left -= 1
            out[name] = self.value(item, depth + 1)
            self.left -= 1
        self.left += _MARK
        if more:
            self.cut = True
            out[CUT] = f"{more} more"
            self.left -= _json_size({CUT: out[CUT]}) - 1
        return out


def _build(args: Any, kwargs: Any, budget: int) -> dict[str, Any]:
    walk = _Walk(budget)
    has_kwargs = isinstance(kwargs, dict) and bool(kwargs)
    reserve = min(budget // 3, 256) if has_kwargs else 0
    walk.left -= reserve
    if args is None:
        args = []
    shown_args = walk.value(list(args) if isinstance(args, tuple) else args, 0)
    if not isinstance(shown_args, list):
        shown_args = [shown_args]
    walk.left += reserve
    shown_kwargs = walk.value(kwargs if isinstance(kwargs, dict) else {}, 0)
    if not isinstance(kwargs, dict) and kwargs is not None:
        shown_kwargs = {CUT: walk.clipped(_safe_repr(kwargs))}
    return {"args": shown_args, "kwargs": shown_kwargs, "truncated": walk.cut}


def preview(args: Any, kwargs: Any, limit: int = MAX_PREVIEW_BYTES) -> dict[str, Any]:
    """A JSON-able preview of a call's arguments, at most ``limit`` bytes as compact JSON.

    Args:
        args: the positional arguments (a list or tuple; anything else is shown as one).
        kwargs: the keyword arguments (a dict; anything else is shown by its ``repr``).
        limit: most bytes of the preview's compact JSON (UTF-8); at least 64.

    Returns:
        ``{"args": list, "kwargs": dict, "truncated": bool}`` (see the module's docstring
        for how values are shown and cut). Never raises.
    """
    limit = max(int(limit), 64)
    budget = limit - _FRAME
    for _ in range(4):
        try:
            out = _build(args, kwargs, budget)
            if _json_size(out) <= limit:
                return out
        except BaseException as exc:  # never raise, whatever the values
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
        budget //= 2
    return {"args": [CUT], "kwargs": {}, "truncated": True}
