"""Where the project file is: the walk of :func:`blitzq.config.search` on plain ``os`` calls,
so that ``blitzq --help`` (:func:`blitzq.cli.fast_help`) can ask it without importing
pathlib, logging or the rest of :mod:`blitzq.config`. :mod:`blitzq.config` is the one
documented interface; this module holds the part both need.
"""

from __future__ import annotations

import os
import stat


def distrust(path: str | os.PathLike[str], uid: int | None = None) -> str | None:
    """Why the file at ``path`` must not configure this process, or ``None`` when it may.

    A file may when it (and, for a symbolic link, the link too) is owned by ``uid`` or by
    root, and is not writable by every user: anything else another local user could have
    planted or changed, and its settings choose the broker and the code a worker imports
    (``[tool.blitzq.worker] configure``).

    Args:
        path: the file (it exists).
        uid: the user trusted besides root (default: the effective uid of this process).

    Returns:
        ``None``, or a sentence saying whose the file is (``"owned by uid 1001, not by you
        (uid 1000) or root"``) or that every user may write it.

    Raises:
        OSError: the file cannot be stat'ed.
    """
    uid = os.geteuid() if uid is None else uid
    for st in (os.lstat(path), os.stat(path)):
        if st.st_uid not in (uid, 0):
            return f"owned by uid {st.st_uid}, not by you (uid {uid}) or root"
        if stat.S_ISREG(st.st_mode) and st.st_mode & stat.S_IWOTH:
            return f"writable by every user (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def walk(
    start: str, uid: int | None = None
) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    """From the directory ``start`` (resolved) upwards, the first ``pyproject.toml`` that
    :func:`distrust` accepts, and the project root the walk stopped at.

    Each directory's ``pyproject.toml`` is looked at: one refused is noted and skipped; the
    first other one ends the walk. A directory holding ``.git`` ends it too.

    Args:
        start: the directory to walk up from.
        uid: the user trusted besides root (default: this process's effective uid).

    Returns:
        ``(file, root, refused)``: the accepted ``pyproject.toml`` or ``None``; the directory
        the walk stopped at (``None``: it reached ``/``); ``(path, why)`` of each file refused,
        in the order met.
    """
    here = os.path.realpath(start)
    refused: list[tuple[str, str]] = []
    while True:
        candidate = os.path.join(here, "pyproject.toml")
        if os.path.isfile(candidate):
            why = distrust(candidate, uid)
            if why is None:
                return candidate, here, refused
            refused.append((candidate, why))
        if os.path.exists(os.path.join(here, ".git")):
            return None, here, refused
        parent = os.path.dirname(here)
        if parent == here:
            return None, None, refused
        here = parent


#: The keys of the table blitzq reads: ``[tool.blitzq]``.
_TABLE = ("tool", "blitzq")

#: The characters of a bare TOML key.
_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


