"""Logging setup for the ``blitzq`` command line.

The library itself never configures logging: it only logs under ``blitzq.*`` loggers and
leaves handlers to the application. The CLI calls :func:`configure_logging` once, so that a
worker started from a shell prints its logs (and those of the user's tasks) to stderr, either as
text for people or as one JSON object per line for log collectors.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from .exceptions import ConfigurationError
from .logcontext import (
    DEFAULT_LOG_DRAIN_TIMEOUT,
    DEFAULT_LOG_QUEUE_SIZE,
    NonBlockingHandler,
    TaskContextFilter,
)
from .redaction import redact

__all__ = ["LEVELS", "JsonFormatter", "TextFormatter", "configure_logging"]

#: Level names accepted by :func:`configure_logging` (case-insensitive).
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
    | {"message", "asctime", "taskName"}
)
_MARK = "_blitzq_cli_handler"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and k[0] != "_"}


def _iso(created: float) -> str:
    return datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value…``, with the traceback below when there is one;
    the passwords of any URL in it masked (:func:`~blitzq.redaction.redact`)."""

    def format(self, record: logging.LogRecord) -> str:
        """Render one record as a line of text (plus a traceback, if any)."""
        return redact(self._line(record))

    def _line(self, record: logging.LogRecord) -> str:
        line = f"{_iso(record.created)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        extras = _extras(record)
        if extras:
            line += " " + " ".join(
                f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in extras.items()
            )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:
            line += "\n" + record.exc_text
        if record.stack_info:
            line += "\n" + self.formatStack(record.stack_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time``, ``level``, ``logger``, ``message``, the ``extra``
    fields, and ``exc_info`` (the formatted traceback) when an exception is attached; the
    passwords of any URL in it masked (:func:`~blitzq.redaction.redact`)."""

    def format(self, record: logging.LogRecord) -> str:
        """Render one record as a single-line JSON object."""
        return redact(self._line(record))

    def _line(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in _extras(record).items():
            doc.setdefault(key, value)
        if record.exc_info:
            doc["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc_info"] = record.exc_text
        if record.stack_info:
            doc["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A StreamHandler that writes to whatever ``sys.stderr`` is at emit time."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_logging(
    level: str,
    fmt: Literal["text", "json"],
    *,
    config_file: str | None = None,
    logger_levels: Sequence[str] = (),
    queue_size: int = DEFAULT_LOG_QUEUE_SIZE,
    drain_timeout: float = DEFAULT_LOG_DRAIN_TIMEOUT,
) -> None:
    """Send log records of ``level`` and above to stderr, as text or JSON lines.

    Installs one handler on the root logger (so the user's task loggers print too) and
    replaces the handler a previous call installed, so calling it twice does not duplicate
    lines. Meant for the CLI; libraries and applications configure logging themselves.

    The handler is a :class:`~blitzq.logcontext.NonBlockingHandler` (a ``QueueHandler``: a
    listener thread writes to stderr, so a slow stderr never blocks the caller; its queue is
    bounded and drops records below WARNING first when full) with a
    :class:`~blitzq.logcontext.TaskContextFilter`: records emitted while a task runs carry
    ``task_id``, ``task``, ``queue``, ``attempt``, ``worker_id`` (and ``workflow_id``),
    shown as fields.

    Args:
        level: a level name, case-insensitive: debug, info, warning, error or critical.
        fmt: ``"text"`` (``time level logger: message key=value``) or ``"json"`` (one object
            per line with time, level, logger, message and any ``extra`` fields).
        config_file: a :func:`logging.config.dictConfig` document, JSON (``.json``) or YAML
            (``.yaml``/``.yml``, needs PyYAML), used instead of blitzq's stderr handler
            (``--log-config``); ``level`` and ``fmt`` then do nothing.
        logger_levels: ``"NAME=LEVEL"`` items setting one logger's level each
            (``--logger-level aio_pika=WARNING``), applied last.
        queue_size: records the handler's queue holds (``--log-queue-size``, >= 10).
        drain_timeout: seconds the handler's close waits to write what is queued
            (``--log-drain-timeout``).

    Raises:
        ConfigurationError: an unknown level or format, a ``logger_levels`` item that is not
            ``NAME=LEVEL``, a ``config_file`` that cannot be read or that dictConfig
            refuses, a ``queue_size`` or ``drain_timeout`` out of range.
    """
    name = _level(level, "log level")
    named = [_logger_level(item) for item in logger_levels]
    root = logging.getLogger()
    if config_file is not None:
        _apply_config_file(config_file)
    else:
        formatter: logging.Formatter
        if fmt == "text":
            formatter = TextFormatter()
        elif fmt == "json":
            formatter = JsonFormatter()
        else:
            raise ConfigurationError(f"log format must be 'text' or 'json', got {fmt!r}")
        stderr = _StderrHandler()
        stderr.setFormatter(formatter)
        # Written by a listener thread (a slow stderr never stalls the event loop); the task
        # fields are added in the emitting thread, where the task's context is.
        handler = NonBlockingHandler(stderr, queue_size=queue_size, drain_timeout=drain_timeout)
        handler.addFilter(TaskContextFilter())
        setattr(handler, _MARK, True)
        for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
            root.removeHandler(old)
            old.close()
        root.addHandler(handler)
        root.setLevel(getattr(logging, name))
    for logger_name, logger_level in named:
        logging.getLogger(logger_name).setLevel(logger_level)


def _level(level: object, what: str) -> str:
    """``level``'s upper-case name, checked.

    Raises:
        ConfigurationError: not one of :data:`LEVELS` (any case).
    """
    name = level.upper() if isinstance(level, str) else ""
    if name not in LEVELS:
        raise ConfigurationError(
            f"{what} must be one of {', '.join(n.lower() for n in LEVELS)}, got {level!r}"
        )
    return name


def _logger_level(item: str) -> tuple[str, int]:
    """``("aio_pika", logging.WARNING)`` from ``"aio_pika=WARNING"``.

    Raises:
        ConfigurationError: not ``NAME=LEVEL`` with a known level.
    """
    logger_name, sep, level = str(item).partition("=")
    logger_name = logger_name.strip()
    if not sep or not logger_name:
        raise ConfigurationError(f"--logger-level takes NAME=LEVEL, got {item!r}")
    return logger_name, getattr(logging, _level(level.strip(), f"the level of {logger_name}"))


def _apply_config_file(path: str) -> None:
    """Apply the dictConfig document in ``path`` (JSON or YAML, by its suffix).

    Raises:
        ConfigurationError: unreadable, not a mapping, YAML without PyYAML, or refused by
            :func:`logging.config.dictConfig` (each names the file).
    """
    import logging.config

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"--log-config {path}: cannot read it: {exc}") from exc
    document: Any
    if path.endswith((".yaml", ".yml")):
        try:
            import yaml
        except ImportError as exc:
            raise ConfigurationError(
                f"--log-config {path}: a YAML file needs PyYAML (pip install pyyaml), or "
                "give the same document as JSON"
            ) from exc
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigurationError(f"--log-config {path}: not valid YAML: {exc}") from exc
    else:
        try:
            document = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(f"--log-config {path}: not valid JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise ConfigurationError(f"--log-config {path}: the document must be a mapping")
    document.setdefault("version", 1)
    try:
        logging.config.dictConfig(document)
    except (ValueError, TypeError, AttributeError, ImportError) as exc:
        raise ConfigurationError(f"--log-config {path}: dictConfig refused it: {exc}") from exc
