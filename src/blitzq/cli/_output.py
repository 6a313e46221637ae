"""What the commands print: times for tables and JSON, JSON documents, the rich console."""

from __future__ import annotations

import json
import math
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console


def iso(ts: float | None) -> str | None:
    """Unix time (seconds) as an ISO 8601 local date with offset, or ``None``."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="milliseconds")


def short_time(ts: float | None) -> str:
    """Unix time (seconds) as ``YYYY-MM-DD HH:MM:SS ZONE`` local time (the zone's abbreviation,
    ``CET``, ``UTC``), for tables; ``-`` for None."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def emit_json(doc: Any) -> None:
    """Print ``doc`` as one JSON document on stdout."""
    from ..serialization import jsonable  # here: --help loads no msgpack

    click.echo(
        json.dumps(_finite(doc), default=jsonable, ensure_ascii=False, indent=2, allow_nan=False)
    )


def _finite(doc: Any) -> Any:
    """``doc`` with every non-finite float (``nan``, ``inf``) as its string ``"nan"``,
    ``"inf"``, ``"-inf"``, so that the document stays valid JSON."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return str(doc)
    if isinstance(doc, dict):
        return {k: _finite(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_finite(v) for v in doc]
    return doc


def console(stderr: bool = False) -> Console:
    """A rich Console on the current stdout (or stderr).

    On a terminal, rich fits tables to its width (``COLUMNS`` overrides it). Output that is
    not a terminal (a pipe, a file, a test's runner) is never wrapped or cut, whatever
    ``COLUMNS`` says: ``blitzq queue stats | grep <worker id>`` must find the whole id, so
    tables there take their natural width.
    """
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else _UNWRAPPED_WIDTH
    from rich.console import Console  # here: --help and `import blitzq.cli` load no rich

    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=width)


# Columns for output that is not a terminal: wider than any row blitzq prints (a table is as
# wide as its content, not the page, so this only lifts the cap).
_UNWRAPPED_WIDTH = 10_000


__all__ = ["console", "emit_json", "iso", "short_time"]
