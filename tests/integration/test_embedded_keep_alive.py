"""A killed embedded server comes back: a process whose Queue uses the embedded default
restarts it (``kill -9``, the OOM killer) from its AOF, on the same socket, and a worker then
runs the queued tasks; a server stopped on purpose (``blitzq server stop``) stays stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blitzq import Queue
from blitzq.broker.redis import embedded

pytestmark = pytest.mark.timeout(120)

APP = textwrap.dedent(
    """
    from blitzq import Queue

    queue = Queue("default")


    @queue.task()
    def echo(x):
        return x
    """
)


def wait_for(condition: object, what: str, timeout: float = 60.0) -> None:
    """Poll ``condition()`` until it is true, or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def restarted(data_dir: Path, old_pid: int) -> bool:
    """The server of ``data_dir`` answers, under another process than ``old_pid``."""
    status = embedded.server_status(data_dir)
    return bool(status["running"]) and status["pid"] not in (None, old_pid)


def kill_9(data_dir: Path) -> int:
    """SIGKILL the server of ``data_dir``; return its pid once it is gone."""
    pid = embedded.server_status(data_dir)["pid"]
    assert isinstance(pid, int)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not embedded._pid_alive(pid), "the killed server to exit", 10)
    return pid


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    path = (tmp_path / ".blitzq").resolve()
    yield path
    embedded.stop_server(path)


def test_a_kept_server_is_restarted_with_its_data_and_a_stopped_one_is_not(
    data_dir: Path,
) -> None:
    url = embedded.ensure_server(data_dir, keep_alive=True)
    import redis

    with redis.Redis.from_url(url) as client:
        client.set("kept", "yes")
    pid = kill_9(data_dir)
    wait_for(lambda: restarted(data_dir, pid), "the keep-alive thread to restart it")
    assert embedded.server_status(data_dir)["url"] == url  # the same socket
    with redis.Redis.from_url(url) as client:
        assert client.get("kept") == b"yes"  # from its AOF
    assert embedded.stop_server(data_dir) is True
    assert (data_dir / embedded.STOPPED_MARK).exists()
    assert embedded.revive(data_dir) is False  # stopped on purpose: left stopped
    assert not embedded.server_status(data_dir)["running"]
    assert embedded.ensure_server(data_dir) == url  # a start clears the mark
    assert not (data_dir / embedded.STOPPED_MARK).exists()
    pid = kill_9(data_dir)
    assert embedded.revive(data_dir) is True
    assert restarted(data_dir, pid)


def test_a_worker_on_the_embedded_default_survives_a_kill_9_of_the_server(
    tmp_path: Path, data_dir: Path
) -> None:
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / ".git").mkdir()  # the project root: no pyproject.toml above is read
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env |= {"BLITZQ_DATA_DIR": str(data_dir), "PYTHONPATH": os.pathsep.join(sys.path)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "blitzq", "worker", "app:queue", "-c", "4"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: embedded.server_status(data_dir)["running"], "the worker's server")
        url = embedded.server_status(data_dir)["url"]

        async def produce(*values: object, delay: float | None = None) -> list[object]:
            # An explicit URL: this process keeps no server alive, the worker must.
            queue = Queue(redis_url=url)
            try:
                echo = queue.task(name="app.echo")(lambda x: x)
                sent = echo.options(delay=delay) if delay else echo
                handles = [await sent.enqueue(v) for v in values]
                return [await h.result(timeout=60) for h in handles] if not delay else handles
            finally:
                await queue.close()

        assert asyncio.run(produce("before")) == ["before"]
        queued = asyncio.run(produce("queued", delay=1.0))  # on the schedule at the kill
        pid = kill_9(data_dir)
        wait_for(lambda: restarted(data_dir, pid), "the worker to restart the server")
        assert worker.poll() is None

        async def after() -> list[object]:
            queue = Queue(redis_url=url)
            try:
                echo = queue.task(name="app.echo")(lambda x: x)
                handle = await echo.enqueue("after")
                late = await queue.get_result(queued[0].id, timeout=60)  # type: ignore[attr-defined]
                return [await handle.result(timeout=60), late]
            finally:
                await queue.close()

        assert asyncio.run(after()) == ["after", "queued"]
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
