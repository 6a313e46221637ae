"""``blitzq dashboard MODULE:ATTR``: serve the web dashboard of an application's Queue.

Without credentials it listens on a loopback address only and asks for none; with
``BLITZQ_DASHBOARD_USER`` and ``BLITZQ_DASHBOARD_PASSWORD`` set it requires HTTP basic auth
and may listen on any address. Needs the ``dashboard`` extra (starlette, uvicorn).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import TYPE_CHECKING

import click

from .._checks import is_loopback
from ..exceptions import BlitzQError
from ..logconfig import configure_logging
from ..worker.ports import bind_port
from ._common import (
    CliConfigError,
    CliUsageError,
    cli_errors,
    global_options,
    log_options,
    mask_url,
    settings,
    use_running_server,
)
from .worker import _export_settings, _override, load_queue

if TYPE_CHECKING:
    from ..queue import Queue

__all__ = ["PASSWORD_ENV", "USER_ENV", "credentials", "dashboard_command"]

#: Connections the dashboard's socket queues before they are accepted (uvicorn's default).
BACKLOG = 2048

USER_ENV = "BLITZQ_DASHBOARD_USER"
PASSWORD_ENV = "BLITZQ_DASHBOARD_PASSWORD"


def credentials() -> tuple[str, str] | None:
    """``(user, password)`` from the environment, or ``None`` when neither is set.

    Raises:
        CliConfigError: only one of the two is set, or one is empty (exit 78).
    """
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if user is None and password is None:
        return None
    if not user or not password:
        raise CliConfigError(f"set both {USER_ENV} and {PASSWORD_ENV} (non-empty), or neither")
    return user, password


async def _check_broker(queue: Queue) -> None:
    """Ping ``queue``'s broker once, then close that connection (uvicorn's loop opens its own).

    Raises:
        BrokerError: the broker cannot be reached or refuses the credentials.
        ConfigurationError: the broker URL is invalid.
    """
    try:
        await queue.broker.ping()
    finally:
        with contextlib.suppress(BlitzQError):
            await queue.close()


@click.command("dashboard", short_help="Serve the web dashboard of MODULE:ATTR.")
@click.argument("app", metavar="MODULE:ATTR")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; a non-loopback one needs the credentials below.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="TCP port to listen on.",
)
@log_options
@global_options
def dashboard_command(app: str, host: str, port: int, log_level: str, log_format: str) -> None:
    """Serve the dashboard of the blitzq.Queue at MODULE:ATTR until SIGTERM/SIGINT.

    Pages: queues, tasks, dead letters (replay, purge), workers, periodic entries; a JSON
    API under /api. With BLITZQ_DASHBOARD_USER and BLITZQ_DASHBOARD_PASSWORD set, every
    request needs HTTP basic auth with them and --host may be any address; without them the
    dashboard asks for nothing and --host must be a loopback address (127.0.0.1, ::1,
    localhost). Without a broker URL it uses the running embedded server. The address is
    bound before the banner is printed: one that cannot be bound (a port in use) exits 78
    with one line.
    """
    creds = credentials()
    if creds is None and not is_loopback(host):
        raise CliUsageError(
            f"--host {host} is reachable from other machines and the dashboard has no "
            f"credentials: set {USER_ENV} and {PASSWORD_ENV} (HTTP basic auth), or listen "
            "on 127.0.0.1"
        )
    try:
        import uvicorn

        from ..dashboard import create_app
    except ImportError as exc:
        # An installation that lacks a dependency is not a bad command line: 78, which a
        # supervisor does not restart, as for any configuration error.
        raise CliConfigError(
            f"the dashboard needs the 'dashboard' extra, not installed ({exc}): install it "
            "with pip install -e '.[dashboard]' in blitzq's checkout, or "
            "pip install 'dist/blitzq-<version>-py3-none-any.whl[dashboard]' from a wheel "
            "(never from PyPI: its 'blitzq' is another project)"
        ) from None
    s = settings()
    with cli_errors(s.redis_url):
        configure_logging(log_level, "json" if log_format == "json" else "text")
    _export_settings(s)
    queue = load_queue(app)
    _override(queue, s)
    use_running_server(queue)
    with cli_errors(queue._redis_url or s.redis_url):
        asyncio.run(_check_broker(queue))
    # Bound before the banner: a port in use is one line and exit 78, never a banner first.
    with cli_errors():
        sock = bind_port(host, port, "the dashboard")
    with sock:
        sock.listen(BACKLOG)  # connections from now on wait for uvicorn, never refused
        bound = sock.getsockname()[1]  # port 0: the one the system chose
        where = f"http://{'[' + host + ']' if ':' in host else host}:{bound}/"
        click.echo(
            click.style("blitzq dashboard", bold=True)
            + f" {where} namespace={queue.namespace} broker={mask_url(queue.url)}"
            + (" (basic auth)" if creds else " (no auth: loopback only)"),
            err=True,
        )
        config = uvicorn.Config(
            create_app(queue, basic_auth=creds, loopback_only=creds is None),
            host=host,
            port=bound,
            log_level=log_level.lower(),
            access_log=log_level.lower() == "debug",
            backlog=BACKLOG,
        )
        server = uvicorn.Server(config)
        with cli_errors(queue._redis_url or s.redis_url):
            server.run(sockets=[sock])
    if not server.started:  # as uvicorn.run: the application's startup failed (logged)
        raise SystemExit(3)
