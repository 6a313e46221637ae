"""``blitzq queue purge | pause | resume QUEUE``: act on a queue of the namespace.

- ``purge`` deletes the messages waiting in a queue (all its priority levels, or the one a
  ``:high`` / ``:low`` name gives); in-flight messages are not touched. It asks first,
  showing the count, unless ``--yes``.
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
from rich.text import Text

from ..client.admin import check_known_queue
from ..queue import Queue
from ..routing import check_name, check_queue_name, levels
from ._common import (
    EXIT_USAGE,
    cli_errors,
    console,
    emit_json,
    global_options,
    make_queue,
    run_with_queue,
    settings,
)
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


#: ``--force`` of ``purge``, ``pause`` and ``resume``.
_FORCE_HELP = "Act even on a queue nothing has used yet (by default an unknown queue is refused)."


@queue_group.command("purge", short_help="Delete the messages waiting in a queue.")
@click.argument("name", metavar="QUEUE")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True, help=_FORCE_HELP)
@global_options
def queue_purge(name: str, yes: bool, force: bool) -> None:
    """Delete the messages waiting in QUEUE (all its priority levels; QUEUE:high or
    QUEUE:low for one). Messages a worker has taken are not touched. Asks first, unless
    --yes. Exits 1, deleting nothing, when nothing has used QUEUE in the namespace (no
    producer, worker or scheduler, no message: a typo?), unless --force."""
    physical = _physical(name)
    queue = make_queue()
    if not yes:
        count = run_with_queue(lambda q: _waiting(q, name, physical, force), make_queue())
        if count == 0:
            _purged(name, 0)
            return
        click.confirm(
            f"Delete {count} waiting message(s) of queue {name!r} in namespace "
            f"{queue.namespace!r}?",
            abort=True,
            err=True,
        )
        force = True  # known: checked above

    async def purge(q: Queue) -> int:
        await _known(q, name, force)
        return sum([await q.purge_queue(p) for p in physical])

    _purged(name, run_with_queue(purge, queue))


def _purged(name: str, count: int) -> None:
    if settings().json:
        emit_json({"queue": name, "purged": count})
    else:
        console().print(Text(f"purged {count} message(s) from queue {name}"))


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
