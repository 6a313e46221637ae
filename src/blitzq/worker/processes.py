"""Process handling for the supervisor: worker command, death signal, process groups, guard.

Each worker is a fresh interpreter running the single-worker command line
(:func:`worker_command`).

Nothing the supervisor starts may outlive it. Every worker leads its own process group, which
its process-pool children join, and the supervisor SIGKILLs the whole group when the worker
ends (:func:`killpg`). On Linux every worker gets ``PR_SET_PDEATHSIG = SIGKILL``
(:func:`die_with_parent`), so it dies with the supervisor even when the supervisor is
SIGKILLed; a small *guard* process (``python -m blitzq.supervisor``, :class:`Guard`) holds the
read end of a pipe whose write end only the supervisor holds, learns the process group of each
worker through it, and SIGKILLs those groups when the pipe reaches end-of-file, that is when
the supervisor is gone, however it went. The guard is what takes the process-pool children of
workers down with a SIGKILLed supervisor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import IO

from ..parent_death import _prctl as _prctl
from ..parent_death import die_with_parent as die_with_parent

logger = logging.getLogger("blitzq.supervisor")

#: Command of the guard process; ``blitzq.supervisor`` runs :func:`guard_main` as a script.
GUARD_COMMAND = ("-m", "blitzq.supervisor")


def worker_command(
    app: str,
    *,
    queues: str | None = None,
    concurrency: int = 100,
    shutdown_timeout: float = 30.0,
    log_level: str = "info",
    log_format: str = "text",
    redis_url: str | None = None,
    amqp_url: str | None = None,
    namespace: str | None = None,
    mode: str | None = None,
    json_output: bool = False,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv of one single-worker process: ``python -m blitzq worker APP … --workers 1``.

    Args:
        app: ``MODULE:ATTR`` of the application's Queue.
        queues: ``-Q`` value (comma-separated names) or ``None``.
        concurrency: ``-c`` value.
        shutdown_timeout: ``--shutdown-timeout`` in seconds.
        log_level, log_format: the logging options.
        redis_url, amqp_url, namespace, mode: global options typed on the supervisor's command line
            (``None``: not given; the worker inherits the environment instead).
        json_output: pass ``--json``.
        extra: more options appended as they are (e.g. ``["--scheduler"]``).
    """
    argv = [
        sys.executable,
        "-m",
        "blitzq",
        "worker",
        app,
        "--workers",
        "1",
        "--concurrency",
        str(concurrency),
        "--shutdown-timeout",
        repr(float(shutdown_timeout)),
        "--log-level",
        log_level,
        "--log-format",
        log_format,
    ]
    if queues is not None:
        argv += ["--queues", queues]
    for option, value in (
        ("--redis-url", redis_url),
        ("--amqp-url", amqp_url),
        ("--namespace", namespace),
        ("--mode", mode),
    ):
        if value is not None:
            argv += [option, value]
    if json_output:
        argv.append("--json")
    argv += extra
    return argv


def signal_name(sig: int) -> str:
    """``"SIGTERM"`` for a signal number; the number as text when it names no signal."""
    try:
        return signal.Signals(sig).name
    except ValueError:
        return str(sig)


def group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member (one we may not signal counts)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def killpg(pgid: int) -> None:
    """SIGKILL every process of group ``pgid``; a group that is gone (or not ours) is skipped."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class Guard:
    """The supervisor's side of the guard process (see the module docstring).

    Args:
        env: environment of the guard process.
        groups: returns the process groups the guard must know when it (re)starts.
    """

    def __init__(self, env: Mapping[str, str], groups: Callable[[], Iterable[int]]) -> None:
        self.env = env
        self._groups = groups
        self._proc: subprocess.Popen[bytes] | None = None
        self._pipe: IO[bytes] | None = None

    def start(self) -> None:
        """Start the guard and tell it every current group; a failure is logged, not raised."""
        read_end, write_end = os.pipe()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, *GUARD_COMMAND],
                stdin=read_end,
                process_group=0,
                env=self.env,
            )
        except OSError as exc:
            os.close(write_end)
            logger.warning("could not start the guard process: %s", exc)
            return
        finally:
            os.close(read_end)
        self._pipe = os.fdopen(write_end, "wb", buffering=0)
        for pgid in sorted(self._groups()):
            self.tell(f"+{pgid}")

    def check(self) -> None:
        """Restart the guard if it exited."""
        if self._proc is not None and self._proc.poll() is not None:
            logger.warning("guard process exited with %s: restarting it", self._proc.returncode)
            self.stop()
            self.start()

    def tell(self, line: str) -> None:
        """Send one line: ``+PGID`` (a worker group started) or ``-PGID`` (it is gone)."""
        if self._pipe is None:
            return
        try:
            self._pipe.write(line.encode() + b"\n")
        except OSError:
            logger.warning("guard process unreachable")
            self._pipe = None

    def stop(self) -> None:
        """Close the pipe (the guard kills the groups it still knows) and wait for the guard."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                proc.wait(5.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def guard_main(stream: IO[bytes]) -> None:
    """The guard process: track worker process groups; SIGKILL them when ``stream`` ends.

    Lines are ``+PGID`` (a worker group started) and ``-PGID`` (it is gone). End-of-file
    means the supervisor is gone, however it went.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    groups: set[int] = set()
    for raw in stream:
        line = raw.strip()
        with contextlib.suppress(ValueError):
            if line.startswith(b"+"):
                groups.add(int(line[1:]))
            elif line.startswith(b"-"):
                groups.discard(int(line[1:]))
    for pgid in groups:
        killpg(pgid)
