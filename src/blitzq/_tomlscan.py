"""Whether a TOML text may define a ``[tool.blitzq]`` table, without parsing it: one pass over
its statements that follows table headers and key paths and skips values, strings and
comments as TOML reads them. :func:`blitzq._project.may_hold_table` calls it for a
``pyproject.toml`` that names blitzq, so that a project file without the table costs no
``tomllib`` (which imports ``re``, ``typing`` and ``datetime``, and compiles its patterns)
when ``blitzq --help`` or :func:`blitzq.config.search` looks at it.

The scan is exact in one direction only: when it answers ``False`` the text, if it is valid
TOML, has no ``tool.blitzq`` key; whatever it does not follow makes it answer ``True``.
"""

from __future__ import annotations

#: The keys of the table blitzq reads: ``[tool.blitzq]``.
_TABLE = ("tool", "blitzq")

#: The characters of a bare TOML key.
_BARE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-"

#: A bare key this long or longer is left to the parser (one slice holds a shorter one).
_LONG_KEY = 120


class _Unsure(Exception):
    """The scan met something it does not follow: the text must be parsed."""


def holds_table(data: bytes) -> bool:
    """``False`` when the TOML text ``data`` certainly defines no ``tool.blitzq`` key (and
    no ``tool`` that is not a table), ``True`` when it may: a table header or a key path
    (table, then dotted key) starting ``tool.blitzq`` or naming ``tool`` itself (a key/value
    pair or ``[[tool]]``), a quoted key with an escape, or anything not followed (text that
    is not UTF-8, a lone carriage return, a date-time with a space, invalid TOML).

    Args:
        data: the file's bytes.
    """
    try:
        text = data.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError:
        return True
    if "\r" in text:
        return True
    try:
        return _scan(text + "\n")  # a newline at the end: no scan of spaces runs past it
    except (_Unsure, IndexError):
        return True


def _scan(s: str) -> bool:
    """:func:`holds_table` of ``s``, which ends with a newline.

    Raises:
        _Unsure: the text is not followed.
        IndexError: it ended inside a statement.
    """
    n = len(s)
    i = 0
    table: tuple[str, ...] = ()
    while True:
        i = _blank(s, i)
        if i >= n:
            return False
        if s[i] == "[":
            double = s[i + 1] == "["
            i, table = _key(s, i + 2 if double else i + 1)
            close = "]]" if double else "]"
            if not s.startswith(close, i):
                raise _Unsure
            i += len(close)
            if table[:2] == _TABLE or (double and table == ("tool",)):
                return True
        else:
            equals = s.find("=", i)
            plain = s[i:equals]  # the key, unless quoted
            if equals < 0 or "blitzq" in plain or "tool" in plain or '"' in plain or "'" in plain:
                i, key = _key(s, i)
                path = table + key
                if path[:2] == _TABLE or path == ("tool",):
                    return True
                if s[i] != "=":
                    raise _Unsure
                equals = i
            i = _value(s, equals + 1)
        while s[i] in " \t":
            i += 1
        if s[i] == "#":
            i = s.index("\n", i)
        if s[i] != "\n":
            raise _Unsure


def _blank(s: str, i: int) -> int:
    """The index of the first character from ``i`` that is not a space, a tab, a newline or
    in a comment (``len(s)`` at the end)."""
    if i < len(s) and s[i] not in " \t\n#":
        return i
    while True:
        chunk = s[i : i + 64]
        rest = chunk.lstrip(" \t\n")
        i += len(chunk) - len(rest)
        if rest[:1] == "#":
            i = s.index("\n", i)
        elif rest or not chunk:
            return i


def _key(s: str, i: int) -> tuple[int, tuple[str, ...]]:
    """A dotted key at ``i`` (spaces before it skipped): the index after it and the spaces
    that follow, and its parts.

    Raises:
        _Unsure: no key, a quoted part with an escape or a newline, or a long bare part.
    """
    parts = []
    while True:
        while s[i] in " \t":
            i += 1
        c = s[i]
        if c == '"' or c == "'":
            end = s.find(c, i + 1)
            part = s[i + 1 : end]
            if end < 0 or "\n" in part or "\\" in part:
                raise _Unsure
            i = end + 1
        else:
            chunk = s[i : i + _LONG_KEY]
            rest = chunk.lstrip(_BARE)
            size = len(chunk) - len(rest)
            if size == 0 or not rest:
                raise _Unsure
            part = chunk[:size]
            i += size
        parts.append(part)
        while s[i] in " \t":
            i += 1
        if s[i] != ".":
            return i, tuple(parts)
        i += 1


def _value(s: str, i: int) -> int:
    """The index after the value at ``i`` (spaces before it skipped): a string, an array, an
    inline table, or a scalar (a number, a boolean, a date or time without a space).

    Raises:
        _Unsure: the value is not followed.
    """
    while s[i] in " \t":
        i += 1
    c = s[i]
    if c == '"' or c == "'":
        return _string(s, i, c)
    if c == "[":
        end = s.find("]", i)
        inside = s[i + 1 : end]
        if (  # an array of plain numbers or strings: each quote opens or closes a string
            end > 0
            and inside.count('"') % 2 == 0
            and "'" not in inside
            and "#" not in inside
            and "[" not in inside
            and "{" not in inside
            and "\\" not in inside
            and '"""' not in inside
        ):
            return end + 1
    if c == "[" or c == "{":
        close = "]" if c == "[" else "}"
        i += 1
        while True:
            i = _blank(s, i)
            if s[i] == close:
                return i + 1
            if c == "{":
                i = _key(s, i)[0]
                if s[i] != "=":
                    raise _Unsure
                i += 1
            i = _blank(s, _value(s, i))
            if s[i] == close:
                return i + 1
            if s[i] != ",":
                raise _Unsure
            i += 1
    start = i
    while s[i] not in " \t\n,]}#":
        i += 1
    if i == start:
        raise _Unsure
    return i


def _string(s: str, i: int, quote: str) -> int:
    """The index after the basic (``quote`` ``"``) or literal (``'``) string at ``i``,
    single- or multi-line.

    Raises:
        _Unsure: it does not end, or a single-line one holds a newline.
    """
    multi = s.startswith(quote * 3, i)
    delimiter = quote * 3 if multi else quote
    start = j = i + len(delimiter)
    while True:
        end = s.find(delimiter, j)
        if end < 0:
            raise _Unsure
        escape = s.find("\\", j, end) if quote == '"' else -1
        if escape < 0:
            break
        j = escape + 2
    if not multi and "\n" in s[start:end]:
        raise _Unsure
    end += len(delimiter)
    if multi:  # up to two more quotes belong to the content
        for _ in range(2):
            if s.startswith(quote, end):
                end += 1
    return end
