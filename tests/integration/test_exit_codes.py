"""Exit codes of the commands, each run as a user runs it (``python -m blitzq …`` in a
subprocess): a configuration error exits 78 (``EX_CONFIG``) at every level (worker,
supervisor, check, and every command that loads an application or settings), a connection
error 1, a malformed command line 2 (docs/supervisor.md, "Exit codes")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.reliability.cpu_app:queue"
MISSING = "tests.no_such_module:queue"
BAD_NS = "bad{namespace}"


def blitzq(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[int, str]:
    """Run ``python -m blitzq ARGS``; return (exit code, stderr and stdout)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    environ["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT), environ.get("PYTHONPATH", "")]
    )
    environ.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "blitzq", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=90,
    )
    return proc.returncode, proc.stderr + proc.stdout


@pytest.fixture
def down() -> str:
    """A Redis URL nothing listens on."""
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.mark.parametrize(
    "args",
    [
        ["worker", MISSING],  # the supervisor's precheck
        ["worker", MISSING, "--no-supervise"],  # the worker itself
        ["worker", MISSING, "--workers", "2"],
        ["check", MISSING],
        ["scheduler", "run", MISSING],
        ["scheduler", "list", MISSING],
        ["dashboard", MISSING],
    ],
    ids=lambda a: " ".join(a[:3]),
)
def test_an_application_that_does_not_load_exits_78(args: list[str], redis_url: str) -> None:
    code, out = blitzq(*args, "--redis-url", redis_url)
    assert code == 78, out
    assert "no_such_module" in out


@pytest.mark.parametrize(
    "args",
    [
        ["worker", APP, "--no-supervise"],
        ["check", APP],
        ["dead-letter", "list"],
        ["task", "inspect", "0123456789abcdef"],
        ["queue", "stats"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_bad_setting_in_the_environment_exits_78(args: list[str], redis_url: str) -> None:
    code, out = blitzq(*args, "--redis-url", redis_url, env={"BLITZQ_NAMESPACE": BAD_NS})
    assert code == 78, out
    assert "BLITZQ_NAMESPACE" in out
    code, out = blitzq(*args, "--redis-url", redis_url, env={"BLITZQ_MODE": "bogus"})
    assert code == 78, out
    assert "BLITZQ_MODE" in out


def test_a_bad_project_file_setting_exits_78(tmp_path: Path, redis_url: str) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.blitzq]\nmode = "bogus"\n')
    code, out = blitzq("queue", "stats", "--redis-url", redis_url, cwd=tmp_path)
    assert code == 78, out
    assert "pyproject.toml" in out


@pytest.mark.parametrize(
    "args",
    [
        ["worker", APP, "--concurrency", "0"],
        ["worker", APP, "--no-such-option"],
        ["worker", APP, "--no-supervise", "--workers", "2"],
        ["dead-letter", "list", "--mode", "bogus"],
        ["queue", "stats", "--namespace", BAD_NS],
        ["queue", "pause", "bad name"],
        ["check"],
    ],
    ids=lambda a: " ".join(a),
)
def test_a_malformed_command_line_exits_2(args: list[str], redis_url: str) -> None:
    code, out = blitzq(*args, "--redis-url", redis_url)
    assert code == 2, out


@pytest.mark.parametrize(
    "args",
    [
        ["worker", APP, "--no-supervise"],
        ["check", APP],
        ["dead-letter", "list"],
        ["task", "inspect", "0123456789abcdef"],
        ["queue", "stats"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_a_broker_that_does_not_answer_exits_1(args: list[str], down: str) -> None:
    code, out = blitzq(*args, "--redis-url", down)
    assert code == 1, out
