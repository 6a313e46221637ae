"""The one loader of the Lua scripts in ``lua/``, and the one way they are run.

- :func:`load` reads a script once per process: its text, with each line
  ``--@include <file>.lua`` replaced by that file's text (shared functions such as the
  dead-letter retention of ``dead_letters.lua``), and its SHA1 digest. Every broker of the
  process shares that :class:`Script`.
- :class:`Scripts` runs them on one client: ``EVALSHA``, and on ``NOSCRIPT`` (a server that
  restarted, failed over or flushed its script cache, or that never saw the script)
  ``SCRIPT LOAD`` then ``EVALSHA`` again. Plain EVALSHA works on every supported server
  (Redis 6 and 7, Valkey); Redis Functions are not used.

A script is named by its file name without ``.lua`` (``"complete"`` is ``lua/complete.lua``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError

INCLUDE = "--@include "
"""A line starting with this is replaced by the text of the file it names."""


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


def load(name: str) -> Script:
    """The script ``lua/<name>.lua``, read and hashed once per process.

    Args:
        name: file name without ``.lua``, e.g. ``"complete"``.

    Raises:
        FileNotFoundError: no such script ships with blitzq (a programming error).
    """
    script = _loaded.get(name)
    if script is None:
        source = _read(f"{name}.lua")
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
