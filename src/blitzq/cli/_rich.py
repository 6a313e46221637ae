"""rich's ``Text`` for the commands' output, made of :func:`._output.printable` text.

What a command prints often comes from the broker (a task's error, name, arguments), and may
hold control characters: an escape sequence a terminal would act on (recolour it, set its
title). Every ``Text`` the commands make shows them as visible characters from the start,
so that rich measures (a table's column) the same characters it prints; plain strings are
made printable by the console itself (:func:`._output.console`). Imported by the commands
that print, never by ``--help`` (rich is not loaded then).
"""

from __future__ import annotations

from typing import Any

from rich import text as rich_text

from ._output import printable


class Text(rich_text.Text):
    """``rich.text.Text`` whose text, given or appended, is :func:`printable`."""

    def __init__(self, text: str = "", *args: Any, **kwargs: Any) -> None:
        super().__init__(printable(text), *args, **kwargs)

    def append(self, text: str | rich_text.Text, style: Any = None) -> Text:
        """As ``rich.text.Text.append``, a string made :func:`printable` first."""
        if isinstance(text, str):
            text = printable(text)
        super().append(text, style)
        return self


__all__ = ["Text"]
