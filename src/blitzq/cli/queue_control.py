"""``blitzq queue purge | pause | resume QUEUE``: act on a queue of the namespace.

- ``purge`` deletes the messages waiting in a queue (all its priority levels, or the one a
  ``:high`` / ``:low`` name gives); in-flight messages are not touched. Its delayed tasks
  (on the namespace's schedule) stay, and it says how many, unless ``--delayed`` deletes them
  too. It asks first, showing the count, unless ``--yes``.
- ``pause`` stops every worker of the namespace, on any host, from fetching the queue: the
  name goes into the namespace's paused set and a push on its event channel tells the
  workers at once (a worker that missed the push reads the set at its next maintenance
  round). A fetch already in flight hands back, unstarted, what it returns (an idle
  worker's blocking read is ended), and on RabbitMQ each worker cancels its consumers of the
  queue and hands back what they received ahead (``worker/pausing.py``); nothing else is
  taken until ``resume``. Messages keep arriving and wait; delayed ones are still moved to
  the queue when due.

Each refuses a queue nothing has used in the namespace (no producer sent to it, no worker or
scheduler served it, it holds no message and is not paused: a typo, or the wrong
``--namespace``) with :class:`~blitzq.UnknownQueue` (exit 1), changing nothing; ``--force``
acts all the same (``pause --force``: pause a queue before its first task).
"""

from __future__ import annotations

import click

from ..client.admin import check_known_queue
from ..queue import Queue
from ..routing import check_name, check_queue_name, levels
from ._common import (
    EXIT_USAGE,
    cli_errors,
    confirm,
    console,
    emit_json,
    global_options,
    make_queue,
    run_with_queue,
    settings,
)
from ._rich import Text
from .inspect import queue_group

__all__ = ["queue_pause", "queue_purge", "queue_resume"]


def _physical(name: str) -> list[str]:
    """The physical queues of ``name``: its priority levels, or ``name`` itself when it
    names a level (``emails:high``)."""
    with cli_errors(config_exit=EXIT_USAGE):  # the argument: a usage error
        check_name("queue name", name)
    if name.endswith((":high", ":low")):
        return [name]
    return levels(name)


async def _known(q: Queue, name: str, force: bool) -> None:
    """Refuse ``name`` unless the namespace knows it or ``force`` (:func:`check_known_queue`).

    Raises:
        UnknownQueue: nothing has used the queue, and not ``force``.
    """
    if not force:
        await check_known_queue(q.broker, q.namespace, name)


async def _waiting(q: Queue, name: str, physical: list[str], force: bool) -> int:
    await _known(q, name, force)
    stats = await q.stats(physical)
    return sum(int(stats["queues"].get(p, {}).get("waiting", 0)) for p in physical)


async def _delayed(q: Queue, physical: list[str]) -> int:
    """The tasks on the schedule bound for ``physical`` (one read of the schedule)."""
    return await q.broker.scheduled_for(physical)


#: ``--force`` of ``purge``, ``pause`` and ``resume``.
_FORCE_HELP = "Act even on a queue nothing has used yet (by default an unknown queue is refused)."


