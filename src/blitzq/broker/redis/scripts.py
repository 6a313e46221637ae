"""The one loader of the Lua scripts in ``lua/``, and the one way they are run.

- :func:`load` reads a script once per process: its text, with each line
  ``--@include <file>.lua`` replaced by that file's text (shared functions such as the
  dead-letter retention of ``dead_letters.lua``), its ``KEY`` calls expanded
  (:func:`expand_keys`) and its comment lines emptied (:func:`strip_comments`), and its SHA1
  digest. Every broker of the process shares that :class:`Script`.
- The scripts build every key name with ``KEY.<name>(prefix, <parts>...)``, which the loader
  replaces by the concatenation ``keys.TABLE`` gives (``KEY.record(prefix, id)`` becomes
  ``(prefix .. 't:' .. id)``, the name ``Keys(ns).record(id)`` makes in Python): a key's
  suffix is written only in ``keys.py``, and building a key costs no Lua function call.
- :class:`Scripts` runs them on one client: ``EVALSHA``, and on ``NOSCRIPT`` (a server that
  restarted, failed over or flushed its script cache, or that never saw the script)
  ``SCRIPT LOAD`` then ``EVALSHA`` again. Plain EVALSHA works on every supported server
  (Redis 6 and 7, Valkey). Redis Functions (``FUNCTION LOAD``, Redis >= 7) are not used: a
  library is named and persisted, so processes of two blitzq versions sharing a server would
  replace each other's library, while a script is addressed by the digest of its own text.

A script is named by its file name without ``.lua`` (``"complete"`` is ``lua/complete.lua``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from .keys import TABLE
from .pool import direct_pool, plain_execute, run_direct

INCLUDE = "--@include "
"""A line starting with this is replaced by the text of the file it names."""

_ARG = r"[A-Za-z_]\w*(?:\[\w+\])?"
_CALL = re.compile(rf"KEY\.(\w+)\(\s*({_ARG}(?:\s*,\s*{_ARG})*)\s*\)")
"""A key built in a script: ``KEY.<name>(prefix, <parts>...)``, each argument a plain name,
``KEY`` not preceded by a word character (:func:`_free`). The patterns start with the
literal ``KEY.`` and leave the word boundary to :func:`_free`: a leading ``\\b`` would stop
``re`` from scanning for the literal, about 20 times slower over a script's text."""
_ANY_CALL = re.compile(r"KEY\.\w+\s*\(")
_WORD = re.compile(r"\w")
_PLAIN = re.compile(r"[\w:.-]*")
"""What a literal of a key's pattern may hold to be written as a plain quoted Lua string."""


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script as sent to the server.

    Attributes:
        name: file name without ``.lua``.
        source: the text with its ``--@include`` lines and ``KEY`` calls expanded.
        sha: SHA1 hex digest of ``source`` encoded as UTF-8 (the ``EVALSHA`` argument).
    """

    name: str
    source: str
    sha: str


_loaded: dict[str, Script] = {}
_folder: list[Any] = []  # the ``lua/`` folder, found at the first read


def _free(text: str, at: int) -> bool:
    """Whether a ``KEY`` found at index ``at`` of ``text`` starts a word (``\\bKEY``)."""
    return at == 0 or _WORD.match(text, at - 1) is None


def _read(file: str) -> str:
    """Text of ``lua/<file>`` with its ``--@include`` lines expanded (recursively)."""
    if not _folder:
        _folder.append(resources.files(__package__).joinpath("lua"))
    text: str = _folder[0].joinpath(file).read_text()
    if INCLUDE not in text:
        return text
    lines = [
        _read(line.removeprefix(INCLUDE).strip()) if line.startswith(INCLUDE) else line
        for line in text.splitlines()
    ]
    return "\n".join(lines) + "\n"


def expand_keys(text: str) -> str:
    """``text`` with each call ``KEY.<name>(prefix, <parts>...)`` replaced by the name it builds.

    The name is ``prefix`` followed by the pattern of ``keys.TABLE[name]`` with the parts
    filled in: ``KEY.workflow_join(prefix, op[2], op[3])`` becomes
    ``(prefix .. 'wf:' .. op[2] .. ':j:' .. op[3])``. Expanded once, when the script is read,
    so building a key costs the script nothing more than the concatenation written by hand.

    Args:
        text: Lua source. Each argument of a ``KEY`` call is a name, optionally indexed once
            (``id``, ``ARGV[1]``, ``c[3]``).

    Raises:
        KeyError: a name that is not in ``keys.TABLE`` (a script calling an unknown key).
        ValueError: a call with the wrong number of parts or with other arguments, or a
            pattern that a plain quoted Lua string cannot hold as is.
    """

    def expand(call: re.Match[str]) -> str:
        if not _free(text, call.start()):
            return call.group()
        key = TABLE[call.group(1)]
        prefix, *parts = (arg.strip() for arg in call.group(2).split(","))
        if len(parts) != len(key.parts):
            raise ValueError(f"{call.group()}: {call.group(1)} takes {key.parts} after prefix")
        pieces = [prefix]
        for literal, part in zip(key.literals, [*parts, None], strict=True):
            if not _PLAIN.fullmatch(literal):
                raise ValueError(f"{call.group(1)}: {literal!r} is not a plain Lua string")
            if literal:
                pieces.append(repr(literal))
            if part is not None:
                pieces.append(part)
        return "(" + " .. ".join(pieces) + ")"

    out = _CALL.sub(expand, text)
    for left in _ANY_CALL.finditer(out):
        if _free(out, left.start()):
            line = out[: left.start()].count("\n") + 1
            raise ValueError(f"line {line}: a KEY call takes prefix and parts as plain names")
    return out


def strip_comments(text: str) -> str:
    """``text`` with each line that holds only a comment (``--`` after spaces) made empty.

    Half the text of the shipped scripts is comments, which the server would hash (the
    script's SHA1) and read through at every ``SCRIPT LOAD`` -- each worker's start, and
    each time a server lost its scripts. The lines stay (empty), so a line number in a
    server's error still points at the expanded text's line. A comment after code on the
    same line stays: it could be inside a string. (The scripts hold no long strings,
    ``[[ ... ]]``, whose lines could start with ``--``.)

    Args:
        text: Lua source.
    """
    return "\n".join("" if line.lstrip().startswith("--") else line for line in text.split("\n"))


def load(name: str) -> Script:
    """The script ``lua/<name>.lua``, read and hashed once per process.

    Args:
        name: file name without ``.lua``, e.g. ``"complete"``.

    Raises:
        FileNotFoundError: no such script ships with blitzq (a programming error).
        KeyError, ValueError: a ``KEY`` call :func:`expand_keys` refuses (a programming
            error).
    """
    script = _loaded.get(name)
    if script is None:
        source = strip_comments(expand_keys(_read(f"{name}.lua")))
        script = Script(name, source, hashlib.sha1(source.encode()).hexdigest())
        _loaded[name] = script
    return script


def names() -> list[str]:
    """Names of every script shipped in ``lua/`` (included files among them), sorted."""
    folder = resources.files(__package__).joinpath("lua")
    return sorted(
        entry.name.removesuffix(".lua") for entry in folder.iterdir() if entry.name.endswith(".lua")
    )


def holder_waits(holders: Mapping[str, float] | None, min_idle: float) -> list[object]:
    """The trailing arguments of ``recover.lua`` and ``recover_split.lua`` from which
    ``claim_idle.lua`` reads its ``waits``: ``consumer, idle (ms), ...`` for each holder of
    ``holders`` (consumer name to visibility timeout, seconds) whose timeout is longer than
    ``min_idle`` seconds (the others wait ``min_idle``, which needs no argument)."""
    return [
        x
        for consumer, vt in (holders or {}).items()
        if vt > min_idle
        for x in (consumer, int(vt * 1000))
    ]


class Scripts:
    """Runs the shipped scripts on one ``redis.asyncio`` client.

    Args:
        client: the broker's client (its pool, timeouts and retries apply to the calls).

    On a plain single-server client (:func:`~.pool.direct_pool`) the ``EVALSHA`` is sent on
    a connection of the pool directly (:func:`~.pool.run_direct`): the same connection,
    bytes, read timeout and connection-error retries as redis-py's ``execute_command``,
    without its per-call layers (a drain at concurrency 10 makes one call per 2-5 tasks;
    ``bench/README.md``, "session 8"). Any other client (Sentinel's, a cluster's, a
    stand-in), and one whose ``execute_command`` is wrapped (tracing instrumentation, a
    test's injected fault: :func:`~.pool.plain_execute`, asked at each call), runs it
    through its own ``execute_command``.

    Redis errors propagate unchanged: callers translate them (``client.translate_errors``).
    """

    __slots__ = ("_client", "_pool")

    def __init__(self, client: Any) -> None:
        self._client = client
        self._pool = direct_pool(client, "EVALSHA")

    async def call(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run script ``name`` with ``keys`` (``KEYS``) and ``args`` (``ARGV``); its reply.

        One ``EVALSHA`` round trip; two more (``SCRIPT LOAD``, ``EVALSHA``) only when the
        server does not know the script.

        Raises:
            redis.exceptions.RedisError: the server refused the call, or the script raised.
            FileNotFoundError: no script of that name ships with blitzq.
        """
        script = _loaded.get(name) or load(name)
        client, pool = self._client, self._pool
        if pool is not None and not plain_execute(client):  # wrapped since: let it see this
            pool = None
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        try:
            if pool is not None:
                return await run_direct(pool, command)
            return await client.execute_command(*command)
        except NoScriptError:
            await client.script_load(script.source)
            if pool is not None:
                return await run_direct(pool, command)
            return await client.execute_command(*command)
