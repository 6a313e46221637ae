"""``ast.parse`` for the tests that read the source tree.

CPython 3.11 can raise a spurious ``SystemError: AST constructor recursion depth mismatch``
from ``ast.parse`` in a process where other threads run (python/cpython#106905, fixed in
later releases): the AST constructor's depth count goes wrong. A test process of the suite
keeps threads of earlier tests (thread pools, the sync API's loops), so the parse is tried
again on that error alone.
"""

from __future__ import annotations

import ast

#: Parses tried before the error is let through.
TRIES = 3


def parse_source(text: str, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(text, filename)``, tried again on the spurious ``SystemError`` above.

    Raises:
        SyntaxError: ``text`` is not Python.
        SystemError: the error came back on every try.
    """
    for _ in range(TRIES - 1):
        try:
            return ast.parse(text, filename)
        except SystemError as exc:
            if "recursion depth mismatch" not in str(exc):
                raise
    return ast.parse(text, filename)
