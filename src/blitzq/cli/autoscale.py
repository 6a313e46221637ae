"""``blitzq control scale`` and ``blitzq control status``: the autoscale setpoint at run time.

Both take the application, ``MODULE:ATTR``, as the other commands that act on one do
(``check``, ``scheduler list``): its Queue's broker URL and namespace are used, the global
options winning as they do in ``blitzq worker``, so they reach the supervisors of
``blitzq worker MODULE:ATTR --autoscale MIN,MAX`` also when the Queue sets its namespace in
code. Without it they use the global options alone (``--namespace``, ``BLITZQ_NAMESPACE``,
default ``blitzq``), as ``queue stats`` does.

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
from ._common import (
    CliUsageError,
    console,
    emit_json,
    global_options,
    make_queue,
    run_with_queue,
    settings,
    use_running_server,
)

__all__ = ["control_group"]


@click.group("control", short_help="Change and read the autoscale setpoint of supervisors.")
@global_options
def control_group() -> None:
    """Control running supervisors (`blitzq worker --autoscale MIN,MAX`) through Redis."""


def _target(app: str | None) -> Queue:
    """The Queue whose broker and namespace the command acts on: the application's at ``app``
    (``MODULE:ATTR``, global options applied; no embedded server started), else one built
    from the global options.

    Raises:
        CliError: the application cannot be loaded (exit code 2), or no broker URL and no
            running embedded server (exit code 1).
    """
    if app is None:
        return make_queue()
    from .scheduler import _load  # the loading of check and scheduler list (import cycle)

    queue = _load(app)
    use_running_server(queue)
    return queue


@control_group.command("scale")
@click.argument("app", metavar="[MODULE:ATTR]", required=False)
@click.option("--min", "minimum", type=int, metavar="M", help="Fewest worker processes.")
@click.option("--max", "maximum", type=int, metavar="K", help="Most worker processes.")
@click.option(
    "--reset", is_flag=True, default=False, help="Remove the setpoint (back to --autoscale)."
)
@global_options
def scale(app: str | None, minimum: int | None, maximum: int | None, reset: bool) -> None:
    """Set the process range of every autoscaling supervisor of the namespace of the
    application at MODULE:ATTR (without it: of --namespace, default blitzq).

    Supervisors apply it within one sampling interval (--autoscale-interval). Refused (exit
    code 2) when M is below 1, above K, or K is above the hard cap.
    """
    point: tuple[int, int] | None = None
    if reset:
        if minimum is not None or maximum is not None:
            raise CliUsageError("--reset takes no --min or --max")
    elif minimum is None or maximum is None:
        raise CliUsageError("give both --min and --max (or --reset)")
    else:
        reason = check_range(minimum, maximum)
        if reason is not None:
            raise CliUsageError(
                f"setpoint refused: {reason} (allowed: 1 <= min <= max <= {HARD_CAP})"
            )
        point = (minimum, maximum)
    queue = _target(app)  # after the checks: a refused range loads nothing
    namespace = queue.namespace
    if point is None:
        removed = run_with_queue(lambda q: q.broker.state.clear_scale(), queue)
        if settings().json:
            emit_json({"namespace": namespace, "setpoint": None, "removed": removed})
        else:
            click.echo(
                f"setpoint removed (namespace {namespace})"
                if removed
                else f"no setpoint was set (namespace {namespace})"
            )
        return
    lo, hi = point
    run_with_queue(lambda q: q.broker.state.set_scale(lo, hi), queue)
    if settings().json:
        emit_json({"namespace": namespace, "setpoint": {"min": lo, "max": hi}})
    else:
        click.echo(f"setpoint min={lo} max={hi} (namespace {namespace})")


@control_group.command("status")
@click.argument("app", metavar="[MODULE:ATTR]", required=False)
@global_options
def status(app: str | None) -> None:
    """The setpoint and, per live supervisor, its worker processes and the bounds in force,
    in the namespace of the application at MODULE:ATTR (without it: of --namespace, default
    blitzq)."""

    async def read(q: Queue) -> tuple[tuple[int, int, float] | None, dict[str, bytes]]:
        return await q.broker.state.scale(), await q.broker.state.supervisors()

    queue = _target(app)
    namespace = queue.namespace
    setpoint, raw = run_with_queue(read, queue)
    supervisors: list[dict[str, Any]] = []
    for sid, blob in sorted(raw.items()):
        try:
            doc = json.loads(blob)
        except ValueError:
            doc = {}
        supervisors.append({**(doc if isinstance(doc, dict) else {}), "id": sid})
    point = None if setpoint is None else {"min": setpoint[0], "max": setpoint[1]}
    if settings().json:
        emit_json({"namespace": namespace, "setpoint": point, "supervisors": supervisors})
        return
    out = console()
    out.print(Text(f"namespace: {namespace}"))
    if setpoint is None:
        out.print("setpoint: none (each supervisor uses its --autoscale)")
    else:
        out.print(f"setpoint: min={setpoint[0]} max={setpoint[1]}")
    if not supervisors:
        out.print(Text(f"no autoscaling supervisor is running in namespace {namespace}"))
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
