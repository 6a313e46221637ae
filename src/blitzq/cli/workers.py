"""``blitzq worker list`` and ``blitzq worker shutdown ID``: the live workers of a namespace.

``list`` reads the workers' registrations (each worker rewrites its own every maintenance
round, a third of ``visibility_timeout``): id, host, pid, queues, concurrency, how many
tasks run and which (the oldest 20), paused queues, as of the registration's time.

``shutdown ID`` asks one worker, on any host, to shut down gracefully, as SIGTERM would: a
push on the namespace's event channel, which every worker follows. It stops fetching, lets
its running tasks finish (up to its ``--shutdown-timeout``) and unregisters; the command
waits for that (``--timeout``, default 60 s; ``--no-wait`` returns at once). A worker run
by a supervisor (``--workers N``) is replaced by a new process in its slot: stop the
supervisor (SIGTERM) to stop them all.

These are reached as ``blitzq worker list|shutdown`` (``blitzq worker MODULE:ATTR`` runs a
worker): :func:`resolve` picks this group for those two words.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import click
from rich import box
from rich.table import Table

from ..client.admin import is_live_worker, worker_document
from ..queue import Queue
from ._common import (
    CliError,
    CliUsageError,
    Seconds,
    console,
    emit_json,
    global_options,
    iso,
    make_queue,
    run_with_queue,
    settings,
    short_time,
)
from ._rich import Text

__all__ = ["resolve", "worker_admin_group"]


@click.group("worker", short_help="List live workers or shut one down.")
@global_options
def worker_admin_group() -> None:
    """The live workers of the namespace (`blitzq worker MODULE:ATTR` runs one)."""


def resolve(args: list[str]) -> tuple[str, click.Command, list[str]] | None:
    """``("worker", this group, args[1:])`` when ``args`` is ``worker list ...`` or
    ``worker shutdown ...``; else ``None`` (the root group resolves as usual)."""
    if len(args) > 1 and args[0] == "worker" and args[1] in worker_admin_group.commands:
        return "worker", worker_admin_group, args[1:]
    return None


def _docs(raw: dict[str, bytes]) -> list[dict[str, Any]]:
    return sorted((worker_document(w, b) for w, b in raw.items()), key=lambda d: str(d["id"]))


def _runs(doc: dict[str, Any]) -> str:
    runs = doc.get("running_tasks") or []
    text = ", ".join(f"{r.get('task')} {str(r.get('id'))[:12]}" for r in runs[:3])
    more = int(doc.get("running") or 0) - min(3, len(runs))
    return text + (f" (+{more})" if more > 0 else "") if text else "-"


@worker_admin_group.command("list")
@global_options
def worker_list() -> None:
    """Live workers: id, host, pid, queues, concurrency, running tasks and which."""
    queue = make_queue()
    docs = _docs(run_with_queue(lambda q: q.broker.workers(), queue))
    if settings().json:
        for d in docs:
            for key in ("started_at", "heartbeat_at"):
                if isinstance(d.get(key), int | float):
                    d[key] = iso(d[key])
            for run in d.get("running_tasks") or []:
                if isinstance(run.get("started_at"), int | float):
                    run["started_at"] = iso(run["started_at"])
        emit_json({"namespace": queue.namespace, "workers": docs})
        return
    out = console()
    if not docs:
        out.print(Text(f"no live worker in namespace {queue.namespace}"))
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("worker", "host", "pid", "queues", "slots", "running", "runs", "as of"):
        table.add_column(header, overflow="fold", no_wrap=header in ("pid", "slots"))
    for d in docs:
        paused = set(d.get("paused") or [])
        queues = ",".join(f"{q} (paused)" if q in paused else str(q) for q in d.get("queues") or [])
        at = d.get("heartbeat_at")
        table.add_row(
            Text(str(d["id"])),
            Text(str(d.get("host", "-"))),
            str(d.get("pid", "-")),
            Text(queues),
            str(d.get("concurrency", "-")),
            str(d.get("running", "-")),
            Text(_runs(d)),
            short_time(at) if isinstance(at, int | float) else "-",
        )
    out.print(table)


@worker_admin_group.command("shutdown")
@click.argument("worker_id", metavar="ID")
@click.option(
    "--timeout",
    type=Seconds(minimum=0.0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for the worker to unregister.",
)
@click.option("--no-wait", is_flag=True, default=False, help="Ask, and return at once.")
@global_options
def worker_shutdown(worker_id: str, timeout: float, no_wait: bool) -> None:
    """Ask the live worker ID (see `blitzq worker list`: its id, `host:pid-slot` under a
    supervisor, or its key) to shut down gracefully, and wait until it has. Exit code 1 when
    no live worker has that id, or it is still registered after --timeout; 2 when ID is
    empty or blank."""
    if not worker_id.strip():
        raise CliUsageError(f"ID must be a worker id (see blitzq worker list), got {worker_id!r}")

    async def live(q: Queue) -> bool:
        return await is_live_worker(q.broker, worker_id)

    async def ask(q: Queue) -> str:
        if not await live(q):
            return "unknown"
        await q.broker.request_shutdown(worker_id)
        if no_wait:
            return "asked"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            if not await live(q):
                return "stopped"
        return "running"

    queue = make_queue()
    outcome = run_with_queue(ask, queue)
    if outcome == "unknown":
        raise CliError(f"no live worker {worker_id} in namespace {queue.namespace}")
    if settings().json:
        emit_json({"worker": worker_id, "outcome": outcome})
    elif outcome == "stopped":
        console().print(Text(f"worker {worker_id} shut down"))
    elif outcome == "asked":
        console().print(Text(f"worker {worker_id} asked to shut down"))
    if outcome == "running":
        raise CliError(f"worker {worker_id} is still registered after {timeout:g} s")
