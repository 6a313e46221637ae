"""The ``blitzq`` command line as data, for the machine-readable spec (:mod:`blitzq.spec`):
every command with its arguments and options (environment variable, type, default, range,
choices, help) and the exit codes.

It walks the click command tree of :mod:`blitzq.cli` without making a context, so neither
the environment nor ``[tool.blitzq]`` of a project file leaks into the output.
"""

from __future__ import annotations

from typing import Any

import click

from .collect import one_line, plain, summary

#: Prefix of click's automatic environment variables (see :mod:`blitzq.cli.config`).
ENV_PREFIX = "BLITZQ"


def exit_codes() -> list[dict[str, Any]]:
    """The exit codes of ``blitzq`` commands, from the constants that set them."""
    from ..cli._common import EXIT_CONFIG, EXIT_FAILURE, EXIT_USAGE
    from ..preflight import EXIT_BLOCKING
    from ..worker.cpu import EXIT_FORKSERVER
    from ..worker.worker import EXIT_RESTART

    assert EXIT_CONFIG == EXIT_BLOCKING  # both are EX_CONFIG

    return [
        {
            "code": 0,
            "commands": "all",
            "meaning": "success (a worker: stopped gracefully, or "
            "a burst worker drained its queues)",
        },
        {
            "code": EXIT_FAILURE,
            "commands": "all",
            "meaning": "a failed operation: no such "
            "record, the broker unreachable (a connection error) or answering an error, "
            "another blitzq error; a supervisor whose every slot gave up after crashes",
        },
        {
            "code": EXIT_USAGE,
            "commands": "all",
            "meaning": "a usage error: a malformed command line, a bad option or argument "
            "typed on it (the option named), options that contradict each other; a "
            "supervisor whose every worker exited 2",
        },
        {
            "code": EXIT_FORKSERVER,
            "commands": "worker",
            "meaning": "the CPU pool's forkserver could not start a child (fork refused by the "
            "OS): EX_OSERR; the supervisor starts a fresh worker",
        },
        {
            "code": EXIT_RESTART,
            "commands": "worker",
            "meaning": "the worker stopped to be "
            "restarted (too many abandoned threads, --max-tasks-per-child, "
            "--max-memory-per-child): EX_TEMPFAIL",
        },
        {
            "code": EXIT_CONFIG,
            "commands": "all",
            "meaning": "a configuration error, EX_CONFIG, not restarted by the supervisor "
            "(systemd: RestartPreventExitStatus=78): an application or --configure that does "
            "not load, a ConfigurationError of the settings (a bad broker URL, namespace or "
            "mode from an environment variable or the project file, an invalid project file, "
            "a port held at the first start, a refused maxmemory-policy); a supervisor whose "
            "every worker exited 78; check: a blocking finding",
        },
    ]


def _type(param: click.Parameter) -> dict[str, Any]:
    """The type of ``param``: its name, and its range or choices where it has them."""
    kind = param.type
    out: dict[str, Any] = {"type": "boolean" if _is_flag(param) else kind.name}
    if isinstance(kind, click.IntRange | click.FloatRange):
        out["range"] = {
            "min": kind.min,
            "max": kind.max,
            "min_open": kind.min_open,
            "max_open": kind.max_open,
        }
    elif hasattr(kind, "minimum") and hasattr(kind, "maximum"):  # Seconds: finite, in range
        out["range"] = {"min": kind.minimum, "max": kind.maximum, "finite": True}
    if isinstance(kind, click.Choice):
        out["choices"] = [str(c) for c in kind.choices]
        out["case_sensitive"] = kind.case_sensitive
    if isinstance(kind, click.Path):
        out["path"] = {
            "exists": kind.exists,
            "file_okay": kind.file_okay,
            "dir_okay": kind.dir_okay,
        }
    return out


def _is_flag(param: click.Parameter) -> bool:
    return isinstance(param, click.Option) and param.is_flag


def _env(param: click.Parameter, prefix: str) -> list[str]:
    """The environment variables that fill ``param``: its own, else click's automatic
    ``<prefix>_<NAME>`` (options only; arguments have none)."""
    if param.envvar:
        return [param.envvar] if isinstance(param.envvar, str) else list(param.envvar)
    if isinstance(param, click.Option) and param.name and param.allow_from_autoenv:
        return [f"{prefix}_{param.name.upper()}"]
    return []


def _default(value: Any) -> Any:
    """A parameter's default as JSON data: ``None`` for none (click 8.2 marks that with a
    sentinel) and for a callable (computed when the command runs)."""
    if callable(value) or type(value).__name__ == "Sentinel":
        return None
    return plain(value)


def _param(param: click.Parameter, prefix: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "kind": "option" if isinstance(param, click.Option) else "argument",
        "name": max(param.opts, key=len) if isinstance(param, click.Option) else param.name,
        "opts": list(param.opts),
        "param": param.name,
        "env": _env(param, prefix),
        **_type(param),
        "required": param.required,
        "multiple": param.multiple,
        "default": _default(param.default),
        "metavar": param.metavar,
    }
    if isinstance(param, click.Option):
        doc["secondary_opts"] = list(param.secondary_opts)
        doc["help"] = one_line(param.help)
    return doc


def commands() -> list[dict[str, Any]]:
    """Every command of ``blitzq`` (the group itself first, as ``blitzq``), sorted by path,
    with its summary, arguments and options (hidden ones left out)."""
    from ..cli import cli

    found: list[dict[str, Any]] = []

    def walk(command: click.Command, path: list[str], prefix: str) -> None:
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        found.append(
            {
                "command": " ".join(["blitzq", *path]),
                "group": isinstance(command, click.Group),
                "summary": summary(command.help),
                "params": [_param(p, prefix) for p in params],
            }
        )
        if isinstance(command, click.Group):
            for name, sub in sorted(command.commands.items()):
                walk(sub, [*path, name], f"{prefix}_{name.upper().replace('-', '_')}")

    walk(cli, [], ENV_PREFIX)
    from ..cli.workers import worker_admin_group  # `worker list|shutdown` (cli/workers.py)

    for name, sub in sorted(worker_admin_group.commands.items()):
        walk(sub, ["worker", name], f"{ENV_PREFIX}_WORKER_{name.upper()}")
    return sorted(found, key=lambda c: c["command"])


__all__ = ["ENV_PREFIX", "commands", "exit_codes"]
