"""``blitzq config show``, and how the command line reads the settings of :mod:`blitzq.config`.

:class:`ConfiguredGroup` is the ``blitzq`` group's class: every invocation gets click's
automatic environment variables (``BLITZQ_<COMMAND>_<OPTION>``) and, as defaults below them,
the ``[tool.blitzq]`` table (:func:`default_map`). An option typed on the command line wins,
then its environment variable, then the table, then the option's default.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

import click
from click.core import ParameterSource

from .. import config
from ..exceptions import ConfigurationError
from ..redaction import mask_url
from ._common import (
    EXIT_CONFIG,
    CliConfigError,
    CliUsageError,
    Seconds,
    Settings,
    console,
    emit_json,
    global_options,
    redact_cli,
    settings,
)

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
    if not table:  # nothing to apply: no command is loaded for it (blitzq/cli/root.py)
        return {}
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
            param = next(p for p in command.params if p.name == name)
            out[name] = _checked(param, anchored(name, item), f"{where} [{path}] {key}")
        for name, sub in commands.items():
            nested = own.get(name, {})
            out[name] = build(sub, nested if isinstance(nested, dict) else {}, f"{path}.{name}")
        return out

    return build(root, config.command_tables(), "tool.blitzq")


class FileValueError(click.BadParameter):
    """A value of a command's table whose TOML type the option does not take (a list for a
    single value, a bool or a fraction for an integer, ...): a usage error (exit 2) naming
    the file, the table and the key (:attr:`origin`)."""

    def __init__(self, message: str, param: click.Parameter, origin: str) -> None:
        super().__init__(message, ctx=click.get_current_context(silent=True), param=param)
        self.origin = origin


def file_value(param: click.Parameter, value: Any) -> Any:
    """``value`` of a command's table, in the form the option's conversion takes, after the
    checks a TOML value needs besides the ones the command line gets (click then converts it
    exactly as a typed value: ranges, choices, ``nan``).

    A string goes to the option's conversion as typed text (``concurrency = "7"``). Else:
    a flag takes ``true``/``false``; an integer option an integer (never a bool, never a
    fraction: ``-c 2.7`` is refused too); an option of seconds an integer or a float (never a
    bool); a repeatable option (``configure``, ``watch-dir``) a string or a list of strings;
    an option taking a comma-separated value (``queues``, ``autoscale``: ``Q1,Q2``,
    ``MIN,MAX``) also a list, joined with commas (``["a", "b"]`` is ``"a,b"``), whose items
    are strings or integers without commas. Any other value is refused.

    Raises:
        ValueError: the value is refused (the message says what the option takes).
    """
    if param.multiple:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise ValueError(f"{value!r} is not a string or a list of strings")
        return items
    if isinstance(param, click.Option) and param.is_flag and not param.count:
        if not isinstance(value, bool):
            raise ValueError(f"{value!r} is not true or false")
        return value
    if isinstance(value, str):
        return value
    if isinstance(value, list) and "," in (getattr(param, "metavar", None) or ""):
        good = all(
            isinstance(i, (str, int)) and not isinstance(i, bool) and "," not in str(i)
            for i in value
        )
        if not value or not good:
            raise ValueError(
                f"{value!r} is not a non-empty list of names or numbers without commas"
            )
        return ",".join(str(i) for i in value)
    kind = param.type
    number = isinstance(kind, (click.types.IntParamType, click.types.FloatParamType, Seconds))
    if number and isinstance(value, bool):
        raise ValueError(f"{value!r} is a bool, not a number (a number is never a bool)")
    if isinstance(kind, click.types.IntParamType):
        if isinstance(value, int):
            return value
        raise ValueError(f"{value!r} is not an integer")
    if number and isinstance(value, (int, float)):
        return value
    raise ValueError(f"{value!r} ({type(value).__name__}) is not a string")


def _checked(param: click.Parameter, value: Any, origin: str) -> Any:
    """``value`` for the default map: :func:`file_value`'s, or, when it refuses the value, a
    callable the option calls as it reads its default (only the command that runs fails,
    as for a value its conversion refuses), raising :class:`FileValueError`."""
    try:
        return file_value(param, value)
    except ValueError as exc:
        message = str(exc)

    def refuse() -> Any:
        raise FileValueError(message, param, origin)

    return refuse


def wire_envvars(command: click.Command, prefix: str = ENV_PREFIX) -> None:
    """Give each option of ``command``'s subcommands (recursively) that has a variable of
    its own (``--redis-url``: ``BLITZQ_REDIS_URL``, ``--log-level``: ``BLITZQ_LOG_LEVEL``)
    its command's automatic variable first: ``BLITZQ_WORKER_REDIS_URL`` wins over
    ``BLITZQ_REDIS_URL`` for ``blitzq worker``, as the command's table wins over the plain
    key (click reads the first variable set; ``--help`` lists both)."""
    for param in command.params:
        if not isinstance(param, click.Option) or not param.name or not param.envvar:
            continue
        own = f"{prefix}_{param.name.upper()}"
        names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar)
        if own not in names:
            param.envvar = [own, *names]
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            wire_envvars(sub, f"{prefix}_{name.upper().replace('-', '_')}")


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
            click.UsageError: the project file is invalid (a configuration error, exit 78,
                the file named), or an argument is not valid UTF-8 (exit 2, it named).
        """
        if parent is None:
            extra.setdefault("auto_envvar_prefix", ENV_PREFIX)
            self._json_asked = (
                "--json" in args[: args.index("--")] if "--" in args else ("--json" in args)
            )
            _refuse_undecodable(args, as_json=self._json_asked)
            words = [a for a in args if not a.startswith("-")]
            if any(words[i : i + 2] == ["config", "show"] for i in range(len(words))):
                extra.setdefault("obj", Settings(lenient=True))  # show, never refuse
            try:
                extra.setdefault("default_map", default_map(self))
            except ConfigurationError as exc:
                raise JsonConfigError(str(exc), as_json=self._json_asked) from None
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.UsageError as exc:
            raise self._reframe(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; a usage error of a subcommand is reframed as in make_context. A
        :class:`~blitzq.exceptions.ConfigurationError` no command turned into its own
        message (a value checked after parsing) is one clean line and exit 78, never a
        traceback."""
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise self._reframe(exc) from None
        except ConfigurationError as exc:
            raise CliConfigError(str(exc)) from None

    def _reframe(self, exc: click.UsageError) -> click.UsageError:
        """``exc`` naming where a bad value came from, and printed as a JSON document too
        under ``--json``. A bad value typed on the command line is a usage error (exit 2);
        one from an environment variable or the project file is a configuration error
        (exit 78, ``EX_CONFIG``)."""
        if isinstance(exc, JsonUsageError):
            return exc
        ctx = exc.ctx
        found = ctx.find_object(Settings) if ctx is not None else None
        as_json = bool(getattr(self, "_json_asked", False) or (found and found.json))
        if isinstance(exc, FileValueError) and exc.param is not None:
            named = exc.param.get_error_hint(ctx).split(" (env var")[0] if ctx else exc.param.name
            return JsonConfigError(
                f"Invalid value for {named} (from {exc.origin}): {exc.message}",
                ctx=ctx,
                as_json=as_json,
            )
        if type(exc) is click.BadParameter and exc.param is not None and ctx is not None:
            origin = value_origin(ctx, exc.param)
            hint = exc.param_hint or exc.param.get_error_hint(ctx).split(" (env var")[0]
            if not isinstance(hint, str):
                hint = " / ".join(repr(h) for h in hint)
            message = f"Invalid value for {hint}{f' (from {origin})' if origin else ''}: "
            message += exc.message
            configured = origin is not None and origin != "the command line"
            kind = JsonConfigError if configured else JsonUsageError
            return kind(message, ctx=ctx, as_json=as_json)
        return JsonUsageError(exc.format_message(), ctx=ctx, as_json=as_json)


def _refuse_undecodable(args: list[str], *, as_json: bool) -> None:
    """Refuse a command line holding an argument that is not valid UTF-8.

    Python decodes such bytes of ``argv`` to lone surrogates (``surrogateescape``), which no
    task id, queue or name in the broker can hold; every command refuses them here, before
    running, as a usage error (exit 2) naming the argument with the bad bytes escaped.

    Raises:
        JsonUsageError: the first such argument (a JSON document too under ``--json``).
    """
    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            try:  # the bytes typed, escaped (b"a\xff" reads 'a\xff')
                shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            except UnicodeEncodeError:  # a surrogate that stands for no byte (not from argv)
                shown = arg.encode("utf-8", "backslashreplace").decode()
            raise JsonUsageError(
                f"the argument '{shown}' is not valid UTF-8 text (blitzq takes UTF-8 "
                "arguments only)",
                as_json=as_json,
            ) from None


class JsonUsageError(click.UsageError):
    """A usage error (exit 2) printed as click prints one, and under ``--json`` also as
    ``{"error": message, "exit_code": 2}`` on stdout (as :class:`CliError` does).

    Args:
        message: what is wrong.
        ctx: the command's context (its usage line is printed).
        as_json: also print the JSON document.
    """

    def __init__(
        self, message: str, ctx: click.Context | None = None, *, as_json: bool = False
    ) -> None:
        super().__init__(redact_cli(message), ctx)
        self.as_json = as_json

    def show(self, file: IO[Any] | None = None) -> None:
        """Print the JSON document (under ``--json``), then click's usage and error lines."""
        if self.as_json:
            emit_json({"error": self.format_message(), "exit_code": self.exit_code})
        super().show(file)


class JsonConfigError(JsonUsageError):
    """A bad setting from an environment variable or the project file: printed as
    :class:`JsonUsageError`, but a configuration error, exit 78 (``EX_CONFIG``)."""

    exit_code = EXIT_CONFIG


def value_origin(ctx: click.Context, param: click.Parameter) -> str | None:
    """Where ``param``'s value came from in ``ctx``: ``the command line``, ``env var X``, the
    project file's table and key, or ``None`` (a default)."""
    source = ctx.get_parameter_source(param.name) if param.name else None
    if source is ParameterSource.COMMANDLINE:
        return "the command line"
    if source is ParameterSource.ENVIRONMENT:
        names: list[str] = []
        if isinstance(param, click.Option) and param.envvar:
            names = [param.envvar] if isinstance(param.envvar, str) else list(param.envvar)
        elif ctx.auto_envvar_prefix and param.name:
            names = [f"{ctx.auto_envvar_prefix}_{param.name.upper()}"]
        named = [n for n in names if os.environ.get(n)] or names
        return f"env var {named[0]}" if named else "an environment variable"
    if source is ParameterSource.DEFAULT_MAP:
        path = ctx.command_path.split(" ")[1:]
        table = ".".join(["tool.blitzq", *path])
        key = param.name or ""
        try:
            where = config.project_file()
        except ConfigurationError:
            where = None
        # a plain setting lives in [tool.blitzq] itself, unless the command's table sets it
        own: Any = config.command_tables() if where else {}
        for part in path:
            own = own.get(part, {}) if isinstance(own, dict) else {}
        if isinstance(own, dict) and not ({key, key.replace("_", "-")} & own.keys()):
            table = "tool.blitzq"
        elif isinstance(own, dict) and key not in own:
            key = key.replace("_", "-")  # the key as the file spells it
        return f"{where} [{table}] {key}"
    return None


@click.group("config")
def config_group() -> None:
    """Settings read from BLITZQ_* variables and [tool.blitzq] in pyproject.toml."""


@config_group.command("show")
@global_options
def config_show() -> None:
    """Print each setting with its value and where it comes from (an option on the command
    line, an environment variable, [tool.blitzq] of the project file, or the default), and the
    per-command tables of the project file. Passwords in URLs are masked.

    The project file used is named first (BLITZQ_CONFIG, else the project's pyproject.toml,
    never one above the project root), then any pyproject.toml refused as another user's."""
    try:
        found_file = config.search()
        where = found_file.file
        rows = []
        typed = settings()
        for s in config.SETTINGS:
            given = getattr(typed, s.name, None) if s.name in typed.from_command_line else None
            found = given or config.value(s.name) or s.default
            if s.name == "data_dir" and found and not given:
                found = str(config.data_dir())  # resolved as the embedded server uses it
            shown = mask_url(found) if found and s.name.endswith("_url") else found
            origin = "command line" if given else config.source(s.name)
            error = _setting_error(s.name, found) if found else None
            rows.append(
                {"name": s.name, "value": shown, "source": origin, "env": s.env}
                | ({} if found else {"unset": s.unset})
                | ({"error": error} if error else {})
            )
        for row in rows:  # a global option refused under config show (typed or a variable)
            if row["name"] in typed.invalid and "error" not in row:
                row["error"] = typed.invalid[row["name"]]
        tables = _masked(config.command_tables())
        errors = _table_errors(click.get_current_context().find_root().command, tables)
    except ConfigurationError as exc:
        raise CliUsageError(str(exc)) from None
    refused = [{"file": str(path), "reason": why} for path, why in found_file.refused]
    root = str(found_file.root) if found_file.root else None
    if settings().json:
        emit_json(
            {"file": str(where) if where else None, "root": root, "refused": refused}
            | {"settings": rows, "commands": tables}
            | ({"errors": errors} if errors else {})
        )
        return
    from rich.table import Table  # here: the other commands and --help load no rich

    from ._rich import Text

    out = console()
    out.print(Text(f"project file: {where or 'none (no [tool.blitzq] found)'}", style="bold"))
    if root and not where:
        out.print(Text(f"project root: {root} (nothing above it is read)"))
    for item in refused:
        out.print(Text(f"refused: {item['file']}: {item['reason']}", style="yellow"))
    table = Table(box=None, pad_edge=False)
    for header in ("setting", "value", "from", "variable"):
        table.add_column(header, overflow="fold")
    for row in rows:
        value = row["value"] if row["value"] is not None else f"- ({row['unset']})"
        shown = Text(str(value))
        if "error" in row:
            shown.append(f"  INVALID: {row['error']}", style="red")
        table.add_row(row["name"], shown, Text(str(row["source"])), row["env"])
    out.print(table)
    for name, options in sorted(_flat(tables).items()):
        out.print(Text(f"[tool.blitzq.{name}] {options}"))
        for key in options:
            if f"{name}.{key}" in errors:
                out.print(Text(f"  {key}: INVALID: {errors[f'{name}.{key}']}", style="red"))


def _setting_error(name: str, value: str) -> str | None:
    """What is wrong with ``value`` of setting ``name`` (``None``: nothing we can tell)."""
    from ..logconfig import LEVELS
    from ..routing import check_name

    if name == "mode" and value not in ("reliable", "fast"):
        return f"{value!r} is not one of 'reliable', 'fast'"
    if name == "namespace":
        try:
            check_name("namespace", value)
        except ConfigurationError as exc:
            return str(exc)
    if name == "log_format" and value not in ("text", "json"):
        return f"{value!r} is not one of 'text', 'json'"
    if name == "log_level" and value.lower() not in {n.lower() for n in LEVELS}:
        return f"{value!r} is not a log level ({', '.join(n.lower() for n in LEVELS)})"
    return None


def _masked(table: dict[str, Any]) -> dict[str, Any]:
    """``table`` (nested) with the passwords of its URL values masked (``--redis-url`` may
    be set in a command's table)."""
    return {
        key: _masked(item)
        if isinstance(item, dict)
        else (mask_url(item) if isinstance(item, str) and "://" in item else item)
        for key, item in table.items()
    }


def _flat(tables: dict[str, Any], prefix: str = "") -> dict[str, dict[str, Any]]:
    """``{"scheduler": {"run": {...}}}`` as ``{"scheduler.run": {...}}`` (only the tables
    that hold options)."""
    out: dict[str, dict[str, Any]] = {}
    for name, table in tables.items():
        plain = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if plain:
            out[f"{prefix}{name}"] = plain
        nested = {k: v for k, v in table.items() if isinstance(v, dict)}
        out |= _flat(nested, f"{prefix}{name}.")
    return out


def _table_errors(root: click.Command, tables: dict[str, Any]) -> dict[str, str]:
    """``{"worker.shutdown_timeout": error}`` for each value of a command's table that its
    option refuses (converted as the command would)."""
    errors: dict[str, str] = {}
    for name, options in _flat(tables).items():
        command: click.Command | None = root
        for part in name.split("."):
            command = command.commands.get(part) if isinstance(command, click.Group) else None
        if command is None:
            continue
        params = {p.name: p for p in command.params if p.name}
        ctx = click.Context(command)
        for key, item in options.items():
            param = params.get(key.replace("-", "_"))
            if param is None:
                continue
            try:
                param.type_cast_value(ctx, file_value(param, item))
            except click.BadParameter as exc:
                errors[f"{name}.{key}"] = exc.message
            except ValueError as exc:
                errors[f"{name}.{key}"] = str(exc)
    return errors
