"""Where the project file is: the walk of :func:`blitzq.config.search` on plain ``os`` calls,
so that ``blitzq --help`` (:func:`blitzq.cli.fast_help`) can ask it without importing
pathlib, logging or the rest of :mod:`blitzq.config`, and :func:`may_hold_table`, which
spares both the parse of a ``pyproject.toml`` that certainly holds no ``[tool.blitzq]``
table. :mod:`blitzq.config` is the one documented interface; this module holds the part
both need.
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


def may_hold_table(data: bytes) -> bool:
    """Whether the TOML file ``data`` may define a ``[tool.blitzq]`` table (or a ``tool`` that
    is not a table), without parsing it: ``False`` only when it certainly does not, so that
    the file need not be parsed (:func:`blitzq.config.search` then reads no TOML).

    It is ``False`` when ``data`` holds neither the text ``blitzq`` nor a ``\\u``, ``\\U`` or
    ``\\x`` escape (a quoted key spelling it); else when :func:`blitzq._tomlscan.holds_table`
    finds every table header and every key path of a key/value pair, quoted keys without
    escapes included, outside ``tool.blitzq`` and none naming ``tool`` itself
    (``tool = ...``, ``[[tool]]``). Anything that scan does not follow (an escape in a quoted
    key, a date-time with a space, text that is not UTF-8 or not TOML) makes it ``True``:
    the parser decides. An invalid file may be found ``False``: its errors are then left to
    the tools it is for.

    Args:
        data: the file's bytes.
    """
    if b"blitzq" not in data and not any(e in data for e in (b"\\u", b"\\U", b"\\x")):
        return False
    from ._tomlscan import holds_table

    return holds_table(data)
