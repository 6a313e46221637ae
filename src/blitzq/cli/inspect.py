"""Task and queue commands: ``task inspect|cancel|send`` and ``queue stats`` (``dead-letter``:
in ``dead_letters.py``).

They need no application module: each builds a Queue from the global options and talks to
the broker directly.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich import box
from rich.table import Table

from ..broker.eviction import check_eviction
from ..client.admin import worker_document
from ..client.lookup import unknown_task_note
from ..client.task_args import dead_letter_of, task_arguments
from ..exceptions import ConfigurationError
from ..json_input import parse_json
from ..progress import Progress
from ..queue import Queue
from ..records import TaskRecord, TaskState
from ..routing import base_queue, check_queue_name
from ..serialization import jsonable
from ._common import (
    CliError,
    Seconds,
    console,
    emit_json,
    global_options,
    iso,
    make_queue,
    run_with_queue,
    settings,
    short_time,
    task_id_argument,
)
from ._rich import Text

_STATE_STYLE = {
    TaskState.SUCCEEDED: "green",
    TaskState.FAILED: "red",
    TaskState.DEAD_LETTERED: "red",
    TaskState.CANCELLED: "yellow",
    TaskState.CANCELLING: "yellow",
    TaskState.RETRYING: "yellow",
}


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _progress_text(p: Progress) -> str:
    done = f"{p.current:g}" + (f"/{p.total:g}" if p.total is not None else "")
    if p.fraction is not None:
        done += f" ({p.fraction:.0%})"
    return done + (f"  {p.message}" if p.message else "") + f"  at {short_time(p.updated_at)}"


# ------------------------------------------------------------------- task
@click.group("task")
@global_options
def task_group() -> None:
    """Look at individual tasks."""


def record_doc(record: TaskRecord) -> dict[str, Any]:
    """A record as a JSON-ready dict, times as ISO dates and a ``duration`` in seconds."""
    doc = record.to_dict()
    for key in ("enqueued_at", "started_at", "finished_at", "due_at"):
        doc[key] = iso(doc[key])
    if record.started_at is not None and record.finished_at is not None:
        doc["duration"] = round(record.finished_at - record.started_at, 6)
    else:
        doc["duration"] = None
    return doc


@task_group.command("inspect")
@click.argument("task_id")
@global_options
def task_inspect(task_id: str) -> None:
    """Show the stored record of TASK_ID: state, attempts, arguments, result or error, times,
    worker.

    Shows the task's latest progress report too, when it made one, and for a task waiting
    on the schedule (a delay, an eta, a retry's backoff) when it is due. The arguments are
    a preview (at most 2048 bytes) from the record, else the dead letter or the scheduled
    message (``args_from`` says which); when none has them, ``args_note`` says why. A
    scheduled task whose name no live worker of its queue knows gets a ``note`` saying so
    (it is put back on the schedule, then dead-lettered ``unknown task``). Exits 1
    when nothing is known of it (never enqueued, waiting in its queue or running without
    track_state, or expired after result_ttl); exits 2 when TASK_ID cannot be a task id
    (empty, too long, holding a space or a newline).
    """
    task_id = task_id_argument(task_id)

    async def fetch(q: Queue) -> tuple[TaskRecord | None, Progress | None, dict[str, Any]]:
        record, progress = await q.inspect(task_id), await q.get_progress(task_id)
        if record is None and progress is not None:  # running without a record (fast mode)
            record = TaskRecord(task_id, "", "", TaskState.RUNNING)
        if record is None:
            return None, None, {}
        letter = await dead_letter_of(q.broker, task_id)
        arguments = await task_arguments(q.broker, record, letter)
        arguments["note"] = None
        entry = await q.broker.scheduled_entry(task_id) if record.due_at is not None else None
        if entry is not None:  # a name no live worker knows: it would wait here, then die
            arguments["note"] = (await unknown_task_note(q.broker, entry[2], entry[1]))[2:] or None
        return record, progress, arguments

    record, progress, arguments = run_with_queue(fetch)
    if record is None:
        raise CliError(
            f"no record for task {task_id} (unknown, waiting in its queue or running without "
            "track_state, or expired after result_ttl; Queue(track_state=True) records "
            "queued and running tasks too)"
        )
    doc = record_doc(record) | arguments
    doc["progress"] = None
    if progress is not None:
        doc["progress"] = {
            "current": progress.current,
            "total": progress.total,
            "message": progress.message,
            "updated_at": iso(progress.updated_at),
        }
    if settings().json:
        emit_json(doc)
        return
    out = console()
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key in ("id", "task", "queue"):
        table.add_row(key, Text(str(doc[key])))
    table.add_row("state", Text(record.state.value, style=_STATE_STYLE.get(record.state, "")))
    table.add_row("attempts", str(record.attempts))
    if progress is not None:
        table.add_row("progress", Text(_progress_text(progress)))
    if arguments["args_from"] is None:
        table.add_row("args", Text(f"not kept: {arguments['args_note']}", style="dim"))
    else:
        for key in ("args", "kwargs"):
            shown = json.dumps(arguments[key], default=jsonable, ensure_ascii=False)
            table.add_row(key, Text(shown))
        cut = ", cut to 2048 bytes (cuts marked …)" if arguments["args_truncated"] else ""
        table.add_row("args from", Text(f"the {arguments['args_from']}{cut}", style="dim"))
    if record.state is TaskState.SUCCEEDED:
        table.add_row("result", Text(_short(record.result, 2000)))
    if record.error_type or record.error:
        table.add_row("error", Text(f"{record.error_type or 'error'}: {record.error or ''}"))
    if doc["due_at"]:
        table.add_row("due", Text(doc["due_at"]))
    if doc["note"]:
        table.add_row("note", Text(doc["note"], style="yellow"))
    for key in ("enqueued_at", "started_at", "finished_at"):
        table.add_row(key.replace("_at", ""), Text(doc[key] or "-"))
    if doc["duration"] is not None:
        table.add_row("duration", f"{doc['duration']:.3f} s")
    table.add_row("worker", Text(record.worker or "-"))
    out.print(table)
    if record.traceback:
        out.print(Text(record.traceback.rstrip(), style="dim"))


_CANCEL_ANSWERS = {
    "scheduled": "taken off the schedule; it will never start",
    "queued": "marked cancelled; workers will skip it",
    "pending": (
        "queued without state tracking, running, or never enqueued; marked cancelled: "
        "workers skip it, or stop it if it is running"
    ),
    "running": "running; its worker was told to stop it",
    "finished": "already finished; nothing changed",
}


@task_group.command("cancel")
@click.argument("task_id")
@global_options
def task_cancel(task_id: str) -> None:
    """Cancel TASK_ID: a scheduled task never starts, a queued one is skipped, a running one
    is stopped by its worker. Its record becomes ``cancelled``.

    Prints what the task was (scheduled, queued, pending, running, or finished, in which case
    nothing changed); exits 0 in every case, but 2 when TASK_ID cannot be a task id (empty,
    too long, holding a space or a newline).
    """
    task_id = task_id_argument(task_id)
    answer = run_with_queue(lambda q: q.cancel(task_id))
    if settings().json:
        emit_json({"id": task_id, "was": answer, "cancelled": answer != "finished"})
        return
    text = _CANCEL_ANSWERS.get(answer, answer)
    style = "" if answer == "finished" else "yellow"
    if answer == "pending":  # no record: queued without state tracking, running, or unknown
        console().print(Text(f"task {task_id} has no record: {text}", style=style))
        return
    console().print(Text(f"task {task_id} was {answer}: {text}", style=style))


def _json_option(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """``--args`` / ``--kwargs`` parsed by :func:`~blitzq.json_input.parse_json` (a usage
    error, exit 2, naming the option when the JSON is bad or of the wrong type)."""
    if value is None:
        return [] if param.name == "args" else {}
    try:
        if param.name == "args":
            return parse_json(value, "--args", expect=list)
        return parse_json(value, f"--{param.name}", expect=dict)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc).partition(": ")[2], ctx, param) from None


def _queue_option(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--queue`` checked as a queue name (usage error, exit 2)."""
    if value is None:
        return None
    try:
        return check_queue_name("queue", value)
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


@task_group.command("send", short_help="Enqueue a task by name.")
@click.argument("name")
@click.option(
    "--args",
    "args",
    metavar="JSON",
    callback=_json_option,
    help="Positional arguments, a JSON list.",
)
@click.option(
    "--kwargs",
    "kwargs",
    metavar="JSON",
    callback=_json_option,
    help="Keyword arguments, a JSON object.",
)
@click.option(
    "--queue",
    "queue",
    metavar="QUEUE",
    callback=_queue_option,
    help="Queue to send to (default: the Queue's routes, else the default queue 'default').",
)
@click.option(
    "--delay",
    type=Seconds(minimum=0.0),
    default=None,
    metavar="SECONDS",
    help="Seconds to wait before the task becomes due (counted on the broker's clock).",
)
@global_options
def task_send(
    name: str, args: list[Any], kwargs: dict[str, Any], queue: str | None, delay: float | None
) -> None:
    """Enqueue the task registered as NAME (no application module needed: the message is
    built by name, as ``queue.send`` does) and print its id; a worker that knows NAME runs
    it. ``--json`` prints ``{"id", "task", "queue"}``. Bad JSON, a bad queue name or delay
    is a usage error (exit 2) naming the option."""
    options: dict[str, Any] = {}
    if queue is not None:
        options["queue"] = queue
    if delay is not None:
        options["delay"] = delay
    handle = run_with_queue(lambda q: q.send(name, args, kwargs, **options))
    if settings().json:
        emit_json({"id": handle.id, "task": name, "queue": handle.queue})
        return
    click.echo(handle.id)


# ------------------------------------------------------------------ queue
@click.group("queue")
@global_options
def queue_group() -> None:
    """Look at queues, purge, pause and resume them."""


@queue_group.command("stats")
@click.option(
    "-Q",
    "--queues",
    metavar="Q1,Q2",
    help="Only these queues (default: every queue the namespace has used).",
)
@global_options
def queue_stats(queues: str | None) -> None:
    """Waiting and in-flight tasks per queue (marked when paused), scheduled tasks, dead
    letters, live workers. On RabbitMQ a ready message of a bulk enqueue (a pack of up to 32
    tasks) counts once in waiting, as a line under the table says."""
    names = [q.strip() for q in queues.split(",") if q.strip()] if queues else None

    async def collect(
        q: Queue,
    ) -> tuple[dict[str, Any], dict[str, bytes], str | None, set[str], str | None]:
        warning = await check_eviction(q.broker)  # logs a WARNING naming the policy
        stats, workers = await q.stats(names), await q.broker.workers()
        return stats, workers, warning, await q.broker.paused_queues(), q.broker.count_note

    queue = make_queue()
    stats, workers, warning, paused, note = run_with_queue(collect, queue)
    worker_docs = sorted(
        (worker_document(wid, raw) for wid, raw in workers.items()), key=lambda d: str(d["id"])
    )
    if settings().json:
        for d in worker_docs:
            for key in ("started_at", "heartbeat_at"):
                if isinstance(d.get(key), int | float):
                    d[key] = iso(d[key])
        emit_json(
            {
                "namespace": queue.namespace,
                "mode": queue.mode,
                "queues": stats["queues"],
                "count_note": note,
                "paused": sorted(paused),
                "scheduled": stats["scheduled"],
                "dead_letters": stats["dead_letters"],
                "wrong_type_keys": stats.get("wrong_type_keys", {}),
                "workers": worker_docs,
                "warnings": [warning] if warning else [],
            }
        )
        return
    out = console()
    out.print(Text(f"namespace {queue.namespace} ({queue.mode} mode)", style="bold"))
    if stats["queues"]:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("queue", overflow="fold")
        table.add_column("waiting", justify="right")
        table.add_column("in flight", justify="right")
        table.add_column("", no_wrap=True)
        for name, counts in sorted(stats["queues"].items()):
            mark = Text("paused", style="yellow") if base_queue(name) in paused else Text("")
            table.add_row(Text(name), str(counts["waiting"]), str(counts["in_flight"]), mark)
        out.print(table)
        if note:
            out.print(Text(note, style="dim"))
        if paused:
            out.print(
                Text(f"paused: {', '.join(sorted(paused))} (blitzq queue resume QUEUE)", "yellow")
            )
    else:
        out.print("no queues used yet")
    out.print(f"scheduled: {stats['scheduled']}")
    out.print(f"dead letters: {stats['dead_letters']}")
    for key, wrong in sorted(stats.get("wrong_type_keys", {}).items()):
        out.print(Text(f"bad key {key}: {wrong} (redis-cli DEL {key} if nothing else uses it)"))
    out.print(f"live workers: {len(worker_docs)}")
    if worker_docs:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column("worker", no_wrap=True)
        table.add_column("queues", overflow="fold")
        for header in ("slots", "running", "processed", "failed"):
            table.add_column(header, justify="right", no_wrap=True)
        table.add_column("started", no_wrap=True)
        table.add_column("as of", no_wrap=True)
        for d in worker_docs:
            started, updated = d.get("started_at"), d.get("heartbeat_at")
            table.add_row(
                Text(str(d["id"])),
                Text(",".join(map(str, d.get("queues") or []))),
                *(str(d.get(c, "-")) for c in ("concurrency", "running", "processed", "failed")),
                short_time(started) if isinstance(started, int | float) else "-",
                short_time(updated) if isinstance(updated, int | float) else "-",
            )
        out.print(table)
        out.print(
            Text(
                "running/processed/failed are each worker's own counts (processed: runs that "
                "succeeded; the same numbers as --json) as of its last registration, the "
                "'as of' time: about a second behind a busy worker",
                style="dim",
            )
        )
