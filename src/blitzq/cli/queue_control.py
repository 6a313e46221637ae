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
"""

from __future__ import annotations

import click
from rich.text import Text

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


async def _waiting(q: Queue, physical: list[str]) -> int:
    stats = await q.stats(physical)
    return sum(int(stats["queues"].get(p, {}).get("waiting", 0)) for p in physical)


@queue_group.command("purge", short_help="Delete the messages waiting in a queue.")
@click.argument("name", metavar="QUEUE")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@global_options
def queue_purge(name: str, yes: bool) -> None:
    """Delete the messages waiting in QUEUE (all its priority levels; QUEUE:high or
    QUEUE:low for one). Messages a worker has taken are not touched. Asks first, unless
    --yes."""
    physical = _physical(name)
    queue = make_queue()
    if not yes:
        count = run_with_queue(lambda q: _waiting(q, physical), make_queue())
        if count == 0:
            _purged(name, 0)
            return
        click.confirm(
            f"Delete {count} waiting message(s) of queue {name!r} in namespace "
            f"{queue.namespace!r}?",
            abort=True,
            err=True,
        )

    async def purge(q: Queue) -> int:
        return sum([await q.purge_queue(p) for p in physical])

    _purged(name, run_with_queue(purge, queue))


def _purged(name: str, count: int) -> None:
    if settings().json:
        emit_json({"queue": name, "purged": count})
    else:
        console().print(Text(f"purged {count} message(s) from queue {name}"))


def _set_paused(name: str, paused: bool) -> None:
    with cli_errors(config_exit=EXIT_USAGE):
        check_queue_name("queue name", name)
    queue = make_queue()
    changed = run_with_queue(lambda q: q.broker.set_paused(name, paused), queue)
    word = "paused" if paused else "resumed"
    if settings().json:
        emit_json({"queue": name, "paused": paused, "changed": changed})
    elif changed:
        console().print(Text(f"queue {name} {word} (namespace {queue.namespace})"))
    else:
        console().print(Text(f"queue {name} was already {word} (namespace {queue.namespace})"))


@queue_group.command("pause", short_help="Stop every worker from fetching a queue.")
@click.argument("name", metavar="QUEUE")
@global_options
def queue_pause(name: str) -> None:
    """Stop every worker of the namespace, on any host, from fetching QUEUE (all its
    priority levels) until `blitzq queue resume QUEUE`; at once. Running tasks go on; new
    messages wait, and so do those a worker had received ahead (RabbitMQ's prefetch)."""
    _set_paused(name, True)


@queue_group.command("resume", short_help="Let workers fetch a paused queue again.")
@click.argument("name", metavar="QUEUE")
@global_options
def queue_resume(name: str) -> None:
    """Let the workers fetch QUEUE again (undoes `blitzq queue pause QUEUE`)."""
    _set_paused(name, False)
