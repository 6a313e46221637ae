"""The one loader of the Lua scripts in ``lua/``, and the one way they are run.

- :func:`load` reads a script once per process: its text, with each line
  ``--@include <file>.lua`` replaced by that file's text (shared functions such as the
  dead-letter retention of ``dead_letters.lua``), after the generated key prelude
  (:func:`prelude`), and its SHA1 digest. Every broker of the process shares that
  :class:`Script`.
- The scripts build every key name with ``KEY.<name>(prefix, <parts>...)``, functions that
  :func:`prelude` generates from ``keys.TABLE`` (the ones a script uses, nothing else): a key's
  suffix is written only in ``keys.py``, and ``KEY.record(prefix, id)`` is the name
  ``Keys(ns).record(id)`` makes in Python.
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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

from .keys import TABLE

INCLUDE = "--@include "
"""A line starting with this is replaced by the text of the file it names."""

_USES = re.compile(r"\bKEY\.(\w+)\(")
"""A call of a key builder in a script: ``KEY.<name>(``."""


@dataclass(frozen=True, slots=True)
class Script:
    """One Lua script as sent to the server.

    Attributes:
        name: file name without ``.lua``.
        source: the text with ``--@include`` lines expanded.
        sha: SHA1 hex digest of ``source`` encoded as UTF-8 (the ``EVALSHA`` argument).
    """

    name: str
    source: str
    sha: str


_loaded: dict[str, Script] = {}


def _read(file: str) -> str:
    """Text of ``lua/<file>`` with its ``--@include`` lines expanded (recursively)."""
    text = resources.files(__package__).joinpath("lua", file).read_text()
    if INCLUDE not in text:
        return text
    lines = [
        _read(line.removeprefix(INCLUDE).strip()) if line.startswith(INCLUDE) else line
        for line in text.splitlines()
    ]
    return "\n".join(lines) + "\n"


def prelude(names: Iterable[str]) -> str:
    """Lua defining ``KEY.<name>(prefix, <parts>...)`` for each key of ``names``.

    Each function returns ``prefix .. <pattern with its parts filled in>``, the pattern being
    that of ``keys.TABLE[name]`` (``KEY.workflow_join(prefix, workflow_id, join_id)`` is
    ``prefix .. 'wf:' .. workflow_id .. ':j:' .. join_id``). Empty when ``names`` is.

    Args:
        names: key names of ``keys.TABLE`` (repeats are fine).

    Raises:
        KeyError: a name that is not in ``keys.TABLE`` (a script calling an unknown builder).
        ValueError: a pattern with characters a plain quoted string cannot hold as is.
    """
    wanted = sorted(set(names))
    if not wanted:
        return ""
    lines = ["-- Key builders generated from broker/redis/keys.py (TABLE); prefix is '{ns}:'.",
             "local KEY = {}"]  # fmt: skip
    for name in wanted:
        key = TABLE[name]
        pieces = ["prefix"]
        for literal, part in zip(key.literals, [*key.parts, None], strict=True):
            if not re.fullmatch(r"[\w:.-]*", literal):
                raise ValueError(f"key {name!r}: {literal!r} is not a plain Lua string")
            if literal:
                pieces.append(repr(literal))
            if part is not None:
                pieces.append(part)
        args = ", ".join(["prefix", *key.parts])
        lines.append(f"function KEY.{name}({args}) return {' .. '.join(pieces)} end")
    return "\n".join(lines) + "\n"


def load(name: str) -> Script:
    """The script ``lua/<name>.lua``, read and hashed once per process.

    Args:
        name: file name without ``.lua``, e.g. ``"complete"``.

    Raises:
        FileNotFoundError: no such script ships with blitzq (a programming error).
        KeyError: the script calls a ``KEY`` builder not in ``keys.TABLE`` (a programming
            error).
    """
    script = _loaded.get(name)
    if script is None:
        text = _read(f"{name}.lua")
        source = prelude(_USES.findall(text)) + text
        script = Script(name, source, hashlib.sha1(source.encode()).hexdigest())
        _loaded[name] = script
    return script


def names() -> list[str]:
    """Names of every script shipped in ``lua/`` (included files among them), sorted."""
    folder = resources.files(__package__).joinpath("lua")
    return sorted(
        entry.name.removesuffix(".lua") for entry in folder.iterdir() if entry.name.endswith(".lua")
    )


class Scripts:
    """Runs the shipped scripts on one ``redis.asyncio`` client.

    Args:
        client: the broker's client (its pool, timeouts and retries apply to the calls).

    Redis errors propagate unchanged: callers translate them (``client.translate_errors``).
    """

    __slots__ = ("_client",)

    def __init__(self, client: Any) -> None:
        self._client = client

    async def call(self, name: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """Run script ``name`` with ``keys`` (``KEYS``) and ``args`` (``ARGV``); its reply.

        One ``EVALSHA`` round trip; two more (``SCRIPT LOAD``, ``EVALSHA``) only when the
        server does not know the script.

        Raises:
            redis.exceptions.RedisError: the server refused the call, or the script raised.
            FileNotFoundError: no script of that name ships with blitzq.
        """
        script = _loaded.get(name) or load(name)
        client = self._client
        try:
            return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        except NoScriptError:
            await client.script_load(script.source)
            return await client.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
