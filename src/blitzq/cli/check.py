"""``blitzq check MODULE:ATTR``: the read-only preflight of :mod:`blitzq.preflight`.

Prints one line per check (``--json``: one document) and exits 0 when nothing blocks, 78
when something does (an eviction policy that can evict, a server too old, a replica), 1 when
the server cannot be reached. It writes nothing to the server.
"""

from __future__ import annotations

import asyncio
import contextlib

import click

from ..exceptions import BlitzQError
from ..preflight import Finding, exit_code, preflight
from ..queue import Queue
from ._common import (
    EXIT_CONFIG,
    amqp_of,
    cli_errors,
    console,
    emit_json,
    global_options,
    mask_url,
    settings,
    use_running_server,
)
from ._rich import Text
from .scheduler import _load

__all__ = ["check_command"]

_STYLE = {"ok": "green", "warn": "yellow", "fail": "red"}


@click.command("check", short_help="Preflight: can MODULE:ATTR run against this server?")
@click.argument("app", metavar="MODULE:ATTR")
@global_options
def check_command(app: str) -> None:
    """Check, read-only, the server and namespace the blitzq.Queue at MODULE:ATTR uses:
    connectivity, server version, eviction policy, persistence (AOF/RDB), queues no live
    worker consumes, and whether a scheduler dispatches the periodic entries.

    Exit codes: 0 nothing blocking (warnings may be printed), 78 a blocking problem, 1 the
    server cannot be reached. Without a broker URL it checks the running embedded server
    and never starts one.
    """
    queue = _load(app)
    use_running_server(queue)

    async def run(q: Queue) -> list[Finding]:
        try:
            return await preflight(q)
        finally:
            with contextlib.suppress(BlitzQError):
                await q.close()

    with cli_errors(queue._redis_url or settings().redis_url, config_exit=EXIT_CONFIG):
        findings = asyncio.run(run(queue))
    code = exit_code(findings)
    if settings().json:
        emit_json(
            {
                "ok": code == 0,
                "exit_code": code,
                "namespace": queue.namespace,
                "broker": mask_url(queue.url),
                "amqp": amqp_of(queue),
                "checks": [f.to_dict() for f in findings],
            }
        )
    else:
        out = console()
        amqp = amqp_of(queue)
        where = mask_url(queue.url) + (f" with RabbitMQ {amqp}" if amqp else "")
        out.print(Text(f"blitzq check {queue.namespace} at {where}", "bold"))
        for f in findings:
            line = Text(f"{f.status.upper():>4}  ", style=_STYLE[f.status])
            line.append(f"{f.name}: ", style="bold")
            line.append(f.detail)
            out.print(line)
        verdict = {0: "ok", 1: "unreachable", 78: "blocking problem(s)"}[code]
        out.print(Text(verdict, style="bold " + ("green" if code == 0 else "red")))
    if code:
        raise click.exceptions.Exit(code)
