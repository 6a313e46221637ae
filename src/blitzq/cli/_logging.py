"""The logging options of ``blitzq worker`` beyond its level and format: a dictConfig file,
per-logger levels, the size of the log queue and the bound of its drain at exit
(docs/operations.md, "Logs"). A supervisor passes them on to every worker it starts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypedDict, TypeVar

import click

from ..logcontext import DEFAULT_LOG_DRAIN_TIMEOUT, DEFAULT_LOG_QUEUE_SIZE
from ._common import Seconds

F = TypeVar("F", bound=Callable[..., Any])


def logging_options(command: F) -> F:
    """Add ``--log-config``, ``--logger-level``, ``--log-queue-size`` and
    ``--log-drain-timeout`` to a click command; they reach it in its ``**`` keyword
    arguments (:func:`logging_settings`)."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


_OPTIONS = [
    click.option(
        "--log-config",
        type=click.Path(exists=True, dir_okay=False, readable=True),
        default=None,
        envvar="BLITZQ_LOG_CONFIG",
        show_envvar=True,
        metavar="FILE",
        help="A logging.config.dictConfig document (JSON, or YAML with PyYAML) used instead "
        "of blitzq's stderr handler; --log-level and --log-format then do nothing.",
    ),
    click.option(
        "--logger-level",
        multiple=True,
        metavar="NAME=LEVEL",
        help="Set one logger's level (repeatable), e.g. --logger-level aio_pika=WARNING.",
    ),
    click.option(
        "--log-queue-size",
        type=click.IntRange(min=10),
        default=DEFAULT_LOG_QUEUE_SIZE,
        show_default=True,
        envvar="BLITZQ_LOG_QUEUE_SIZE",
        show_envvar=True,
        metavar="N",
        help="Records the non-blocking log queue holds; when full, records below WARNING are "
        "dropped first (WARNING and above keep a 10% reserve), counted in "
        "blitzq_log_records_dropped_total.",
    ),
    click.option(
        "--log-drain-timeout",
        type=Seconds(minimum=0.0),
        default=DEFAULT_LOG_DRAIN_TIMEOUT,
        show_default=True,
        envvar="BLITZQ_LOG_DRAIN_TIMEOUT",
        show_envvar=True,
        metavar="SECONDS",
        help="At exit, wait at most this long for the log queue to be written.",
    ),
]


class LoggingSettings(TypedDict):
    """The keyword arguments of :func:`~blitzq.logconfig.configure_logging` these options
    give."""

    config_file: str | None
    logger_levels: tuple[str, ...]
    queue_size: int
    drain_timeout: float


def logging_settings(options: Mapping[str, Any]) -> LoggingSettings:
    """The logging settings in the command's keyword arguments ``options`` (their defaults
    when absent)."""
    config = options.get("log_config")
    return LoggingSettings(
        config_file=str(config) if config else None,
        logger_levels=tuple(options.get("logger_level") or ()),
        queue_size=int(options.get("log_queue_size") or DEFAULT_LOG_QUEUE_SIZE),
        drain_timeout=float(
            DEFAULT_LOG_DRAIN_TIMEOUT
            if options.get("log_drain_timeout") is None
            else options["log_drain_timeout"]
        ),
    )


def logging_argv(options: Mapping[str, Any]) -> list[str]:
    """The same settings as command-line options, for the workers a supervisor starts."""
    settings = logging_settings(options)
    argv = [
        "--log-queue-size",
        str(settings["queue_size"]),
        "--log-drain-timeout",
        repr(settings["drain_timeout"]),
    ]
    if settings["config_file"] is not None:
        argv += ["--log-config", settings["config_file"]]
    for item in settings["logger_levels"]:
        argv += ["--logger-level", item]
    return argv


__all__ = ["LoggingSettings", "logging_argv", "logging_options", "logging_settings"]
