"""``blitzq server start|status|stop``: the embedded Valkey server of a data directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.table import Table

from ._common import CliUsageError, cli_errors, console, emit_json, json_option, settings
from ._rich import Text

_DATA_DIR = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="BLITZQ_DATA_DIR",
    show_envvar=True,
    help="Data directory of the embedded server. Default: ./.blitzq for start; for status "
    "and stop, the nearest .blitzq in the current directory or its parents.",
)


def _no_broker_options() -> None:
    """Refuse ``--redis-url``, ``--amqp-url``, ``--namespace`` or ``--mode`` typed before
    ``server`` (``blitzq --redis-url X server status``): they do not apply to the embedded
    server's commands, and ignoring them would hide the mistake.

    Raises:
        CliUsageError: one was typed (exit 2), naming it.
    """
    typed = sorted(settings().from_command_line - {"json"})
    if typed:
        names = ", ".join("--" + name.replace("_", "-") for name in typed)
        raise CliUsageError(
            f"{names} {'does' if len(typed) == 1 else 'do'} not apply to `blitzq server`: "
            "it manages the embedded server of "
            "--data-dir (BLITZQ_DATA_DIR); leave it out"
        )


def _found(data_dir: Path | None) -> Path | None:
    """``--data-dir``, else the nearest ``.blitzq`` upwards, else None (``./.blitzq``)."""
    from ..broker.redis.embedded import find_data_dir

    return data_dir if data_dir is not None else find_data_dir()


@click.group("server")
@json_option
def server_group() -> None:
    """Start, inspect and stop the embedded Valkey server.

    A Queue created without a broker URL (a worker, a producer) starts this server on first
    use, in $BLITZQ_DATA_DIR or ./.blitzq; it keeps running (with its data persisted in the
    data directory) until `blitzq server stop`. Other commands (queue stats, task inspect,
    dead-letter ...) never start it: they use the one running for $BLITZQ_DATA_DIR, else for
    the nearest .blitzq directory in the current directory or its parents.
    """


@server_group.command("start")
@_DATA_DIR
@json_option
def server_start(data_dir: Path | None) -> None:
    """Start the embedded server (or find the running one) and print its URL."""
    from ..broker.redis.embedded import ensure_server, server_status

    _no_broker_options()
    out = console(stderr=settings().json)
    with cli_errors(), out.status("starting the embedded Valkey server…"):
        url = ensure_server(data_dir)
        status = server_status(data_dir)
    if settings().json:
        emit_json(status)
    else:
        click.echo(url)


@server_group.command("status")
@_DATA_DIR
@json_option
def server_status_cmd(data_dir: Path | None) -> None:
    """Show whether the embedded server runs, its URL, pid, version, memory and keys.

    Without --data-dir it looks at the nearest .blitzq directory in the current directory or
    its parents (./.blitzq when there is none); it creates and starts nothing.
    """
    from ..broker.redis.embedded import server_status

    _no_broker_options()
    with cli_errors():
        status = server_status(_found(data_dir))
    if settings().json:
        emit_json(status)
        return
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    running = bool(status.get("running"))
    table.add_row(
        "state", Text("running" if running else "not running", style="green" if running else "red")
    )
    for key in ("url", "data_dir", "pid", "version"):
        table.add_row(key.replace("_", " "), Text(_show(status.get(key))))
    memory = status.get("used_memory")
    table.add_row("memory", _bytes(memory) if isinstance(memory, int) else "-")
    table.add_row("keys", _show(status.get("db_keys")))
    console().print(table)


@server_group.command("stop")
@_DATA_DIR
@json_option
def server_stop(data_dir: Path | None) -> None:
    """Shut the embedded server down cleanly (its data stays in the data directory).

    Without --data-dir it stops the server of the nearest .blitzq directory in the current
    directory or its parents.
    """
    from ..broker.redis.embedded import stop_server

    _no_broker_options()
    with cli_errors():
        stopped = stop_server(_found(data_dir))
    if settings().json:
        emit_json({"stopped": stopped})
    else:
        console().print("stopped the embedded server" if stopped else "no embedded server running")


def _show(value: Any) -> str:
    return "-" if value is None else str(value)


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{n} B"
        size /= 1024
    return f"{n} B"  # pragma: no cover
