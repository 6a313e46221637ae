"""Importable exceptions and functions for the isolation tests (``test_task_isolation.py``).

Process-pool tasks are imported by module and qualified name in a spawned process, and the
exceptions they raise must be importable on both sides, so they live here at module level.
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

#: The module-level context variable tasks set and read (the issue's case).
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("odd_tasks_var", default="default")


class BadStr(ValueError):
    """A ValueError whose ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ of BadStr raises")


class BadRepr(ValueError):
    """A ValueError whose ``__repr__`` raises (its ``__str__`` works)."""

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ of BadRepr raises")


class BadBoth(ValueError):
    """A ValueError whose ``__str__`` and ``__repr__`` both raise."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ of BadBoth raises")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ of BadBoth raises")


class Unpicklable(Exception):
    """An exception holding a lock: it cannot be pickled."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()


class NeedsTwo(Exception):
    """An exception that pickles but does not unpickle (its ``__init__`` needs two
    arguments, its ``args`` hold one)."""

    def __init__(self, first: str, second: str) -> None:
        super().__init__(f"{first}/{second}")


class NotBack:
    """A return value that pickles but does not unpickle."""

    def __init__(self, first: str, second: str) -> None:
        self.value = first + second

    def __reduce__(self) -> tuple[Any, ...]:
        return (NotBack, (self.value,))


class CustomBase(BaseException):
    """A ``BaseException`` that is not an ``Exception``."""


ERRORS: dict[str, type[BaseException]] = {
    "str": BadStr,
    "repr": BadRepr,
    "both": BadBoth,
}


def raise_odd(kind: str) -> None:
    """Raise the odd exception named ``kind`` (``str``, ``repr``, ``both``)."""
    raise ERRORS[kind]("the message")


def raise_base(kind: str) -> None:
    """Raise ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit`` or :class:`CustomBase`."""
    errors: dict[str, BaseException] = {
        "SystemExit": SystemExit(3),
        "KeyboardInterrupt": KeyboardInterrupt(),
        "GeneratorExit": GeneratorExit(),
        "CustomBase": CustomBase("custom"),
    }
    raise errors[kind]


def raise_unsendable(kind: str) -> None:
    """Raise an exception that cannot travel back from a pool process."""
    if kind == "unpicklable":
        raise Unpicklable("holds a lock")
    raise NeedsTwo("one", "two")


def return_not_back() -> NotBack:
    """Return a value that cannot travel back from a pool process."""
    return NotBack("a", "b")


def sleep_then(seconds: float, value: int) -> int:
    """Sleep ``seconds`` in the pool process, then return ``value``."""
    time.sleep(seconds)
    return value


def see_and_set(label: str) -> str:
    """Return the context variable's value at start, then set it to ``label``."""
    seen = VAR.get()
    VAR.set(label)
    return seen


def exit_process(code: int) -> None:
    """End the pool process at once, as a crash would (no exception, no cleanup)."""
    import os

    os._exit(code)
