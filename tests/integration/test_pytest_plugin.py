"""A user's pytest file run under blitzq's installed pytest plugin (issue 12).

The file below is the example of docs/testing.md ("Testing your tasks"): its tests use the
``blitzq_eager`` and ``blitzq_worker`` fixtures without any configuration. It runs in a
fresh pytest process in a temporary directory; no embedded server may appear there.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

TASKS = """
from blitzq import Queue

queue = Queue()  # no URL: in production the embedded server or BLITZQ_REDIS_URL


@queue.task(name="signup.welcome")
async def send_welcome(address: str) -> str:
    return f"sent to {address}"


@queue.task(name="signup.count")
def count_letters(word: str) -> int:
    return len(word)
"""

USER_TESTS = """
import pytest

from blitzq import SerializationError
from tasks import count_letters, queue, send_welcome


def test_welcome_sync(blitzq_eager):
    handle = send_welcome.enqueue_sync("ada@example.org")
    assert handle.result_sync(timeout=5) == "sent to ada@example.org"


@pytest.mark.asyncio
async def test_welcome_async(blitzq_eager):
    handle = await send_welcome.enqueue("grace@example.org")
    assert await handle.result(timeout=5) == "sent to grace@example.org"


@pytest.mark.asyncio
async def test_unserializable_argument_fails_as_in_production(blitzq_eager):
    with pytest.raises(SerializationError):
        await count_letters.enqueue(object())


@pytest.mark.asyncio
async def test_with_a_real_worker(blitzq_worker):
    async with blitzq_worker(queue, concurrency=4) as w:
        handles = await count_letters.enqueue_many([("a",), ("bb",), ("ccc",)])
        await w.drain()
    assert [await h.result(timeout=5) for h in handles] == [1, 2, 3]
"""


def _plugin_installed() -> bool:
    """Whether the pytest11 entry point is installed (else the test loads it with -p)."""
    return any(
        ep.value == "blitzq.testing.pytest_plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )


def test_a_users_test_file_runs_under_the_plugin(
    tmp_path: Path, redis_url: str, namespace: str
) -> None:
    (tmp_path / "tasks.py").write_text(textwrap.dedent(TASKS))
    (tmp_path / "test_signup.py").write_text(textwrap.dedent(USER_TESTS))
    src = Path(__file__).resolve().parents[2] / "src"
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(src), str(tmp_path)])
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    if not _plugin_installed():
        args += ["-p", "blitzq.testing.pytest_plugin"]

    def run(selection: str, extra_env: dict[str, str]) -> str:
        done = subprocess.run(
            [*args, "-k", selection, "test_signup.py"], cwd=tmp_path, env={**env, **extra_env},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    # The eager tests: no server configured, and none may be started (memory backend).
    assert "3 passed" in run("not real_worker", {})
    assert not (tmp_path / ".blitzq").exists()
    # The worker test runs on a real server, in the test's namespace.
    assert "1 passed" in run(
        "real_worker", {"BLITZQ_REDIS_URL": redis_url, "BLITZQ_NAMESPACE": namespace}
    )
