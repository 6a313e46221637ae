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


#: The control characters a stored text may hold that a terminal would act on (C0 but tab
#: and newline, DEL, C1), each shown as a visible character instead: C0 as its Unicode
#: control picture (ESC as U+241B), DEL as U+2421, C1 as U+FFFD.
_SHOWN = {
    **{code: 0x2400 + code for code in range(0x20) if code not in (0x09, 0x0A)},
    0x7F: 0x2421,
    **dict.fromkeys(range(0x80, 0xA0), 0xFFFD),
}


def printable(text: str) -> str:
    """``text`` with every control character a terminal would act on (an escape sequence
    that recolours it or sets its title, a NUL, a bell) shown as a visible character: what a
    task's error, name or arguments, read back from the broker, may hold (:data:`_SHOWN`)."""
    return text.translate(_SHOWN)


def console(stderr: bool = False) -> Console:
    """A rich Console on the current stdout (or stderr) that prints the control characters
    of what it is given as visible characters (:func:`printable`), its own styles unchanged.

    On a terminal, rich fits tables to its width (``COLUMNS`` overrides it). Output that is
    not a terminal (a pipe, a file, a test's runner) is never wrapped or cut, whatever
    ``COLUMNS`` says: ``blitzq queue stats | grep <worker id>`` must find the whole id, so
    tables there take their natural width.
    """
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else _UNWRAPPED_WIDTH
    return _safe_console_class()(stderr=stderr, highlight=False, soft_wrap=False, width=width)


def _safe_console_class() -> type[Console]:
    """rich's Console that makes every string it is given :func:`printable` before it
    measures and prints it (``render_str``), and, as a backstop, every text segment it
    renders (a rich ``Text`` not made by ``cli/_rich.py``); made on first use so that
    ``--help`` and ``import blitzq.cli`` load no rich."""
    global _SAFE_CONSOLE
    if _SAFE_CONSOLE is None:
        from rich.console import Console
        from rich.segment import Segment

        class SafeConsole(Console):
            def render_str(self, text: str, **kwargs: Any) -> Any:
                # A string printed or put in a table: printable before rich measures it.
                return super().render_str(printable(text), **kwargs)

            def render(self, renderable: Any, options: Any = None) -> Any:
                # The backstop: a text that bypassed both (a rich Text made elsewhere).
                for segment in super().render(renderable, options):
                    text = segment.text
                    if segment.control is None and text.translate(_SHOWN) != text:
                        segment = Segment(text.translate(_SHOWN), segment.style)
                    yield segment

        _SAFE_CONSOLE = SafeConsole
    return _SAFE_CONSOLE


_SAFE_CONSOLE: type[Console] | None = None


# Columns for output that is not a terminal: wider than any row blitzq prints (a table is as
# wide as its content, not the page, so this only lifts the cap).
_UNWRAPPED_WIDTH = 10_000


__all__ = ["console", "emit_json", "iso", "printable", "short_time"]
