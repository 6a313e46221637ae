"""The ``blitzq`` command line: run workers, inspect tasks, dead letters and queues, and manage
the embedded server.

Every command takes the global options ``--redis-url``, ``--namespace``, ``--mode`` and
``--json`` (before or after the subcommand name; ``server ...`` takes ``--json`` alone);
environment variables ``BLITZQ_REDIS_URL``, ``BLITZQ_NAMESPACE`` and ``BLITZQ_MODE`` fill
them in, below the command's own ``BLITZQ_<COMMAND>_REDIS_URL`` ..., every other option has
its ``BLITZQ_<COMMAND>_<OPTION>`` variable, and ``[tool.blitzq]`` in pyproject.toml gives
defaults below them (:mod:`blitzq.config`, ``blitzq config show``). Errors print one red line
on stderr and exit non-zero: 1 for a failed operation (a connection error), 2 for a malformed
command line, 78 (``EX_CONFIG``) for a configuration error (an application that does not
load, a bad setting from a variable or the project file).

The click group is :data:`blitzq.cli.root.cli` (re-exported here, loaded on first use:
``import blitzq.cli`` imports no click). :func:`main` prints the top-level help of a bare
``blitzq --help`` (and the usage error of a bare ``blitzq``) from :mod:`blitzq.cli._help`,
the text click printed for the same command line when ``python -m blitzq.spec`` generated it
(``tests/unit/test_cli_fast_help.py`` keeps the two identical), whenever nothing could make
click print something else (no ``[tool.blitzq]`` table applies, the width and the click
version are the generated ones): see :func:`fast_help`.
"""

from __future__ import annotations

import os
import sys

#: ``typing.TYPE_CHECKING`` without importing typing; type checkers read it as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .root import COMMANDS, WORKER_ADMIN, LazyCommands, cli

#: The names :mod:`blitzq.cli.root` defines, imported from it on first use (PEP 562).
_ROOT_NAMES = frozenset({"COMMANDS", "WORKER_ADMIN", "LazyCommands", "cli"})

#: The variable naming a project file (:data:`blitzq.config.CONFIG_ENV`, checked by a test).
_CONFIG_ENV = "BLITZQ_CONFIG"


def __getattr__(name: str) -> object:
    """Import :mod:`blitzq.cli.root` when one of its names is first asked for."""
    if name in _ROOT_NAMES:
        from . import root

        value = getattr(root, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def help_width() -> int:
    """The width (columns) click formats ``blitzq``'s help to in this process:
    ``shutil.get_terminal_size().columns`` (``$COLUMNS``, else the terminal's width, else 80)
    capped at the root group's ``max_content_width`` of 100, minus 2, at least 50 (click's
    ``HelpFormatter``), computed without importing :mod:`shutil`."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 80
        columns = columns or 80
    return max(min(columns, 100) - 2, 50)


def _no_project_table() -> bool:
    """True when no project file can apply (:func:`blitzq.config.search`): ``$BLITZQ_CONFIG``
    unset, no ``pyproject.toml`` refused as another user's on the way up (click would print a
    warning), and the project's ``pyproject.toml``, if there is one, without a
    ``[tool.blitzq]`` table (a table loads every command and may be refused): the walk
    ``search`` makes (:func:`blitzq._project.walk`), and as ``search`` decides, a file
    :func:`blitzq._project.may_hold_table` clears is not parsed (no ``tomllib``); any other
    is, and one that is not valid TOML (a configuration error, exit 78) is click's."""
    if os.environ.get(_CONFIG_ENV):
        return False
    from .._project import may_hold_table, walk

    try:
        found, _, refused = walk(os.getcwd())
    except OSError:
        return False
    if refused:
        return False
    if found is None:
        return True
    try:
        with open(found, "rb") as f:
            data = f.read()
    except OSError:
        return False
    if not may_hold_table(data):
        return True
    import tomllib

    try:
        tool = tomllib.loads(data.decode()).get("tool", {})
    except ValueError:  # tomllib.TOMLDecodeError and UnicodeDecodeError are ValueErrors
        return False
    return isinstance(tool, dict) and "blitzq" not in tool


def _click_version(path: Sequence[str]) -> str | None:
    """``major.minor`` of the click that ``import click`` would load from ``path`` (its
    ``.dist-info`` directory beside the package), or ``None`` when that is not known."""
    for entry in path:
        entry = entry or "."
        if not os.path.isdir(os.path.join(entry, "click")):
            continue
        try:
            names = os.listdir(entry)
        except OSError:
            return None
        for name in names:
            if name.startswith("click-") and name.endswith(".dist-info"):
                parts = name[len("click-") : -len(".dist-info")].split(".")
                return ".".join(parts[:2])
        return None
    return None


def fast_help(args: Sequence[str]) -> tuple[int, str, str] | None:
    """What click would print for ``blitzq ARGS``, when :mod:`blitzq.cli._help` has it and
    nothing could change it: ``(exit code, stream name, text)``, else ``None``.

    It has it for ``--help``, ``-h`` and no argument, at the widths the help was generated
    at (:func:`help_width`: 78 and 98, a pipe or an 80-column terminal and a wide one), for
    the click version it was generated with (``major.minor``), when no project file can
    apply (:func:`_no_project_table`). ``--help`` after a subcommand, or any other argument,
    is click's.

    Args:
        args: the command line after the program name.
    """
    key = "--help" if list(args) in (["--help"], ["-h"]) else "" if not args else None
    if key is None:
        return None
    from . import _help

    found = _help.TEXTS.get((key, help_width()))
    if found is None or _click_version(sys.path) != _help.CLICK or not _no_project_table():
        return None
    return found


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``blitzq`` script and ``python -m blitzq``.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).

    Exits the process with the command's exit code.
    """
    found = fast_help(list(argv) if argv is not None else sys.argv[1:])
    if found is not None:
        code, stream, text = found
        out = sys.stdout if stream == "stdout" else sys.stderr
        if out is not None:
            try:
                out.write(text)
                out.flush()
            except BrokenPipeError:  # as click does: the reader went away
                sys.exit(1)
        sys.exit(code)
    from .root import cli

    cli.main(args=list(argv) if argv is not None else None, prog_name="blitzq")


__all__ = ["COMMANDS", "WORKER_ADMIN", "LazyCommands", "cli", "fast_help", "help_width", "main"]
