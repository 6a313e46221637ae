"""``blitzq scheduler [run] MODULE:ATTR`` and ``blitzq scheduler list MODULE:ATTR``.

``run`` imports the application's Queue and dispatches its periodic tasks until SIGTERM/SIGINT;
any number of schedulers may run, each occurrence is dispatched once. ``list`` shows each
periodic task with its schedule, next and last run. ``blitzq scheduler MODULE:ATTR`` (no
subcommand) means ``run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import click
from rich import box
from rich.table import Table

from ..exceptions import BlitzQError
from ..logconfig import configure_logging
from ..queue import Queue
from ..runtime_schedules import all_periodic_status
from ..scheduler import Scheduler
from ._common import (
    EXIT_CONFIG,
    Seconds,
    cli_errors,
    console,
    emit_json,
    global_options,
    log_options,
    mask_url,
    run_with_queue,
    settings,
    use_running_server,
)
from ._rich import Text
from .schedule import shown_zone, zoned_iso, zoned_time
from .worker import _export_settings, _override, load_queue

__all__ = ["scheduler_group"]


class _DefaultRunGroup(click.Group):
    """A group where ``blitzq scheduler MODULE:ATTR`` means ``blitzq scheduler run MODULE:ATTR``."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """Resolve a subcommand; an unknown first word containing ``:`` runs ``run``."""
        if args and ":" in args[0] and self.get_command(ctx, args[0]) is None:
            run = self.get_command(ctx, "run")
            if run is not None:
                return "run", run, args
        return super().resolve_command(ctx, args)


@click.group("scheduler", cls=_DefaultRunGroup)
@global_options
def scheduler_group() -> None:
    """Run periodic tasks (`blitzq scheduler [run] MODULE:ATTR`) or list them."""


def _load(app: str) -> Queue:
    s = settings()
    _export_settings(s)
    queue = load_queue(app)
    _override(queue, s)
    return queue


async def _serve(scheduler: Scheduler) -> None:
    queue = scheduler.queue
    try:
        await queue.broker.ping()
        doc = {
            "event": "scheduler_started",
            "periodic_tasks": sorted(queue.periodic_tasks),
            "namespace": queue.namespace,
            "broker": mask_url(queue.url),
            "pid": os.getpid(),
        }
        if settings().json:
            emit_json(doc)
        else:
            click.echo(
                click.style("blitzq scheduler", bold=True)
                + f" periodic={len(queue.periodic_tasks)} namespace={queue.namespace}"
                f" broker={mask_url(queue.url)}"
            )
        await scheduler.run()
    finally:
        with contextlib.suppress(BlitzQError):
            await queue.close()


@scheduler_group.command("run", short_help="Dispatch the periodic tasks of MODULE:ATTR.")
@click.argument("app", metavar="MODULE:ATTR")
@click.option(
    "--poll-interval",
    type=Seconds(minimum=0.01, maximum=3600.0),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Longest time between two passes (a pass also happens when a run is due).",
)
@log_options
@global_options
def run_command(app: str, poll_interval: float, log_level: str, log_format: str) -> None:
    """Dispatch the periodic tasks of the blitzq.Queue at MODULE:ATTR until SIGTERM/SIGINT.

    Run as many schedulers as you like: each occurrence is dispatched exactly once. A scheduler
    also moves due delayed tasks to their queues. Workers run the dispatched tasks.
    """
    s = settings()
    with cli_errors(s.redis_url, config_exit=EXIT_CONFIG):
        configure_logging(log_level, "json" if log_format == "json" else "text")
    queue = _load(app)
    with cli_errors(queue._redis_url or s.redis_url, config_exit=EXIT_CONFIG):
        scheduler = Scheduler(queue, poll_interval=poll_interval, handle_signals=True)
        asyncio.run(_serve(scheduler))


@scheduler_group.command("list", short_help="Show periodic tasks, next and last runs.")
@click.argument("app", metavar="MODULE:ATTR")
@global_options
def list_command(app: str) -> None:
    """Show each periodic task of MODULE:ATTR: schedule, missed-run policy, next and last run
    (in the entry's time zone: a cron's zone, UTC for an interval, as on the dashboard;
    --json: ``tz``), run-time entries included.

    Without a broker URL it uses the running embedded server (it never starts one).
    """
    queue = _load(app)
    use_running_server(queue)
    rows: list[dict[str, Any]] = run_with_queue(all_periodic_status, queue)
    if settings().json:
        emit_json(
            {
                "periodic_tasks": [
                    row
                    | {
                        "tz": shown_zone(row["zone"]),
                        "next_run": zoned_iso(row["next_run"], shown_zone(row["zone"])),
                        "last_run": zoned_iso(row["last_run"], shown_zone(row["zone"])),
                    }
                    for row in rows
                ]
            }
        )
        return
    out = console()
    if not rows:
        out.print(f"no periodic tasks registered on {app}")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("name", overflow="fold")
    table.add_column("task", overflow="fold")
    table.add_column("schedule", overflow="fold")
    table.add_column("missed", no_wrap=True)
    table.add_column("queue", overflow="fold")
    table.add_column("next run", no_wrap=True)
    table.add_column("last run", no_wrap=True)
    table.add_column("source", no_wrap=True)
    for row in rows:
        table.add_row(
            Text(row["name"]),
            Text(row["task"]),
            Text(row["schedule"]),
            row["missed"],
            Text(row["queue"]),
            zoned_time(row["next_run"], shown_zone(row["zone"])),
            zoned_time(row["last_run"], shown_zone(row["zone"])),
            "run-time" if row["source"] == "runtime" else row["source"],
        )
    out.print(table)
