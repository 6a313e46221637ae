"""A condition that lasts, logged once when it starts and once when it ends.

A background step that fails the same way every round (a Redis Cluster slot migrating, a
server failing over), or a wait that meets the same trouble for each of thousands of
handles under load, would otherwise write one line per round or per handle. An
:class:`Episode` writes the first failure at its level (WARNING by default), counts the
next ones at DEBUG, writes a reminder with the count every ``remind`` seconds while it
lasts, and one INFO line with the count when it ends. A failure of another kind (another
exception type) while one lasts is written too, and starts the count again; a failure given
as a text (a channel's name) is of the episode's one kind.
"""

from __future__ import annotations

import logging
import time

from .exceptions import BlitzQError

__all__ = ["REMIND_EVERY", "Episode"]

#: Seconds between two reminders of a condition that lasts (with the count so far).
REMIND_EVERY = 600.0


def _kind(detail: object) -> str:
    """The kind of a failure: its exception's type (the cause's, for an error that wraps
    one, as :class:`~blitzq.BrokerError` wraps a Redis error); one kind for every text."""
    if isinstance(detail, BaseException):
        cause = detail.__cause__
        return type(cause if cause is not None else detail).__name__
    return ""


def _text(detail: object) -> str:
    """``detail`` as a line shows it: an error other than blitzq's with its type's name
    (``KeyError: 'x'``), blitzq's as its message (which names its cause)."""
    if isinstance(detail, BaseException) and not isinstance(detail, BlitzQError):
        return f"{type(detail).__name__}: {detail}"
    return str(detail)


class Episode:
    """One condition that may last (see the module docstring).

    Args:
        logger: where the lines go.
        what: what fails, the start of every line (``"taking handed messages"``).
        settle: seconds that must pass after the last failure before :meth:`cleared` ends
            the episode (0: the first success ends it). Where successes and failures
            interleave while the condition lasts (waits under load), a settle time keeps
            them in one episode.
        remind: seconds between two reminders while it lasts (:data:`REMIND_EVERY`).
    """

    __slots__ = (
        "_count",
        "_kind",
        "_last",
        "_logger",
        "_since",
        "_told",
        "remind",
        "settle",
        "what",
    )

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        settle: float = 0.0,
        remind: float = REMIND_EVERY,
    ) -> None:
        self._logger = logger
        self.what = what
        self.settle = settle
        self.remind = remind
        self._count = 0
        self._kind = ""
        self._since = self._last = self._told = 0.0

    @property
    def count(self) -> int:
        """Failures in the episode under way (0: none under way)."""
        return self._count

    def failed(self, detail: object, level: int = logging.WARNING) -> None:
        """Note one failure: logged at ``level`` when it starts an episode (or is of
        another kind than the episode's), else at DEBUG, or at ``level`` with the count
        when a reminder is due.

        Args:
            detail: the exception, or a text saying what happened.
            level: the level of the lines that are written (DEBUG where the cause was
                reported already, e.g. a lost connection).
        """
        now = time.monotonic()
        kind = _kind(detail)
        self._last = now
        if self._count == 0 or kind != self._kind:
            self._count, self._kind, self._since, self._told = 1, kind, now, now
            self._logger.log(level, "%s: %s", self.what, _text(detail))
            return
        self._count += 1
        if now - self._told >= self.remind:
            self._told = now
            self._logger.log(
                level,
                "%s: still failing, %d times in %.0f s: %s",
                self.what,
                self._count,
                now - self._since,
                _text(detail),
            )
        else:
            self._logger.debug("%s: failed again (%d): %s", self.what, self._count, _text(detail))

    def cleared(self) -> None:
        """Note a success: ends the episode under way (one INFO line with its count), once
        ``settle`` seconds passed since its last failure."""
        if self._count == 0:
            return
        now = time.monotonic()
        if now - self._last < self.settle:
            return
        self._logger.info(
            "%s: works again, after %d failure(s) in %.0f s",
            self.what,
            self._count,
            now - self._since,
        )
        self._count = 0
