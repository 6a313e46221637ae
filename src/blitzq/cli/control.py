"""``blitzq control scale`` and ``blitzq control status``: the autoscale setpoint at run time.

``scale --min M --max K`` stores the namespace's setpoint in Redis; every supervisor running
with ``--autoscale`` in that namespace reads it at its next sample and keeps its worker
processes within it (docs/supervisor.md). ``scale --reset`` removes it (each supervisor goes
back to its ``--autoscale MIN,MAX``). ``status`` reads the setpoint back with each live
supervisor's process count and bounds in force.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich import box
from rich.table import Table
from rich.text import Text

from ..queue import Queue
from ..worker.autoscale import HARD_CAP, check_range
from ._common import CliUsageError, console, emit_json, global_options, run_with_queue, settings

__all__ = ["control_group"]


@click.group("control", short_help="Change and read the autoscale setpoint of supervisors.")
@global_options
def control_group() -> None:
    """Control running supervisors (`blitzq worker --autoscale MIN,MAX`) through Redis."""


@control_group.command("scale")
@click.option("--min", "minimum", type=int, metavar="M", help="Fewest worker processes.")
@click.option("--max", "maximum", type=int, metavar="K", help="Most worker processes.")
@click.option(
    "--reset", is_flag=True, default=False, help="Remove the setpoint (back to --autoscale)."
)
@global_options
def scale(minimum: int | None, maximum: int | None, reset: bool) -> None:
    """Set the process range of every autoscaling supervisor of the namespace.

    Supervisors apply it within one sampling interval (--autoscale-interval). Refused (exit
    code 2) when M is below 1, above K, or K is above the hard cap.
    """
    if reset:
        if minimum is not None or maximum is not None:
            raise CliUsageError("--reset takes no --min or --max")
        removed = run_with_queue(lambda q: q.broker.clear_scale())
        if settings().json:
            emit_json({"setpoint": None, "removed": removed})
        else:
            click.echo("setpoint removed" if removed else "no setpoint was set")
        return
    if minimum is None or maximum is None:
        raise CliUsageError("give both --min and --max (or --reset)")
    reason = check_range(minimum, maximum)
    if reason is not None:
        raise CliUsageError(f"setpoint refused: {reason} (allowed: 1 <= min <= max <= {HARD_CAP})")
    lo, hi = minimum, maximum
    run_with_queue(lambda q: q.broker.set_scale(lo, hi))
    if settings().json:
        emit_json({"setpoint": {"min": minimum, "max": maximum}})
    else:
        click.echo(f"setpoint min={minimum} max={maximum}")


@control_group.command("status")
@global_options
def status() -> None:
    """The setpoint and, per live supervisor, its worker processes and the bounds in force."""

    async def read(q: Queue) -> tuple[tuple[int, int, float] | None, dict[str, bytes]]:
        return await q.broker.scale(), await q.broker.supervisors()

    setpoint, raw = run_with_queue(read)
    supervisors: list[dict[str, Any]] = []
    for sid, blob in sorted(raw.items()):
        try:
            doc = json.loads(blob)
        except ValueError:
            doc = {}
        supervisors.append({**(doc if isinstance(doc, dict) else {}), "id": sid})
    point = None if setpoint is None else {"min": setpoint[0], "max": setpoint[1]}
    if settings().json:
        emit_json({"setpoint": point, "supervisors": supervisors})
        return
    out = console()
    if setpoint is None:
        out.print("setpoint: none (each supervisor uses its --autoscale)")
    else:
        out.print(f"setpoint: min={setpoint[0]} max={setpoint[1]}")
    if not supervisors:
        out.print("no autoscaling supervisor is running")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("supervisor", "processes", "min", "max", "waiting", "queues", "seen"):
        table.add_column(header, no_wrap=header != "queues")
    for d in supervisors:
        at = d.get("at")
        ago = f"{max(0.0, time.time() - at):.0f} s ago" if isinstance(at, int | float) else "-"
        table.add_row(
            Text(str(d["id"])),
            *(str(d.get(c, "-")) for c in ("processes", "min", "max", "waiting")),
            Text(",".join(map(str, d.get("queues") or []))),
            ago,
        )
    out.print(table)
