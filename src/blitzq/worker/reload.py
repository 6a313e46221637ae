"""``blitzq worker … --reload``: watch the application's source and have the supervisor reload
its workers when a ``.py`` file changes (for development: a WARNING says so at every start).
``--watch-dir DIR`` (repeatable) watches more directories next to the application's.

:func:`app_directory` finds the directory of ``MODULE:ATTR`` without running the module (the
supervisor imports the application only for ``--autoscale``): the top-level package's
directory, or the directory holding a top-level module file. :class:`SourceWatcher` watches
it in a daemon thread with ``watchfiles`` (the optional extra ``reload`` of the checkout:
``pip install -e '.[reload]'``), which
debounces a burst of writes into one change, and calls back once per change; the supervisor
then starts new workers and stops the old ones gracefully (see :meth:`Supervisor.reload
<blitzq.worker.supervisor.Supervisor.reload>`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from ..exceptions import ConfigurationError

logger = logging.getLogger("blitzq.supervisor")

#: Milliseconds ``watchfiles`` waits for a burst of file writes to end before it reports.
DEBOUNCE_MS = 300


def app_directory(spec: str) -> Path:
    """The directory to watch for ``MODULE:ATTR`` (the current directory first on the path).

    Raises:
        ConfigurationError: the top-level module or package cannot be found.
    """
    top = spec.partition(":")[0].split(".")[0]
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    found = importlib.util.find_spec(top) if top else None
    if found is None:
        raise ConfigurationError(f"--reload: cannot find module {top!r} from {cwd}")
    if found.submodule_search_locations:
        return Path(next(iter(found.submodule_search_locations))).resolve()
    if found.origin is None or not os.path.exists(found.origin):
        raise ConfigurationError(f"--reload: module {top!r} has no source file to watch")
    return Path(found.origin).resolve().parent


class SourceWatcher:
    """Call ``on_change(paths)`` once per change of ``.py`` files under ``directory``.

    Args:
        directory: the directory watched recursively, or several (the application's first,
            then those of ``--watch-dir``).
        on_change: called from the watcher's thread with the changed paths (sorted).

    Raises:
        ConfigurationError: ``watchfiles`` is not installed (``pip install watchfiles``, or
            the ``reload`` extra from the checkout: ``pip install -e '.[reload]'``).
    """

    def __init__(
        self, directory: Path | Sequence[Path], on_change: Callable[[list[str]], None]
    ) -> None:
        try:
            import watchfiles  # noqa: F401
        except ImportError:
            raise ConfigurationError(
                "--reload needs watchfiles: pip install watchfiles (or install blitzq from its "
                "checkout with the extra: pip install -e '.[reload]')"
            ) from None
        #: Every directory watched (the first is :attr:`directory`).
        self.directories = [directory] if isinstance(directory, Path) else list(directory)
        if not self.directories:
            raise ConfigurationError("--reload: no directory to watch")
        self.directory = self.directories[0]
        self._on_change = on_change
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start watching (returns once the watch is set up, at most 5 s); logs a WARNING
        that reload is for development."""
        logger.warning(
            "--reload is for development only: every .py change under %s restarts the "
            "workers; run production workers without it",
            ", ".join(map(str, self.directories)),
        )
        self._thread = threading.Thread(target=self._main, name="blitzq-reload", daemon=True)
        self._thread.start()
        self._ready.wait(5.0)

    def stop(self) -> None:
        """Stop watching and join the thread (bounded: 5 s)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _main(self) -> None:
        from watchfiles import PythonFilter, watch

        shown = ", ".join(map(str, self.directories))
        logger.info("reload: watching %s", shown)
        self._ready.set()
        try:
            for changes in watch(
                *self.directories,
                watch_filter=PythonFilter(),
                debounce=DEBOUNCE_MS,
                stop_event=self._stop,
                rust_timeout=500,
                yield_on_timeout=False,
            ):
                self._on_change(sorted({path for _, path in changes}))
        except Exception:
            logger.exception("reload: watching %s failed", shown)
