"""``blitzq control scale`` and ``blitzq control status``: the autoscale setpoint at run time.

Both take the application, ``MODULE:ATTR``, as the other commands that act on one do
(``check``, ``scheduler list``): its Queue's broker URL and namespace are used, the global
options winning as they do in ``blitzq worker``, so they reach the supervisors of
``blitzq worker MODULE:ATTR --autoscale MIN,MAX`` also when the Queue sets its namespace in
code. Without it they use the global options alone (``--namespace``, ``BLITZQ_NAMESPACE``,
default ``blitzq``), as ``queue stats`` does.

``scale --min M --max K`` stores the namespace's setpoint in Redis (``--group LABEL``: the
setpoint of the supervisors started with ``--group LABEL``); every supervisor running with
``--autoscale`` or ``--max-processes`` in that namespace and group reads it at its next
sample, accepts it or rejects it with a reason (above its ``--max-processes``, inverted,
unreadable), and keeps its worker processes within what it accepted (docs/supervisor.md).
``scale --reset`` removes it (each supervisor goes back to its ``--autoscale MIN,MAX``).
``status`` reads the setpoint back with each live supervisor's process count, bounds in
force and verdict on the setpoint.
"""

from __future__ import annotations

import json
import time
from typing import Any

import click
from rich import box
from rich.table import Table

from ..queue import Queue
from ..worker.autoscale import HARD_CAP, check_group, check_range
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
from ._rich import Text

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


def _group_label(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and (reason := check_group(value)) is not None:
        raise click.BadParameter(reason, ctx, param)
    return value


_GROUP = click.option(
    "--group",
    metavar="LABEL",
    default=None,
    callback=_group_label,
    help="The supervisors of `blitzq worker --group LABEL` (default: those in no group).",
)


@control_group.command("scale")
@click.argument("app", metavar="[MODULE:ATTR]", required=False)
@click.option("--min", "minimum", type=int, metavar="M", help="Fewest worker processes.")
@click.option("--max", "maximum", type=int, metavar="K", help="Most worker processes.")
@click.option(
    "--reset", is_flag=True, default=False, help="Remove the setpoint (back to --autoscale)."
)
@_GROUP
@global_options
def scale(
    app: str | None, minimum: int | None, maximum: int | None, reset: bool, group: str | None
) -> None:
    """Set the process range of every autoscaling supervisor of the namespace of the
    application at MODULE:ATTR (without it: of --namespace, default blitzq), or with
    --group of those started with `blitzq worker --group LABEL`.

    Supervisors apply it within one sampling interval (--autoscale-interval); one whose
    --max-processes is below K rejects it, with the reason in `blitzq control status`.
    Refused here (exit code 2) when M is below 1, above K, or K is above the hard cap.
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
    where = f"namespace {namespace}" + (f", group {group}" if group is not None else "")
    if point is None:
        removed = run_with_queue(lambda q: q.broker.state.operations.clear_scale(group), queue)
        if settings().json:
            emit_json(
                {"namespace": namespace, "group": group, "setpoint": None, "removed": removed}
            )
        else:
            click.echo(
                f"setpoint removed ({where})" if removed else f"no setpoint was set ({where})"
            )
        return
    lo, hi = point
    run_with_queue(lambda q: q.broker.state.operations.set_scale(lo, hi, group), queue)
    if settings().json:
        emit_json({"namespace": namespace, "group": group, "setpoint": {"min": lo, "max": hi}})
    else:
        click.echo(f"setpoint min={lo} max={hi} ({where})")


@control_group.command("status")
@click.argument("app", metavar="[MODULE:ATTR]", required=False)
@_GROUP
@global_options
def status(app: str | None, group: str | None) -> None:
    """The setpoint and, per live supervisor of the group (default: in no group), its worker
    processes, the bounds in force and whether it accepted or rejected the setpoint (with
    the reason), in the namespace of the application at MODULE:ATTR (without it: of
    --namespace, default blitzq)."""

    async def read(
        q: Queue,
    ) -> tuple[tuple[int, int, float] | None, dict[str, bytes], str | None]:
        operations = q.broker.state.operations
        return await operations.scale(group), await operations.supervisors(), q.broker.count_note

    queue = _target(app)
    namespace = queue.namespace
    setpoint, raw, note = run_with_queue(read, queue)
    supervisors: list[dict[str, Any]] = []
    for sid, blob in sorted(raw.items()):
        try:
            doc = json.loads(blob)
        except ValueError:
            doc = {}
        doc = doc if isinstance(doc, dict) else {}
        if doc.get("group") == group:
            supervisors.append({**doc, "id": sid})
    point = None if setpoint is None else {"min": setpoint[0], "max": setpoint[1]}
    if settings().json:
        emit_json(
            {"namespace": namespace, "group": group, "setpoint": point, "supervisors": supervisors}
        )
        return
    out = console()
    out.print(Text(f"namespace: {namespace}" + (f", group: {group}" if group else "")))
    if setpoint is None:
        out.print("setpoint: none (each supervisor uses its --autoscale)")
    else:
        out.print(f"setpoint: min={setpoint[0]} max={setpoint[1]}")
    if not supervisors:
        out.print(Text(f"no autoscaling supervisor is running in namespace {namespace}"))
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    headers = ("supervisor", "processes", "min", "max", "setpoint", "waiting", "queues", "seen")
    for header in headers:
        table.add_column(header, no_wrap=header not in ("queues", "setpoint"))
    for d in supervisors:
        at = d.get("at")
        ago = f"{max(0.0, time.time() - at):.0f} s ago" if isinstance(at, int | float) else "-"
        verdict = str(d.get("setpoint_state", "-"))
        if d.get("rejected"):
            verdict += f": {d['rejected']}"
        table.add_row(
            Text(str(d["id"])),
            *(str(d.get(c, "-")) for c in ("processes", "min", "max")),
            Text(verdict),
            str(d.get("waiting", "-")),
            Text(",".join(map(str, d.get("queues") or []))),
            ago,
        )
    out.print(table)
    if note:  # the samplers read waiting as queue stats do
        out.print(Text(note, style="dim"))
