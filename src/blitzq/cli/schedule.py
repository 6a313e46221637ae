"""``blitzq schedule list|add|remove``: periodic entries defined at run time.

The entries live in the broker (:mod:`blitzq.runtime_schedules`); every running ``blitzq
scheduler`` picks them up within one poll interval, alongside its code-defined entries. Like
the inspection commands, these need no application module. Times are printed in the entry's
zone (a cron's ``--tz``; UTC for an ``--every`` entry, as the dashboard shows them), with the
zone named.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import click
from rich import box
from rich.table import Table

from ..exceptions import ConfigurationError
from ..json_input import parse_json
from ..queue import Queue
from ..runtime_schedules import RuntimeSchedule, add_schedule, remove_schedule, runtime_schedules
from ..schedules import Cron
from ._common import (
    CliError,
    CliUsageError,
    Seconds,
    console,
    emit_json,
    global_options,
    run_with_queue,
    settings,
)
from ._rich import Text

__all__ = ["schedule_group", "shown_zone", "zoned_iso", "zoned_time"]


def shown_zone(zone: str | None) -> str:
    """The IANA zone an entry's times are shown in: a cron's own ``zone``, else (an interval
    entry: ``None``) ``"UTC"``, as on the dashboard's periodic page."""
    return zone or "UTC"


def _zone(zone: str | None) -> Any:
    return ZoneInfo(zone) if zone else None


def zoned_time(ts: float | None, zone: str | None) -> str:
    """Unix time ``ts`` as ``YYYY-MM-DD HH:MM:SS ZONE`` in the IANA ``zone`` (``None``: the
    local zone, by its abbreviation); ``-`` for ``None``."""
    if ts is None:
        return "-"
    local = datetime.fromtimestamp(ts, _zone(zone)) if zone else datetime.fromtimestamp(ts)
    when = local if zone else local.astimezone()
    return when.strftime("%Y-%m-%d %H:%M:%S ") + (zone or when.tzname() or "")


def zoned_iso(ts: float | None, zone: str | None) -> str | None:
    """Unix time ``ts`` as ISO 8601 with the offset of ``zone`` (``None``: the local zone)."""
    if ts is None:
        return None
    when = datetime.fromtimestamp(ts, _zone(zone)) if zone else datetime.fromtimestamp(ts)
    return (when if zone else when.astimezone()).isoformat(timespec="seconds")


@click.group("schedule")
@global_options
def schedule_group() -> None:
    """Add, list and remove periodic entries at run time (no restart of the schedulers)."""


def _json_arg(name: str, value: str | None, kind: type[list[Any]] | type[dict[str, Any]]) -> Any:
    """``--name``'s JSON (see :func:`~blitzq.json_input.parse_json`), or an empty ``kind``.

    Raises:
        CliUsageError: not JSON, too deep, a non-finite number, not a ``kind`` (exit 2).
    """
    if value is None:
        return kind()
    try:
        return parse_json(value, f"--{name}", expect=kind)
    except ConfigurationError as exc:
        raise CliUsageError(str(exc)) from None


