"""What every ``blitzq`` command shares: global options, errors, the Queue, and output."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from .. import config
from .._checks import LOG_LEVELS
from ..exceptions import (
    BlitzQError,
    BrokerError,
    BrokerRefusedSettings,
    ConfigurationError,
    EmbeddedServerNotFound,
    SerializationError,
)
from ..limits import MAX_SECONDS
from ..redaction import mask_url as mask_url  # re-exported to the commands
from ..redaction import redact
from ._output import console as console  # re-exported to the commands, as below
from ._output import emit_json as emit_json
from ._output import iso as iso
from ._output import printable as printable
from ._output import short_time as short_time

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: Exit code of a failed operation (no such record, broker unreachable, …).
EXIT_FAILURE = 1
#: Exit code of a usage error: a command line that is wrong (click uses 2 for bad arguments).
EXIT_USAGE = 2
#: Exit code of a configuration error, by every command (``EX_CONFIG`` of sysexits.h:
#: systemd's ``RestartPreventExitStatus=78`` stops restarting on it): an application that
#: does not load, an invalid setting of the application's Queue or of its environment
#: variables or project file.
EXIT_CONFIG = 78


if TYPE_CHECKING:
    from ..queue import Queue

if TYPE_CHECKING:  # click >= 8.2 types ParamType as a generic; 8.1 cannot subscript it
    _FloatParam = click.ParamType[float, Any]
else:
    _FloatParam = click.ParamType


class Seconds(_FloatParam):
    """A click parameter of seconds: a finite number in ``[minimum, maximum]``.

    ``click.FloatRange`` lets ``nan`` and ``inf`` through (Python's ``float()`` parses them);
    this type refuses them with a usage error (exit code 2), so every duration stays bounded.

    Args:
        minimum: smallest value allowed (seconds).
        maximum: largest value allowed (seconds; default ten years).
    """

    name = "seconds"

    def __init__(self, minimum: float = 0.0, maximum: float = MAX_SECONDS) -> None:
        self.minimum = minimum
        self.maximum = maximum

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        """Parse ``value``; fail (usage error) unless it is a finite number in range."""
        if isinstance(value, float) and math.isfinite(value):
            number = value
        else:
            try:
                number = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number) or not self.minimum <= number <= self.maximum:
            self.fail(
                f"{value!r} is not a finite number of seconds in the range "
                f"{self.minimum:g} to {self.maximum:g}",
                param,
                ctx,
            )
        return number


class CliError(click.ClickException):
    """A failed operation reported at the edge: one red ``Error: …`` line on stderr, exit 1;
    under ``--json`` also ``{"error": message, "exit_code": n}`` on stdout, so a script
    reading stdout always gets one JSON document.

    Args:
        message: what went wrong (its first line is shown in red, the rest below it); a URL
            in it is shown with its passwords masked (:func:`~blitzq.redaction.redact`), as
            are the secrets of the broker URLs of the command's settings.
    """

    exit_code = EXIT_FAILURE

    def __init__(self, message: str) -> None:
        super().__init__(redact_cli(message))
        ctx = click.get_current_context(silent=True)  # the command's: show() runs after it
        found = ctx.find_object(Settings) if ctx is not None else None
        self.as_json = found is not None and found.json

    def show(self, file: IO[Any] | None = None) -> None:
        """Print the message to stderr (``file`` overrides), and the JSON document."""
        if self.as_json:
            emit_json({"error": self.format_message(), "exit_code": self.exit_code})
        first, _, rest = printable(self.format_message()).partition("\n")
        click.secho(f"Error: {first}", file=file, err=True, fg="red")
        if rest:
            click.echo(rest, file=file, err=True)


def confirm(question: str) -> None:
    """Ask ``question`` (y/N) on stderr before a destructive step; go on only on a yes.

    Raises:
        CliError: not confirmed (a no, the end of the input, Ctrl-C): exit 1, and under
            ``--json`` the error's JSON document on stdout, as for every failure.
    """
    try:
        confirmed = click.confirm(question, default=False, err=True)
    except click.Abort:  # end of input (no terminal), Ctrl-C
        confirmed = False
    if not confirmed:
        raise CliError("not confirmed: nothing was changed (--yes skips the question)")


class CliUsageError(CliError):
    """A usage or configuration error (bad MODULE:ATTR, invalid setting): exit code 2."""

    exit_code = EXIT_USAGE


class CliConfigError(CliUsageError):
    """A configuration error of a long-running command (an application that cannot be
    loaded, an invalid setting, a server it refuses to run on): exit code 78 (``EX_CONFIG``),
    which a supervisor or systemd does not restart."""

    exit_code = EXIT_CONFIG


def redact_cli(text: str) -> str:
    """``text`` with every URL masked and every secret of the running command's broker URLs
    (typed, from the environment or the project file) removed: what the CLI prints of an
    error goes through here (:func:`~blitzq.redaction.redact`)."""
    ctx = click.get_current_context(silent=True)
    found = ctx.find_object(Settings) if ctx is not None else None
    urls = [found.redis_url, found.amqp_url] if found is not None else []
    for name in ("BLITZQ_REDIS_URL", "BLITZQ_AMQP_URL"):
        urls.append(os.environ.get(name))
    return redact(text, *urls)


@dataclass
class Settings:
    """The global options, merged over the group and the command.

    An option typed on the command line (before or after the subcommand) wins over one that
    came from an environment variable.
    """

    redis_url: str | None = field(default=None, repr=False)  # may hold a password
    amqp_url: str | None = field(default=None, repr=False)
    namespace: str | None = None
    mode: str | None = None
    json: bool = False
    from_command_line: set[str] = field(default_factory=set)
    #: ``blitzq config show`` runs: an invalid global option is recorded, not refused.
    lenient: bool = False
    #: the invalid global options seen when lenient: name -> the error naming its origin.
    invalid: dict[str, str] = field(default_factory=dict)


class _SettingChoice(click.Choice):  # type: ignore[type-arg]
    """``click.Choice`` that, under ``config show`` (:attr:`Settings.lenient`), records an
    invalid value in :attr:`Settings.invalid` instead of refusing to run."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            found = ctx.find_object(Settings) if ctx is not None else None
            if found is None or not found.lenient or param is None or not param.name:
                raise
            found.invalid[param.name] = f"{value!r}: {exc.message}"
            return None


def _store(ctx: click.Context, param: click.Parameter, value: Any) -> None:
    settings = ctx.ensure_object(Settings)
    name = param.name
    if name is None or value is None or value is False:
        return
    if value == "":
        if settings.lenient:
            settings.invalid[name] = "'': must not be empty"
            return
        raise click.BadParameter(
            "must not be empty (leave the option out for the default)", ctx=ctx, param=param
        )
    if name == "redis_url" and str(value).startswith("memory://"):
        raise click.BadParameter(
            f"{mask_url(str(value))!r}: a memory:// server is private to the one process that "
            "starts it, so a command (or worker) would run against an empty server nobody else "
            "can reach; leave --redis-url out to use the embedded server, or give a redis:// URL",
            ctx=ctx,
            param=param,
        )
    if not settings.lenient:
        # A bad value typed on the command line is a usage error (2); one from a variable or
        # the project file a configuration error (78): ConfiguredGroup tells them apart.
        # Imported here: `import blitzq.cli` and --help load no broker (issue 29).
        from ..broker.factory import check_amqp_url, check_url, resolve_url
        from ..routing import check_namespace

        try:
            if name == "namespace":
                check_namespace(str(value))
            elif name == "amqp_url":
                check_amqp_url(str(value))
            elif name == "redis_url":
                check_url(str(value), memory=False)  # memory:// refused above
                resolve_url(str(value))
        except ConfigurationError as exc:
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
    typed = ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    if name in settings.from_command_line and not typed:
        return
    setattr(settings, name, value)
    if typed:
        settings.from_command_line.add(name)


def global_options(fn: F) -> F:
    """Decorate a command or group with ``--redis-url``, ``--amqp-url``, ``--namespace``,
    ``--mode``, ``--json``."""
    options = [
        click.option(
            "--redis-url",
            envvar="BLITZQ_REDIS_URL",
            show_envvar=True,
            expose_value=False,
            callback=_store,
            metavar="URL",
            help=(
                "Broker URL (redis://, rediss://, unix://, valkey://, valkeys://, "
                "redis+cluster://, rediss+cluster://, redis+sentinel://). "
                "Default: the embedded server."
            ),
        ),
        click.option(
            "--amqp-url",
            envvar="BLITZQ_AMQP_URL",
            show_envvar=True,
            expose_value=False,
            callback=_store,
            metavar="URL",
            help=(
                "RabbitMQ URL (amqp://, amqps://): messages travel through RabbitMQ, state "
                "stays on the Redis broker. Default: none."
            ),
        ),
        click.option(
            "--namespace",
            envvar="BLITZQ_NAMESPACE",
            show_envvar=True,
            expose_value=False,
            callback=_store,
            help="Key namespace of the application. Default: blitzq.",
        ),
        click.option(
            "--mode",
            type=_SettingChoice(["reliable", "fast"]),
            envvar="BLITZQ_MODE",
            show_envvar=True,
            expose_value=False,
            callback=_store,
            help="Queue mode the application uses. Default: reliable.",
        ),
        click.option(
            "--json",
            "json",
            is_flag=True,
            default=False,
            expose_value=False,
            callback=_store,
            help="Print one JSON document on stdout instead of tables.",
        ),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def json_option(fn: F) -> F:
    """Decorate a command or group with ``--json`` alone: for the commands the broker options
    do not apply to (``blitzq server ...``: they manage the embedded server of a data
    directory, whatever URL, namespace or mode the application uses)."""
    return click.option(
        "--json",
        "json",
        is_flag=True,
        default=False,
        expose_value=False,
        callback=_store,
        help="Print one JSON document on stdout instead of tables.",
    )(fn)


def settings() -> Settings:
    """The merged global options of the running command."""
    return click.get_current_context().ensure_object(Settings)


# ----------------------------------------------------------------- errors
def _where(url: str | None, exc: BrokerError) -> str:
    """The server a broker error is about: RabbitMQ's URL for the RabbitMQ transport's
    errors (their message starts with "RabbitMQ"), else the Redis one."""
    if str(exc).startswith("RabbitMQ"):
        ctx = click.get_current_context(silent=True)
        typed = ctx.find_object(Settings) if ctx is not None else None
        amqp_url = (typed.amqp_url if typed else None) or config.value("amqp_url")
        return mask_url(amqp_url) if amqp_url else "RabbitMQ"
    url = url or config.value("redis_url")
    return mask_url(url) if url else "the embedded server"


def amqp_of(queue: Queue) -> str | None:
    """The RabbitMQ URL (password masked) of ``queue``'s broker, or ``None`` when its
    messages travel through Redis."""
    if queue._shared_broker is not None:  # a ready broker: its own transport, if any
        link = getattr(queue._shared_broker.transport, "link", None)
        url = getattr(link, "url", None)
        return mask_url(url) if isinstance(url, str) else None
    url = queue._amqp_url or config.value("amqp_url")
    return mask_url(url) if url else None


@contextlib.contextmanager
def cli_errors(url: str | None = None, *, config_exit: int = EXIT_CONFIG) -> Iterator[None]:
    """Turn blitzq errors raised inside into :class:`CliError` (no traceback).

    Args:
        url: the broker URL in use, named (password masked) in broker errors.
        config_exit: exit code of a :class:`~blitzq.exceptions.ConfigurationError`:
            :data:`EXIT_CONFIG` (78) where settings are loaded and applied (the Queue built
            from the global options, the application's, the logging set-up), or
            :data:`EXIT_USAGE` (2) around an operation whose arguments the command line gave
            (a bad task id or queue name is a usage error). Broker (connection) errors exit 1;
            a broker's refusal of the URL's settings
            (:class:`~blitzq.exceptions.BrokerRefusedSettings`) exits 78 wherever it comes.
    """
    try:
        yield
    except ConfigurationError as exc:
        if config_exit == EXIT_CONFIG or isinstance(exc, BrokerRefusedSettings):
            raise CliConfigError(str(exc)) from None
        raise CliUsageError(str(exc)) from None
    except EmbeddedServerNotFound as exc:
        raise CliError(str(exc)) from None
    except BrokerError as exc:
        raise CliError(f"broker error ({_where(url, exc)}): {exc}") from None
    except BlitzQError as exc:
        raise CliError(str(exc)) from None


def task_id_argument(value: str) -> str:
    """``value``, a TASK_ID given on the command line, once it passes the rule of task ids
    (:func:`~blitzq.routing.check_task_id`, the rule enqueue applies to ``task_id``): checked
    before any broker is reached.

    Raises:
        CliUsageError: empty, too long, holding a space, brace, newline or NUL, or not UTF-8
            (exit 2).
    """
    from ..routing import check_task_id  # here: `import blitzq.cli` loads no broker

    try:
        return check_task_id("TASK_ID", value)
    except (ConfigurationError, SerializationError) as exc:
        raise CliUsageError(str(exc)) from None


def running_server_url() -> str:
    """The URL of the running embedded server, for a command given no broker URL.

    Only workers and producers (``blitzq worker``, ``blitzq scheduler run``, ``blitzq server
    start``, a Queue in your code) start the embedded server; read-only and admin commands
    use the one running for ``$BLITZQ_DATA_DIR``, else for the nearest ``.blitzq`` directory
    in the current directory or its parents (see :func:`~blitzq.broker.redis.embedded.find_server`).

    Raises:
        CliError: no such server runs (exit 1), or its directory or socket is another user's
            (exit 78).
    """
    from ..broker.redis.embedded import find_server

    with cli_errors():
        return find_server()


def make_queue() -> Queue:
    """A Queue built from the global options (environment variables fill the gaps).

    Without a broker URL it uses the running embedded server and never starts one
    (:func:`running_server_url`).

    Raises:
        CliError: an invalid setting (exit code 78), or no URL and no running server (1).
    """
    from ..queue import Queue  # here: `import blitzq.cli` and --help load no queue (issue 29)

    s = settings()
    url = s.redis_url or config.value("redis_url") or running_server_url()
    with cli_errors(url):
        return Queue(
            redis_url=url,
            namespace=s.namespace,
            mode=s.mode,  # type: ignore[arg-type]
            amqp_url=s.amqp_url,
        )


def use_running_server(queue: Queue) -> None:
    """Point an application's ``queue`` that has no broker URL at the running embedded server,
    so that a read-only command (``scheduler list``) does not start one.

    Raises:
        CliError: no URL and no running embedded server (see :func:`running_server_url`).
    """
    if queue._shared_broker is None and not (queue._redis_url or config.value("redis_url")):
        queue._connect_to(running_server_url())


def run_with_queue(fn: Callable[[Queue], Awaitable[T]], queue: Queue | None = None) -> T:
    """Run ``fn(queue)`` on a fresh event loop, close the connections, translate errors.

    Args:
        fn: the async operation.
        queue: the Queue to use (default: :func:`make_queue`).

    Raises:
        CliError: a blitzq error happened (broker unreachable, bad configuration, …).
    """
    queue = queue or make_queue()

    async def runner() -> T:
        try:
            return await fn(queue)
        finally:
            with contextlib.suppress(BlitzQError):
                await queue.close()

    import asyncio

    with cli_errors(settings().redis_url, config_exit=EXIT_USAGE):  # the arguments' checks
        return asyncio.run(runner())


def log_options(command: F) -> F:
    """Add ``--log-level`` and ``--log-format`` (env ``BLITZQ_LOG_LEVEL`` / ``_FORMAT``)."""
    command = click.option(
        "--log-format",
        type=click.Choice(["text", "json"]),
        default="text",
        show_default=True,
        envvar="BLITZQ_LOG_FORMAT",
        show_envvar=True,
        help="Logs on stderr as text or JSON lines.",
    )(command)
    return click.option(
        "--log-level",
        type=click.Choice(list(LOG_LEVELS), case_sensitive=False),
        default="info",
        show_default=True,
        help="Least severe log records shown.",
        envvar="BLITZQ_LOG_LEVEL",
        show_envvar=True,
    )(command)
