"""``blitzq config show``, and how the command line reads the settings of :mod:`blitzq.config`.

:class:`ConfiguredGroup` is the ``blitzq`` group's class: every invocation gets click's
automatic environment variables (``BLITZQ_<COMMAND>_<OPTION>``) and, as defaults below them,
the ``[tool.blitzq]`` table (:func:`default_map`). An option typed on the command line wins,
then its environment variable, then the table, then the option's default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from .. import config
from ..exceptions import ConfigurationError
from ._common import CliUsageError, console, emit_json, global_options, settings

#: Prefix of click's automatic environment variables of every option.
ENV_PREFIX = "BLITZQ"


def default_map(root: click.Command) -> dict[str, Any]:
    """The click ``default_map`` of ``root`` and its subcommands from ``[tool.blitzq]``: the
    plain settings for the commands that have an option of that name, and each command's
    sub-table for its own options (``-`` and ``_`` alike).

    Raises:
        ConfigurationError: the file is invalid, a sub-table names no command, or a key of a
            command's table is none of its options.
    """
    table = config.project_table()
    where = config.project_file()

    def anchored(name: str, value: Any) -> Any:
        """A relative ``data_dir`` of the file is relative to the file's directory."""
        if name != "data_dir" or not isinstance(value, str) or where is None:
            return value
        return str((where.parent / Path(value).expanduser()).resolve())

    plain = {k: anchored(k, v) for k, v in table.items() if not isinstance(v, dict)}

    def build(command: click.Command, own: dict[str, Any], path: str) -> dict[str, Any]:
        names = {p.name for p in command.params if p.name}
        out = {k: v for k, v in plain.items() if k in names}
        commands = command.commands if isinstance(command, click.Group) else {}
        for key, item in own.items():
            if key in commands:
                if not isinstance(item, dict):
                    raise ConfigurationError(f"{where}: [{path}.{key}] must be a table")
                continue
            name = key.replace("-", "_")
            if isinstance(item, dict):
                known = ", ".join(sorted(commands)) or "none"
                raise ConfigurationError(
                    f"{where}: [{path}.{key}] names no command of "
                    f"`{path.removeprefix('tool.').replace('.', ' ')}` (commands: {known})"
                )
            if name not in names:
                options = ", ".join(sorted(n for n in names if n != "help")) or "none"
                raise ConfigurationError(
                    f"{where}: [{path}] has {key!r}, which is not an option of "
                    f"`{path.removeprefix('tool.').replace('.', ' ')}` (options: {options})"
                )
            out[name] = anchored(name, item)
        for name, sub in commands.items():
            nested = own.get(name, {})
            out[name] = build(sub, nested if isinstance(nested, dict) else {}, f"{path}.{name}")
        return out

    return build(root, config.command_tables(), "tool.blitzq")


class ConfiguredGroup(click.Group):
    """The ``blitzq`` group: automatic ``BLITZQ_*`` variables and ``[tool.blitzq]`` defaults
    for every command (module docstring)."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        """Make the root context with the settings' defaults (click's own method otherwise).

        Raises:
            click.UsageError: the project file is invalid (exit 2, the file named).
        """
        if parent is None:
            extra.setdefault("auto_envvar_prefix", ENV_PREFIX)
            try:
                extra.setdefault("default_map", default_map(self))
            except ConfigurationError as exc:
                raise click.UsageError(str(exc)) from None
        return super().make_context(info_name, args, parent, **extra)


@click.group("config")
def config_group() -> None:
    """Settings read from BLITZQ_* variables and [tool.blitzq] in pyproject.toml."""


@config_group.command("show")
@global_options
def config_show() -> None:
    """Print each setting with its value and where it comes from (an option on the command
    line, an environment variable, [tool.blitzq] of the project file, or the default), and the
    per-command tables of the project file. Passwords in URLs are masked."""
    from ._common import mask_url

    try:
        where = config.project_file()
        rows = []
        typed = settings()
        for s in config.SETTINGS:
            given = getattr(typed, s.name, None) if s.name in typed.from_command_line else None
            found = given or config.value(s.name) or s.default
            if s.name == "data_dir" and found and not given:
                found = str(config.data_dir())  # resolved as the embedded server uses it
            shown = mask_url(found) if found and s.name.endswith("_url") else found
            origin = "command line" if given else config.source(s.name)
            rows.append(
                {"name": s.name, "value": shown, "source": origin, "env": s.env}
                | ({} if found else {"unset": s.unset})
            )
        tables = config.command_tables()
    except ConfigurationError as exc:
        raise CliUsageError(str(exc)) from None
    if settings().json:
        emit_json({"file": str(where) if where else None, "settings": rows, "commands": tables})
        return
    out = console()
    out.print(Text(f"project file: {where or 'none (no [tool.blitzq] found)'}", style="bold"))
    table = Table(box=None, pad_edge=False)
    for header in ("setting", "value", "from", "variable"):
        table.add_column(header, overflow="fold")
    for row in rows:
        value = row["value"] if row["value"] is not None else f"- ({row['unset']})"
        table.add_row(row["name"], Text(str(value)), Text(str(row["source"])), row["env"])
    out.print(table)
    for name, options in sorted(tables.items()):
        out.print(Text(f"[tool.blitzq.{name}] {options}"))
