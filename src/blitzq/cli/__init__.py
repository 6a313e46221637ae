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
"""

from __future__ import annotations

from collections.abc import Sequence

import click

from .. import __version__
from . import queue_control  # noqa: F401  (adds purge, pause and resume to queue_group)
from ._common import global_options
from .autoscale import control_group
from .check import check_command
from .config import ConfiguredGroup, config_group, wire_envvars
from .dashboard import dashboard_command
from .dead_letters import dead_letter_group
from .inspect import queue_group, task_group
from .schedule import schedule_group
from .scheduler import scheduler_group
from .server import server_group
from .worker import worker_command
from .workers import resolve


class _Cli(ConfiguredGroup):
    """The root group; ``worker list`` and ``worker shutdown`` go to
    :data:`~.workers.worker_admin_group` (``worker MODULE:ATTR`` runs a worker)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """See :func:`~.workers.resolve`, else click's resolution."""
        return resolve(args) or super().resolve_command(ctx, args)


__all__ = ["cli", "main"]


@click.group(
    cls=_Cli,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "-V", "--version", prog_name="blitzq")
@global_options
def cli() -> None:
    """blitzq: an async-first task queue on Redis / Valkey."""


cli.add_command(worker_command)
cli.add_command(task_group)
cli.add_command(dead_letter_group)
cli.add_command(queue_group)
cli.add_command(server_group)
cli.add_command(scheduler_group)
cli.add_command(dashboard_command)
cli.add_command(control_group)
cli.add_command(schedule_group)
cli.add_command(check_command)
cli.add_command(config_group)
wire_envvars(cli)  # BLITZQ_WORKER_LOG_LEVEL before BLITZQ_LOG_LEVEL, ...


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``blitzq`` script and ``python -m blitzq``.

    Args:
        argv: arguments without the program name (default: ``sys.argv[1:]``).

    Exits the process with the command's exit code.
    """
    cli.main(args=list(argv) if argv is not None else None, prog_name="blitzq")