def may_hold_table(data: bytes) -> bool:
    """Whether the TOML file ``data`` may define a ``[tool.blitzq]`` table (or a ``tool`` that
    is not a table), without parsing it: ``False`` only when it certainly does not, so that
    the file need not be parsed (:func:`blitzq.config.search` then reads no TOML).

    It is ``False`` when ``data`` holds neither the text ``blitzq`` nor a ``\\u``, ``\\U`` or
    ``\\x`` escape (a quoted key spelling it); else when a scan of its statements finds every
    table header and every key path of a key/value pair, quoted keys without escapes
    included, outside ``tool.blitzq`` and none naming ``tool`` itself (``tool = ...``,
    ``[[tool]]``). Strings, comments, arrays and inline tables are skipped as TOML reads
    them. Anything the scan does not follow (an escape in a quoted key, a date-time with a
    space, text that is not UTF-8 or not TOML) makes it ``True``: the parser decides. An
    invalid file may be found ``False``: its errors are then left to the tools it is for.

    Args:
        data: the file's bytes.
    """
    if b"blitzq" not in data and not any(e in data for e in (b"\\u", b"\\U", b"\\x")):
        return False
    try:
        text = data.decode("utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError:
        return True
    if "\r" in text:
        return True
    try:
        return _Scan(text).holds()
    except (_Unsure, IndexError):
        return True


class _Unsure(Exception):
    """The scan met something it does not follow: the file must be parsed."""


class _Scan:
    """One pass over a TOML text's statements (:func:`may_hold_table`); ``i`` is the index
    of the next character."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0

    def holds(self) -> bool:
        """Whether a table header or a key path may define ``tool.blitzq`` or ``tool``."""
        s = self.s
        table: tuple[str, ...] = ()
        while True:
            self.blank()
            if self.i >= len(s):
                return False
            if s[self.i] == "[":
                double = s.startswith("[[", self.i)
                self.i += 2 if double else 1
                table = self.key()
                self.expect("]]" if double else "]")
                if table[:2] == _TABLE or (double and table == ("tool",)):
                    return True
            else:
                path = table + self.key()
                if path[:2] == _TABLE or path == ("tool",):
                    return True
                self.expect("=")
                self.value()
            self.ws()
            if s.startswith("#", self.i):
                self.i = _end(s.find("\n", self.i), len(s))
            if self.i < len(s) and s[self.i] != "\n":
                raise _Unsure

    def ws(self) -> None:
        """Skip spaces and tabs."""
        s, i = self.s, self.i
        while i < len(s) and s[i] in " \t":
            i += 1
        self.i = i

    def blank(self) -> None:
        """Skip whitespace, newlines and comments."""
        s, i = self.s, self.i
        while i < len(s):
            if s[i] in " \t\n":
                i += 1
            elif s[i] == "#":
                i = _end(s.find("\n", i), len(s))
            else:
                break
        self.i = i

    def expect(self, token: str) -> None:
        """Skip whitespace, then ``token``."""
        self.ws()
        if not self.s.startswith(token, self.i):
            raise _Unsure
        self.i += len(token)

    def key(self) -> tuple[str, ...]:
        """A dotted key's parts (a basic-string part with an escape is :class:`_Unsure`)."""
        s = self.s
        parts = []
        while True:
            self.ws()
            start = self.i
            if s[start] in "\"'":
                end = s.find(s[start], start + 1)
                part = s[start + 1 : end]
                if end < 0 or "\n" in part or "\\" in part:
                    raise _Unsure
                self.i = end + 1
            else:
                end = start
                while end < len(s) and s[end] in _BARE:
                    end += 1
                if end == start:
                    raise _Unsure
                part = s[start:end]
                self.i = end
            parts.append(part)
            self.ws()
            if not s.startswith(".", self.i):
                return tuple(parts)
            self.i += 1

    def value(self) -> None:
        """Skip one value: a string, an array, an inline table or a scalar."""
        self.ws()
        s = self.s
        c = s[self.i]
        if c == '"' or c == "'":
            self.string(c)
        elif c == "[" or c == "{":
            close = "]" if c == "[" else "}"
            self.i += 1
            while True:
                self.blank()
                if s[self.i] == close:
                    break
                if c == "{":
                    self.key()
                    self.expect("=")
                self.value()
                self.blank()
                if s[self.i] == close:
                    break
                if s[self.i] != ",":
                    raise _Unsure
                self.i += 1
            self.i += 1
        else:
            end = self.i
            while end < len(s) and s[end] not in " \t\n,]}#":
                end += 1
            if end == self.i:
                raise _Unsure
            self.i = end

    def string(self, quote: str) -> None:
        """Skip a basic (``quote`` ``"``) or literal (``'``) string, single- or multi-line."""
        s = self.s
        multi = s.startswith(quote * 3, self.i)
        delimiter = quote * 3 if multi else quote
        start = j = self.i + len(delimiter)
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
        if multi:  # up to two more quotes end the content
            for _ in range(2):
                if s.startswith(quote, end):
                    end += 1
        self.i = end


def _end(found: int, length: int) -> int:
    """``found`` (a ``str.find`` result), or ``length`` when it is -1."""
    return length if found < 0 else found
