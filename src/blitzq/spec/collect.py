"""What the machine-readable spec says, read from the code itself (see :mod:`blitzq.spec`).

Each function returns plain JSON data (``dict``/``list`` of ``str``, numbers, ``bool`` and
``None``) built from the objects that define the behaviour: the exception classes of
:mod:`blitzq.exceptions` and what :func:`~blitzq.cli._common.cli_errors` turns them into,
:data:`blitzq.config.SETTINGS`, the click commands of :mod:`blitzq.cli`, the signatures and
docstrings of ``Queue``, ``Worker`` and ``RetryPolicy``, and msgspec's JSON schema of the
message and record types. Nothing here reads the environment, the clock or a project file,
so the output is the same on every machine.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

#: Units a parameter's docstring may state, first match wins (``megabytes`` before ``bytes``).
_UNITS = (
    ("megabytes", re.compile(r"\bmegabytes?\b|\bMiB\b")),
    ("bytes", re.compile(r"\bbytes?\b")),
    ("seconds", re.compile(r"\bseconds?\b")),
    ("milliseconds", re.compile(r"\bmilliseconds?\b")),
)
_ENTRY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:, [A-Za-z_][A-Za-z0-9_]*)*): ?(.*)$")


def one_line(text: str | None) -> str:
    """``text`` with its whitespace runs made single spaces (``""`` for ``None``)."""
    return " ".join((text or "").split())


def summary(doc: str | None) -> str:
    """The first paragraph of a docstring, on one line."""
    return one_line(inspect.cleandoc(doc or "").split("\n\n")[0])


def doc_entries(doc: str | None, section: str = "Args") -> dict[str, str]:
    """The entries of a Google-style docstring section (``Args:``, ``Attributes:``): name ->
    description on one line; ``a, b: text`` gives both names the text."""
    lines = inspect.cleandoc(doc or "").splitlines()
    try:
        start = lines.index(f"{section}:") + 1
    except ValueError:
        return {}
    out: dict[str, str] = {}
    names: list[str] = []
    for line in lines[start:]:
        if line.strip() and not line.startswith("    "):
            break  # the section ended
        found = _ENTRY.match(line[4:]) if line.startswith("    ") and line[4:5] != " " else None
        if found:
            names = found.group(1).split(", ")
            for name in names:
                out[name] = found.group(2)
        elif line.strip():
            for name in names:
                out[name] += " " + line.strip()
    return {name: one_line(text) for name, text in out.items()}


def units(text: str) -> str | None:
    """The unit a parameter's description states (``"seconds"``, ``"bytes"``, ...), or None."""
    for unit, pattern in _UNITS:
        if pattern.search(text):
            return unit
    return None


def plain(value: Any) -> Any:
    """``value`` as JSON data; anything else is its ``repr`` (refused when it holds a memory
    address, so no output depends on where an object lives)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, list | tuple | set | frozenset):
        items = [plain(v) for v in value]
        return sorted(items, key=repr) if isinstance(value, set | frozenset) else items
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    shown = repr(value)
    if re.search(r" at 0x[0-9a-fA-F]+", shown):
        return f"<{type(value).__qualname__}>"
    return shown


# ------------------------------------------------------------------------------ errors
def errors() -> list[dict[str, Any]]:
    """Every exception class of :mod:`blitzq.exceptions`: name, base(s), summary and the exit
    code the CLI gives it (``None``: the CLI does not catch it; it is raised in tasks)."""
    from .. import exceptions

    classes = [
        obj
        for obj in vars(exceptions).values()
        if isinstance(obj, type)
        and issubclass(obj, BaseException)
        and obj.__module__ == exceptions.__name__
    ]
    return [
        {
            "name": cls.__name__,
            "module": cls.__module__,
            "public": cls.__name__ in _public(),
            "base": cls.__bases__[0].__name__,
            "bases": [b.__name__ for b in cls.__bases__],
            "summary": summary(cls.__doc__),
            "cli_exit_code": cli_exit_code(cls),
        }
        for cls in sorted(classes, key=lambda c: c.__name__)
    ]


def _public() -> frozenset[str]:
    import blitzq

    return frozenset(blitzq.__all__)


def cli_exit_code(cls: type[BaseException]) -> int | None:
    """The exit code of a ``blitzq`` command that meets ``cls`` (what
    :func:`~blitzq.cli._common.cli_errors` makes of it), or ``None`` when it passes through."""
    from ..cli._common import cli_errors

    error = cls.__new__(cls)  # no __init__: only the type decides the code
    try:
        with cli_errors("redis://spec"):
            raise error
    except click.ClickException as exc:
        return exc.exit_code
    except BaseException:
        return None


# ------------------------------------------------------------------------ configuration
def settings() -> list[dict[str, Any]]:
    """:data:`blitzq.config.SETTINGS`: name, env var, default, what unset means, help."""
    from ..config import SETTINGS

    return [
        {
            "name": s.name,
            "env": s.env,
            "default": s.default,
            "unset": s.unset or None,
            "help": s.help,
        }
        for s in sorted(SETTINGS, key=lambda s: s.name)
    ]


def parameters(fn: Callable[..., Any], doc: str | None) -> list[dict[str, Any]]:
    """The parameters of ``fn`` (``self`` and the first positional of a method left out):
    name, annotation as written, default (``required`` when none), description from the
    ``Args:`` of ``doc``, and the unit the description states."""
    described = doc_entries(doc)
    out = []
    for param in inspect.signature(fn).parameters.values():
        if param.name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        text = described.get(param.name, "")
        annotation = param.annotation
        out.append(
            {
                "name": param.name,
                "annotation": annotation if isinstance(annotation, str) else plain(annotation),
                "required": param.default is param.empty,
                "default": None if param.default is param.empty else plain(param.default),
                "units": units(text),
                "doc": text,
            }
        )
    return out


def constructors() -> dict[str, list[dict[str, Any]]]:
    """``Queue(...)``, ``Worker(...)`` and ``RetryPolicy(...)`` parameters."""
    from ..queue import Queue
    from ..retries import RetryPolicy
    from ..worker import Worker

    return {
        "Queue": parameters(Queue.__init__, Queue.__doc__),
        "RetryPolicy": parameters(RetryPolicy, RetryPolicy.__doc__),
        "Worker": parameters(Worker.__init__, Worker.__doc__),
    }