@queue_group.command("purge", short_help="Delete the messages waiting in a queue.")
@click.argument("name", metavar="QUEUE")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--delayed",
    is_flag=True,
    help="Also delete the queue's delayed tasks (delays, ETAs, retry backoffs on the schedule).",
)
@click.option("--force", is_flag=True, help=_FORCE_HELP)
@global_options
def queue_purge(name: str, yes: bool, delayed: bool, force: bool) -> None:
    """Delete the messages waiting in QUEUE (all its priority levels; QUEUE:high or
    QUEUE:low for one). Messages a worker has taken are not touched. The queue's delayed
    tasks (a delay or ETA not reached, a retry's backoff) wait on the schedule, not in the
    queue: they stay and are published when due, and the output says how many, unless
    --delayed deletes them too. Asks first, unless --yes. Exits 1, deleting nothing, when
    nothing has used QUEUE in the namespace (no producer, worker or scheduler, no message: a
    typo?), unless --force."""
    physical = _physical(name)
    queue = make_queue()
    if not yes:

        async def count(q: Queue) -> tuple[int, int]:
            return await _waiting(q, name, physical, force), await _delayed(q, physical)

        waiting, later = run_with_queue(count, make_queue())
        if waiting == 0 and not (delayed and later):  # nothing to delete
            _purged(name, 0, None if delayed else later, 0)
            return
        also = f" and {later} delayed task(s)" if delayed else ""
        confirm(
            f"Delete {waiting} waiting message(s){also} of queue {name!r} in namespace "
            f"{queue.namespace!r}?"
        )
        force = True  # known: checked above

    async def purge(q: Queue) -> tuple[int, int | None, int, str | None]:
        await _known(q, name, force)
        purged = sum([await q.purge_queue(p) for p in physical])
        note = q.broker.count_note
        if delayed:
            return purged, None, await q.broker.scheduled_for(physical, purge=True), note
        return purged, await _delayed(q, physical), 0, note

    purged, left, deleted, note = run_with_queue(purge, queue)
    _purged(name, purged, left, deleted)
    if note and not settings().json:
        console().print(Text(note, style="dim"))


def _purged(name: str, count: int, left: int | None, deleted: int) -> None:
    """Print a purge's outcome: ``count`` waiting messages deleted, ``deleted`` delayed
    tasks deleted (``--delayed``), or ``left`` of them still on the schedule (``None``:
    ``--delayed`` was given)."""
    if settings().json:
        doc = {"queue": name, "purged": count, "delayed_purged": deleted}
        doc["delayed_left"] = left or 0
        emit_json(doc)
        return
    out = console()
    if left is None:
        out.print(
            Text(f"purged {count} message(s) and {deleted} delayed task(s) from queue {name}")
        )
        return
    out.print(Text(f"purged {count} message(s) from queue {name}"))
    if left:
        out.print(
            Text(
                f"{left} delayed task(s) of queue {name} stay on the schedule and will be "
                "published when due (--delayed deletes them too)"
            )
        )


def _set_paused(name: str, paused: bool, force: bool) -> None:
    with cli_errors(config_exit=EXIT_USAGE):
        check_queue_name("queue name", name)
    queue = make_queue()

    async def change(q: Queue) -> bool:
        await _known(q, name, force)
        return await q.broker.set_paused(name, paused)

    changed = run_with_queue(change, queue)
    word = "paused" if paused else "resumed"
    if settings().json:
        emit_json({"queue": name, "paused": paused, "changed": changed})
    elif changed:
        console().print(Text(f"queue {name} {word} (namespace {queue.namespace})"))
    else:
        console().print(Text(f"queue {name} was already {word} (namespace {queue.namespace})"))


@queue_group.command("pause", short_help="Stop every worker from fetching a queue.")
@click.argument("name", metavar="QUEUE")
@click.option("--force", is_flag=True, help=_FORCE_HELP + " Pauses a queue before its first task.")
@global_options
def queue_pause(name: str, force: bool) -> None:
    """Stop every worker of the namespace, on any host, from fetching QUEUE (all its
    priority levels) until `blitzq queue resume QUEUE`; at once. Running tasks go on; new
    messages wait, and so do those a worker had received ahead (RabbitMQ's prefetch). Exits
    1, changing nothing, when nothing has used QUEUE in the namespace (no producer, worker or
    scheduler, no message: a typo?); --force pauses it all the same (a queue paused before
    its first task)."""
    _set_paused(name, True, force)


@queue_group.command("resume", short_help="Let workers fetch a paused queue again.")
@click.argument("name", metavar="QUEUE")
@click.option("--force", is_flag=True, help=_FORCE_HELP)
@global_options
def queue_resume(name: str, force: bool) -> None:
    """Let the workers fetch QUEUE again (undoes `blitzq queue pause QUEUE`). Exits 1 when
    nothing has used QUEUE in the namespace and it is not paused (a typo?), unless --force.
    Works on a server at its maxmemory."""
    _set_paused(name, False, force)
