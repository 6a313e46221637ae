"""``blitzq dead-letter list|show|replay|purge|summary``: the dead-letter queue from the shell.

Every command but ``show`` takes the same filters (``--task``, ``--queue``, ``--reason``,
``--error-type``, ``--older-than``, ``--newer-than``): those of ``queue.dead_letters(...)``
(:class:`~blitzq.client.dead_letter_query.DeadLetterFilter`). Like the other inspection
commands they need no application module.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich import box
from rich.table import Table

from ..client.dead_letter_query import ReplayOutcome, replay_counts
from ..dead_letters import DEAD_LETTER_REASONS, DeadLetter
from ..exceptions import ConfigurationError, SerializationError
from ..queue import DEFAULT_MAX_MESSAGE_SIZE, Queue
from ..ratelimit import RateLimit
from ..task import TaskHandle
from ._common import (
    CliError,
    CliUsageError,
    Seconds,
    confirm,
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

__all__ = ["Duration", "dead_letter_group"]

F = TypeVar("F", bound=Callable[..., Any])

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhdw]?)\s*")


class Duration(Seconds):
    """A click parameter of a duration: seconds (``90``), or a number with a unit ``s``,
    ``m``, ``h``, ``d`` or ``w`` (``15m``, ``2h``, ``7d``); a usage error otherwise."""

    name = "duration"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """Parse ``value`` into seconds."""
        if isinstance(value, str):
            match = _DURATION.fullmatch(value.lower())
            if match is None:
                self.fail(f"{value!r} is not a duration like 90, 90s, 15m, 2h or 7d", param, ctx)
            value = float(match.group(1)) * _UNITS[match.group(2)]
        return super().convert(value, param, ctx)


def filter_options(fn: F) -> F:
    """Add the dead-letter filters; the command gets them as ``filters`` (a dict)."""
    options = [
        click.option("--task", metavar="NAME", help="Only this task name."),
        click.option(
            "--queue", metavar="QUEUE", help="Only this queue (a base name: all its levels)."
        ),
        click.option(
            "--reason",
            type=click.Choice(DEAD_LETTER_REASONS),
            metavar="REASON",
            help="Only this reason: " + ", ".join(DEAD_LETTER_REASONS) + ".",
        ),
        click.option(
            "--error-type", metavar="TYPE", help="Only failures raising this exception type."
        ),
        click.option(
            "--older-than", type=Duration(), metavar="AGE", help="Dead-lettered at least AGE ago."
        ),
        click.option(
            "--newer-than", type=Duration(), metavar="AGE", help="Dead-lettered at most AGE ago."
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _filters(kwargs: dict[str, Any]) -> dict[str, Any]:
    names = ("task", "queue", "reason", "error_type", "older_than", "newer_than")
    return {name: kwargs.pop(name) for name in names}


@click.group("dead-letter")
@global_options
def dead_letter_group() -> None:
    """List, show, replay, purge and summarize dead-lettered tasks."""


def dead_letter_doc(dl: DeadLetter, summary: bool = False) -> dict[str, Any]:
    """A dead letter as a JSON-ready dict (``failed_at`` as an ISO date); with ``summary``
    its arguments as a bounded preview (:meth:`DeadLetter.to_summary`, for lists)."""
    doc = dl.to_summary() if summary else dl.to_dict()
    doc["failed_at"] = iso(dl.failed_at)
    return doc


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dead_letter_group.command("list")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="Most dead letters to show, newest first.",
)
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Matches to skip.")
@filter_options
@global_options
def dead_letter_list(limit: int, offset: int, **kwargs: Any) -> None:
    """List dead letters, newest first (those matching the filters given)."""
    filters = _filters(kwargs)

    async def fetch(q: Queue) -> tuple[list[DeadLetter], int]:
        return await q.dead_letters(limit, offset, **filters), await q.dead_letter_count()

    letters, total = run_with_queue(fetch)
    filtered = any(v is not None for v in filters.values())
    if settings().json:
        docs = [dead_letter_doc(d, summary=True) for d in letters]
        emit_json({"total": total, "dead_letters": docs})
        return
    out = console()
    if not letters:
        if total == 0:
            out.print("no dead letters")
        else:
            out.print("no dead letters match" if filtered else f"no dead letters past {offset}")
        return
    scope = "matching, " if filtered else ""
    out.print(Text(f"dead letters: {len(letters)} of {total} ({scope}newest first)", "bold"))
    for d in letters:
        head = Text(d.id, style="bold")
        where = f"{d.queue} ({d.mode})" if d.mode else d.queue
        head.append(f"  {d.task or '?'}  queue {where}  {short_time(d.failed_at)}")
        out.print(head)
        out.print(Text(f"    {d.reason}: {_short(d.error, 300)}", style="red"))


@dead_letter_group.command("show")
@click.argument("task_id")
@global_options
def dead_letter_show(task_id: str) -> None:
    """Show dead letter TASK_ID: task, queue, reason, error, time, arguments. Exits 1 when
    there is no such dead letter, 2 when TASK_ID cannot be a task id."""
    task_id = task_id_argument(task_id)

    async def fetch(q: Queue) -> DeadLetter | None:
        f = await q.broker.get_dead_letter(task_id)
        if f is None:
            return None
        return DeadLetter.from_fields(
            task_id, f.message, f.reason, f.error, f.task, f.queue, f.failed_at, f.kind
        )

    dl = run_with_queue(fetch)
    if dl is None:
        raise CliError(f"no dead letter with id {task_id}")
    doc = dead_letter_doc(dl)
    doc["message_bytes"] = len(dl.message)
    if settings().json:
        emit_json(doc)
        return
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column("value", overflow="fold")
    for key in ("id", "task", "queue", "mode", "reason", "error_type", "failed_at"):
        table.add_row(key, Text(str(doc[key] if doc[key] not in (None, "") else "-")))
    table.add_row("error", Text(dl.error, style="red"))
    table.add_row("args", Text(repr(dl.args) if dl.args is not None else "(undecodable)"))
    table.add_row("kwargs", Text(repr(dl.kwargs) if dl.kwargs is not None else "-"))
    table.add_row("message", f"{len(dl.message)} bytes")
    console().print(table)


def _rate(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return RateLimit.parse(value if "/" in value else f"{value}/s").rate
    except ConfigurationError as exc:
        raise CliUsageError(f"--rate: {exc}") from None


@dead_letter_group.command("replay", short_help="Replay one dead letter, or all that match.")
@click.argument("task_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Replay every dead letter matching the filters.")
@click.option("--rate", metavar="N/s", help="Most replays per second (10, 10/s, 100/m).")
@click.option("--limit", type=click.IntRange(min=1), help="Replay at most this many (--all).")
@click.option("--dry-run", is_flag=True, help="Print what would be replayed; change nothing.")
@click.option(
    "--max-message-size",
    type=click.IntRange(min=64),
    default=DEFAULT_MAX_MESSAGE_SIZE,
    show_default=True,
    metavar="BYTES",
    help="Largest message replayed (set it as the application's Queue does).",
)
@filter_options
@global_options
def dead_letter_replay(
    task_id: str | None,
    all_: bool,
    rate: str | None,
    limit: int | None,
    dry_run: bool,
    max_message_size: int,
    **kwargs: Any,
) -> None:
    """Publish dead letter TASK_ID (or, with --all, every one matching the filters, oldest
    first) again with fresh attempts, removing it from the list.

    It goes back to the queue it came from, in the mode it came from (a fast-mode list or a
    reliable-mode stream; --mode only for dead letters stored before blitzq recorded it). A
    unique task claims its unique key again. TASK_ID: exits 1, keeping the dead letter, when
    its message is malformed or over --max-message-size, or when another task holds its
    unique key; exits 1 when there is no such dead letter. --all: prints each outcome and a
    summary (replayed means published again, not run: those a worker dead-lettered again
    before the batch ended are counted apart) and exits 1 when any was refused or held. A
    message with a field a worker would dead-letter it for at once (a bad timeout, max_age,
    id) is refused, not replayed.
    """
    filters = _filters(kwargs)
    per_second = _rate(rate)
    if (task_id is None) == (not all_):
        raise CliUsageError("give a TASK_ID or --all (with filters), not both")
    if task_id is not None:
        task_id = task_id_argument(task_id)
    if task_id is not None and (any(v is not None for v in filters.values()) or limit):
        raise CliUsageError("filters and --limit apply to --all, not to one TASK_ID")
    queue = make_queue()
    queue.max_message_size = max_message_size
    if task_id is None:
        _replay_all(queue, filters, per_second, limit, dry_run)
    else:
        _replay_one(queue, task_id, dry_run)


def _replay_all(
    queue: Queue, filters: dict[str, Any], rate: float | None, limit: int | None, dry_run: bool
) -> None:
    outcomes: list[ReplayOutcome] = run_with_queue(
        lambda q: q.retry_dead_letters(**filters, rate=rate, limit=limit, dry_run=dry_run), queue
    )
    failed = [o for o in outcomes if o.outcome in ("held", "refused")]
    counts = replay_counts(outcomes)
    if settings().json:
        doc = {"dry_run": dry_run, "summary": counts, "outcomes": [o.to_dict() for o in outcomes]}
        emit_json(doc)
    else:
        out = console()
        for o in outcomes:
            detail = f" ({o.detail})" if o.detail else ""
            style = "red" if o in failed or o.outcome == "dead-lettered again" else ""
            out.print(Text(f"{o.outcome}: {o.id}  {o.task or '?'}  queue {o.queue}{detail}", style))
        out.print(Text(replay_summary(counts), style="bold"))
    if failed:
        raise click.exceptions.Exit(1)


def replay_summary(counts: dict[str, int]) -> str:
    """The last line of ``replay --all``, from :func:`replay_counts`: ``replayed 5 (2 of them
    dead-lettered again already), 1 refused (kept)``; "no dead letters match" for none."""
    parts = []
    if counts["dry_run"]:
        parts.append(f"{counts['dry_run']} would be replayed (dry run)")
    if counts["replayed"]:
        again = counts["dead_lettered_again"]
        note = f" ({again} of them dead-lettered again already)" if again else ""
        parts.append(f"replayed {counts['replayed']}{note}")
    for key, text in (("refused", "refused (kept)"), ("held", "held (kept)"), ("gone", "gone")):
        if counts[key]:
            parts.append(f"{counts[key]} {text}")
    return ", ".join(parts) or "no dead letters match"


def _replay_one(queue: Queue, task_id: str, dry_run: bool) -> None:
    async def replay(q: Queue) -> tuple[TaskHandle[Any] | None, str] | None:
        fields = await q.broker.get_dead_letter(task_id)
        if fields is None:
            return None
        mode = {"s": "reliable", "l": "fast"}.get(fields.kind, q.mode)  # where retry() goes
        if dry_run:
            return None, f"{fields.task or '?'} to queue {fields.queue} ({mode} mode)"
        try:
            handle = await q.retry(task_id)
        except SerializationError as exc:
            raise CliError(f"dead letter {task_id} cannot be replayed: {exc}") from None
        return None if handle is None else (handle, mode)

    replayed = run_with_queue(replay, queue)
    if replayed is None:
        raise CliError(f"no dead letter with id {task_id}")
    handle, mode = replayed
    if handle is None:  # a dry run
        if settings().json:
            emit_json({"replayed": False, "dry_run": True, "id": task_id, "would": mode})
        else:
            console().print(Text(f"would replay {task_id}: {mode}"))
        return
    if handle.duplicate:
        raise CliError(
            f"dead letter {task_id} not replayed: task {handle.id} holds its unique key "
            "(the dead letter is kept; replay it once that task is done)"
        )
    if settings().json:
        emit_json({"replayed": True, "id": handle.id, "queue": handle.queue, "mode": mode})
    else:
        console().print(Text(f"replayed {handle.id} to queue {handle.queue} ({mode} mode)"))


@dead_letter_group.command("purge")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@filter_options
@global_options
def dead_letter_purge(yes: bool, **kwargs: Any) -> None:
    """Delete the dead letters matching the filters (none given: every dead letter of the
    namespace). Asks first, unless --yes."""
    filters = _filters(kwargs)
    queue = make_queue()
    if not yes:
        count = run_with_queue(lambda q: _count(q, filters), queue)
        if count == 0:
            _purged(0)
            return
        which = "matching " if any(v is not None for v in filters.values()) else ""
        confirm(f"Delete {count} {which}dead letter(s) in namespace {queue.namespace!r}?")
    _purged(run_with_queue(lambda q: q.purge_dead_letters(**filters), queue))


async def _count(q: Queue, filters: dict[str, Any]) -> int:
    if all(v is None for v in filters.values()):
        return await q.dead_letter_count()
    return int((await q.dead_letter_summary(**filters))["total"])


def _purged(count: int) -> None:
    if settings().json:
        emit_json({"purged": count})
    else:
        console().print(f"purged {count} dead letter(s)")


@dead_letter_group.command("summary")
@filter_options
@global_options
def dead_letter_summary(**kwargs: Any) -> None:
    """Count the dead letters (matching the filters) by task, reason, error type and queue."""
    filters = _filters(kwargs)
    summary: dict[str, Any] = run_with_queue(lambda q: q.dead_letter_summary(**filters))
    if settings().json:
        emit_json(summary)
        return
    out = console()
    out.print(Text(f"dead letters: {summary['total']}", style="bold"))
    for key, title in (
        ("by_task", "task"),
        ("by_reason", "reason"),
        ("by_error_type", "error type"),
        ("by_queue", "queue"),
    ):
        groups: dict[str, int] = summary[key]
        if not groups:
            continue
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        table.add_column(title, overflow="fold")
        table.add_column("count", justify="right")
        for name, n in groups.items():
            table.add_row(Text(name or "-"), str(n))
        out.print(table)
