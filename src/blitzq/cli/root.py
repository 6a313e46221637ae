"""The root group of the ``blitzq`` command line (:data:`cli`): its global options and its
commands, each imported on first use (:class:`LazyCommands`). :mod:`blitzq.cli` documents the
command line; its :func:`~blitzq.cli.main` prints the top-level help without importing this
module (or click) when it can (:mod:`blitzq.cli._help`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping

import click

from .. import __version__
from ._common import global_options
from .config import ConfiguredGroup, wire_envvars

#: Each command of the root group: the module that defines it (imported when the command is
#: run, or its help shown), its attribute there, and what ``blitzq --help`` lists for it (the
#: command's ``short_help`` and the first paragraph of its help, as the command has them:
#: ``tests/unit/test_cli_lazy.py`` checks both). ``queue`` comes from ``queue_control``,
#: which adds purge, pause and resume to ``inspect.queue_group``.
COMMANDS: dict[str, tuple[str, str, str | None, str]] = {
    "check": (
        "check",
        "check_command",
        "Preflight: can MODULE:ATTR run against this server?",
        "Check, read-only, the server and namespace the blitzq.Queue at MODULE:ATTR uses:\n"
        "    connectivity, server version, eviction policy, persistence (AOF/RDB), queues no "
        "live\n    worker consumes, and whether a scheduler dispatches the periodic entries.",
    ),
    "config": (
        "config",
        "config_group",
        None,
        "Settings read from BLITZQ_* variables and [tool.blitzq] in pyproject.toml.",
    ),
    "control": (
        "autoscale",
        "control_group",
        "Change and read the autoscale setpoint of supervisors.",
        "Control running supervisors (`blitzq worker --autoscale MIN,MAX`) through Redis.",
    ),
    "dashboard": (
        "dashboard",
        "dashboard_command",
        "Serve the web dashboard of MODULE:ATTR.",
        "Serve the dashboard of the blitzq.Queue at MODULE:ATTR until SIGTERM/SIGINT.",
    ),
    "dead-letter": (
        "dead_letters",
        "dead_letter_group",
        None,
        "List, show, replay, purge and summarize dead-lettered tasks.",
    ),
    "queue": (
        "queue_control",
        "queue_group",
        None,
        "Look at queues, purge, pause and resume them.",
    ),
    "schedule": (
        "schedule",
        "schedule_group",
        None,
        "Add, list and remove periodic entries at run time (no restart of the schedulers).",
    ),
    "scheduler": (
        "scheduler",
        "scheduler_group",
        None,
        "Run periodic tasks (`blitzq scheduler [run] MODULE:ATTR`) or list them.",
    ),
    "server": (
        "server",
        "server_group",
        None,
        "Start, inspect and stop the embedded Valkey server.",
    ),
    "task": ("inspect", "task_group", None, "Look at individual tasks."),
    "worker": (
        "worker",
        "worker_command",
        "Run a worker for the Queue at MODULE:ATTR.",
        "Run a worker for the blitzq.Queue at MODULE:ATTR (for example myapp.tasks:queue).",
    ),
}

#: The subcommands of ``blitzq worker`` that are not a MODULE:ATTR (``cli/workers.py``'s
#: ``worker_admin_group``; ``tests/unit/test_cli_lazy.py`` checks the names).
WORKER_ADMIN = frozenset({"list", "shutdown"})


class LazyCommands(MutableMapping[str, click.Command]):
    """The root group's commands, each imported on first use (click's lazy-group pattern, in
    the ``commands`` mapping so that everything that walks the tree, ``wire_envvars``, the
    ``[tool.blitzq]`` defaults and the spec generator, sees every command).

    Looking a name up imports its module and wires the command's variables
    (:func:`~.config.wire_envvars`); listing the names, ``in`` and ``len`` import nothing, so
    ``import blitzq.cli`` and ``blitzq --help`` load no queue, broker or event loop.
    """

    def __init__(self, table: dict[str, tuple[str, str, str | None, str]]) -> None:
        self._table = table
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        command = self._loaded.get(name)
        if command is None:
            if name not in self._table:
                raise KeyError(name)
            module, attribute = self._table[name][:2]
            command = getattr(importlib.import_module(f"{__package__}.{module}"), attribute)
            wire_envvars(command, f"BLITZQ_{name.upper().replace('-', '_')}")
            self._loaded[name] = command
        return command

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self._loaded.pop(name, None)
        self._table = {k: v for k, v in self._table.items() if k != name}

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self._table, *self._loaded]))

    def __len__(self) -> int:
        return len(set(self._table) | set(self._loaded))

    def __contains__(self, name: object) -> bool:
        return name in self._table or name in self._loaded

    def listed(self, name: str) -> click.Command:
        """``name``'s command if loaded, else a stand-in with its listed help (no import)."""
        if name in self._loaded or name not in self._table:
            return self[name]
        short_help, help_text = self._table[name][2:]
        return click.Command(name, short_help=short_help, help=help_text)


class _Cli(ConfiguredGroup):
    """The root group; ``worker list`` and ``worker shutdown`` go to
    :data:`~.workers.worker_admin_group` (``worker MODULE:ATTR`` runs a worker)."""

    commands: LazyCommands

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """See :func:`~.workers.resolve`, else click's resolution."""
        if len(args) > 1 and args[0] == "worker" and args[1] in WORKER_ADMIN:
            from .workers import resolve

            found = resolve(args)
            if found:
                return found
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List the commands with their short help, importing none (see :data:`COMMANDS`)."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = [(name, self.commands.listed(name).get_short_help_str(limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


__all__ = ["COMMANDS", "WORKER_ADMIN", "LazyCommands", "cli"]


@click.group(
    cls=_Cli,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "-V", "--version", prog_name="blitzq")
@global_options
def cli() -> None:
    """blitzq: an async-first task queue on Redis / Valkey."""


wire_envvars(cli)  # the root's own options; each command's when it is loaded (LazyCommands)
cli.commands = LazyCommands(COMMANDS)
