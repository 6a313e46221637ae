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
from datetime import UTC, datetime
from typing import Any, Literal

from .exceptions import ConfigurationError
from .logcontext import NonBlockingHandler, TaskContextFilter
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


def configure_logging(level: str, fmt: Literal["text", "json"]) -> None:
    """Send log records of ``level`` and above to stderr, as text or JSON lines.

    Installs one handler on the root logger (so the user's task loggers print too) and
    replaces the handler a previous call installed, so calling it twice does not duplicate
    lines. Meant for the CLI; libraries and applications configure logging themselves.

    The handler is a :class:`~blitzq.logcontext.NonBlockingHandler` (a ``QueueHandler``: a
    listener thread writes to stderr, so a slow stderr never blocks the caller) with a
    :class:`~blitzq.logcontext.TaskContextFilter`: records emitted while a task runs carry
    ``task_id``, ``task``, ``queue``, ``attempt`` and ``worker_id``, shown as fields.

    Args:
        level: a level name, case-insensitive: debug, info, warning, error or critical.
        fmt: ``"text"`` (``time level logger: message key=value``) or ``"json"`` (one object
            per line with time, level, logger, message and any ``extra`` fields).

    Raises:
        ConfigurationError: an unknown level or format.
    """
    name = level.upper() if isinstance(level, str) else ""
    if name not in LEVELS:
        raise ConfigurationError(
            f"log level must be one of {', '.join(n.lower() for n in LEVELS)}, got {level!r}"
        )
    formatter: logging.Formatter
    if fmt == "text":
        formatter = TextFormatter()
    elif fmt == "json":
        formatter = JsonFormatter()
    else:
        raise ConfigurationError(f"log format must be 'text' or 'json', got {fmt!r}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _MARK, False)]:
        root.removeHandler(old)
        old.close()
    stderr = _StderrHandler()
    stderr.setFormatter(formatter)
    # Written by a listener thread (a slow stderr never stalls the event loop); the task
    # fields are added in the emitting thread, where the task's context is.
    handler = NonBlockingHandler(stderr)
    handler.addFilter(TaskContextFilter())
    setattr(handler, _MARK, True)
    root.addHandler(handler)
    root.setLevel(getattr(logging, name))