@schedule_group.command("add", short_help="Add (or replace) a run-time periodic entry.")
@click.argument("name")
@click.option("--task", "task", required=True, metavar="TASK", help="Registered task name.")
@click.option(
    "--cron", metavar="EXPR", help="Cron expression (5 fields, or @hourly, @daily, ...), in --tz."
)
@click.option(
    "--every",
    type=Seconds(minimum=1.0),
    metavar="SECONDS",
    help="Interval in seconds (at least 1).",
)
@click.option("--tz", metavar="ZONE", help="IANA time zone of --cron (default UTC).")
@click.option("--args", "args_json", metavar="JSON", help="Positional arguments, a JSON list.")
@click.option("--kwargs", "kwargs_json", metavar="JSON", help="Keyword arguments, a JSON object.")
@click.option("--queue", "target", metavar="QUEUE", help="Queue to send to (default: task's).")
@click.option(
    "--missed",
    type=click.Choice(["run_once", "run_all", "skip"]),
    default="run_once",
    show_default=True,
    help="What a scheduler does with occurrences missed while none ran.",
)
@global_options
def schedule_add(
    name: str,
    task: str,
    cron: str | None,
    every: float | None,
    tz: str | None,
    args_json: str | None,
    kwargs_json: str | None,
    target: str | None,
    missed: str,
) -> None:
    """Add the periodic entry NAME running TASK on a --cron expression or --every interval
    (replacing an entry of that name). Running schedulers pick it up within one poll
    interval; a scheduler dispatches it when its application registers TASK."""
    args = _json_arg("args", args_json, list)
    kwargs = _json_arg("kwargs", kwargs_json, dict)
    if cron is not None:  # refused before connecting, naming the option
        for option, zone in (("--cron", None), ("--tz", tz)):
            try:
                Cron(cron, tz=zone)
            except ConfigurationError as exc:
                raise CliUsageError(f"{option}: {exc}") from None

    async def add(q: Queue) -> RuntimeSchedule:  # a ConfigurationError: exit code 2
        return await add_schedule(
            q,
            name,
            task,
            cron=cron,
            every=every,
            tz=tz,
            args=args,
            kwargs=kwargs,
            target_queue=target,
            missed=missed,
        )

    entry = run_with_queue(add)
    schedule = entry.schedule()
    if settings().json:
        emit_json({"added": True, "name": entry.name, "schedule": schedule.describe()})
    else:
        console().print(Text(f"added {entry.name}: {entry.task} {schedule.describe()}"))


@schedule_group.command("remove", short_help="Remove a run-time periodic entry.")
@click.argument("name")
@global_options
def schedule_remove(name: str) -> None:
    """Remove the run-time periodic entry NAME (and its last-run record). Exits 1 when there
    is no such entry (a code-defined entry is removed from the code)."""
    if not run_with_queue(lambda q: remove_schedule(q, name)):
        raise CliError(f"no run-time schedule named {name!r}")
    if settings().json:
        emit_json({"removed": True, "name": name})
    else:
        console().print(f"removed {name}")


@schedule_group.command("list", short_help="List the run-time periodic entries.")
@global_options
def schedule_list() -> None:
    """List the run-time periodic entries: task, schedule, zone, queue, next and last run
    (times in the entry's zone: a cron's --tz, UTC for an --every entry; --json: ``tz``)."""

    async def fetch(q: Queue) -> tuple[list[RuntimeSchedule], dict[str, float], float]:
        entries = await runtime_schedules(q)
        last = await q.broker.periodic_last([e.name for e in entries]) if entries else {}
        return entries, last, await q.broker.server_time()

    entries, last, now = run_with_queue(fetch)
    rows = []
    for e in entries:
        try:
            schedule = e.schedule()
            text, next_run = schedule.describe(), schedule.next_after(now)
        except ConfigurationError as exc:
            text, next_run = f"invalid: {exc}", None
        zone = (e.tz or "UTC") if e.cron is not None else None
        rows.append((e, text, zone, next_run, last.get(e.name)))
    if settings().json:
        emit_json(
            {
                "schedules": [
                    {
                        "name": e.name,
                        "task": e.task,
                        "schedule": text,
                        "zone": zone,
                        "tz": shown_zone(zone),
                        "args": e.args,
                        "kwargs": e.kwargs,
                        "queue": e.queue,
                        "missed": e.missed,
                        "next_run": zoned_iso(next_run, shown_zone(zone)),
                        "last_run": zoned_iso(last_run, shown_zone(zone)),
                        "added_at": zoned_iso(e.added_at, shown_zone(zone)),
                    }
                    for e, text, zone, next_run, last_run in rows
                ]
            }
        )
        return
    out = console()
    if not rows:
        out.print("no run-time schedules")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("name", "task", "schedule", "queue", "next run", "last run"):
        table.add_column(header, overflow="fold")
    for e, text, zone, next_run, last_run in rows:
        table.add_row(
            Text(e.name),
            Text(e.task),
            Text(text),
            Text(e.queue or "(task's)"),
            zoned_time(next_run, shown_zone(zone)),
            zoned_time(last_run, shown_zone(zone)),
        )
    out.print(table)
