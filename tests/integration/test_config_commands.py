"""A command's own settings of the global options, and the types of a command's table.

``BLITZQ_<COMMAND>_REDIS_URL`` / ``_NAMESPACE`` / ``_MODE`` and ``[tool.blitzq.<command>]``
``redis_url`` / ``namespace`` / ``mode`` apply to that command (its application's Queue
included), above ``BLITZQ_REDIS_URL`` and the plain ``[tool.blitzq]`` keys; and every value of
a command's table goes through the command line's type checks (exit 2 naming the file, the
table and the key). Each case runs the real ``blitzq`` in a subprocess, in a project
directory of its own, against the test server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

APP = textwrap.dedent(
    """
    from blitzq import Queue

    queue = Queue("default")


    @queue.task()
    def echo(x):
        return x


    def setup(queue):
        queue.configured = True
    """
)


def blitzq(
    project: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``blitzq ARGS`` in ``project`` with no BLITZQ_* variables but ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    clean["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return subprocess.run(
        [sys.executable, "-m", "blitzq", *args],
        cwd=project,
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=90,
    )


def first(stdout: str) -> dict[str, object]:
    """The first JSON document of ``stdout`` (the worker's ``worker_started``)."""
    return dict(json.JSONDecoder().raw_decode(stdout.lstrip())[0])


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / ".git").mkdir()  # the project root: no pyproject.toml above is read
    return tmp_path


def started(project: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, object]:
    """The ``worker_started`` document of a ``--burst`` worker of ``app:queue``."""
    done = blitzq(project, "--json", "worker", "app:queue", "--burst", *args, env=env)
    assert done.returncode == 0, done.stderr
    return first(done.stdout)


@pytest.mark.parametrize("key", ["redis_url", "redis-url"])
def test_the_worker_table_sets_url_namespace_and_mode(
    project: Path, redis_url: str, namespace: str, key: str
) -> None:
    (project / "pyproject.toml").write_text(
        f'[tool.blitzq.worker]\n{key} = "{redis_url}"\nnamespace = "{namespace}"\nmode = "fast"\n'
    )
    doc = started(project)
    assert doc["broker"] == redis_url
    assert doc["namespace"] == namespace
    assert doc["mode"] == "fast"


def test_the_worker_variables_set_url_namespace_and_mode(
    project: Path, redis_url: str, namespace: str
) -> None:
    doc = started(
        project,
        env={
            "BLITZQ_WORKER_REDIS_URL": redis_url,
            "BLITZQ_WORKER_NAMESPACE": namespace,
            "BLITZQ_WORKER_MODE": "fast",
            "BLITZQ_WORKER_CONCURRENCY": "7",
        },
    )
    assert (doc["broker"], doc["namespace"], doc["mode"]) == (redis_url, namespace, "fast")
    assert doc["concurrency"] == 7


def test_the_precedence_of_a_commands_own_settings(
    project: Path, redis_url: str, namespace: str
) -> None:
    """Typed > the command's variable > the general variable > the command's table > the
    plain key; the application's own argument wins over all but a typed option."""
    (project / "pyproject.toml").write_text(
        f'[tool.blitzq]\nredis_url = "{redis_url}"\nnamespace = "plain-{namespace}"\n'
        f'[tool.blitzq.worker]\nnamespace = "table-{namespace}"\n'
    )
    assert started(project)["namespace"] == f"table-{namespace}"
    general = {"BLITZQ_NAMESPACE": f"env-{namespace}"}
    assert started(project, env=general)["namespace"] == f"env-{namespace}"
    own = general | {"BLITZQ_WORKER_NAMESPACE": f"own-{namespace}"}
    assert started(project, env=own)["namespace"] == f"own-{namespace}"
    typed = started(project, "--namespace", f"typed-{namespace}", env=own)
    assert typed["namespace"] == f"typed-{namespace}"
    (project / "coded.py").write_text(
        APP.replace('Queue("default")', f'Queue("default", namespace="code-{namespace}")')
    )
    done = blitzq(project, "--json", "worker", "coded:queue", "--burst", env=own)
    assert done.returncode == 0, done.stderr
    assert first(done.stdout)["namespace"] == f"code-{namespace}"


def test_other_commands_read_their_own_settings(
    project: Path, redis_url: str, namespace: str
) -> None:
    (project / "pyproject.toml").write_text(
        f'[tool.blitzq.check]\nredis_url = "{redis_url}"\nnamespace = "{namespace}"\n'
    )
    check = blitzq(project, "--json", "check", "app:queue")
    assert check.returncode in (0, 78), check.stderr  # 78: a warning of the shared server
    assert json.loads(check.stdout)["namespace"] == namespace
    stats = blitzq(
        project,
        "--json",
        "queue",
        "stats",
        env={"BLITZQ_QUEUE_STATS_REDIS_URL": redis_url, "BLITZQ_QUEUE_STATS_NAMESPACE": namespace},
    )
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["namespace"] == namespace


def test_an_option_with_a_variable_of_its_own_reads_the_commands_first(project: Path) -> None:
    from blitzq.cli import cli

    done = blitzq(project, "worker", "--help")
    assert "BLITZQ_WORKER_REDIS_URL, BLITZQ_REDIS_URL" in " ".join(done.stdout.split())
    assert "BLITZQ_WORKER_LOG_LEVEL, BLITZQ_LOG_LEVEL" in " ".join(done.stdout.split())
    root = cli.make_context("blitzq", ["worker", "app:queue"])
    level = next(p for p in cli.commands["worker"].params if p.name == "log_level")
    assert level.envvar == ["BLITZQ_WORKER_LOG_LEVEL", "BLITZQ_LOG_LEVEL"]
    root.close()


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("concurrency = 2.7", "2.7 is not an integer"),
        ("concurrency = true", "True is a bool, not a number"),
        ("shutdown-timeout = false", "False is a bool, not a number"),
        ("shutdown-timeout = nan", "not a finite number of seconds"),
        ('concurrency = "2.7"', "'2.7' is not a valid integer"),
        ("burst = 1", "1 is not true or false"),
        ('ops-host = ["a"]', "['a'] (list) is not a string"),
        ("ops-host = 5", "5 (int) is not a string"),
        ("log-level = 10", "10 (int) is not a string"),
        ("queues = []", "[] is not a non-empty list"),
        ('queues = ["a,b"]', "without commas"),
        ("configure = [1]", "[1] is not a string or a list of strings"),
    ],
)
def test_a_value_of_the_wrong_type_stops_the_command(
    project: Path, redis_url: str, line: str, why: str
) -> None:
    (project / "pyproject.toml").write_text(f"[tool.blitzq.worker]\n{line}\n")
    key = line.split(" = ")[0]
    burst = [] if key == "burst" else ["--burst"]  # a typed --burst would win over the file
    done = blitzq(project, "worker", "app:queue", *burst, env={"BLITZQ_REDIS_URL": redis_url})
    assert done.returncode == 78, done.stderr  # the project file's: a configuration error
    where = f"(from {project / 'pyproject.toml'} [tool.blitzq.worker] {key})"
    assert where in done.stderr
    assert why in done.stderr
    assert "Traceback" not in done.stderr
    shown = blitzq(project, "--json", "config", "show")  # config show marks it, never refuses
    assert shown.returncode == 0, shown.stderr
    assert why in json.loads(shown.stdout)["errors"][f"worker.{key}"]


def test_a_list_of_queues_is_their_comma_joined_form(
    project: Path, redis_url: str, namespace: str
) -> None:
    (project / "pyproject.toml").write_text(
        f'[tool.blitzq]\nredis_url = "{redis_url}"\nnamespace = "{namespace}"\n'
        '[tool.blitzq.worker]\nqueues = ["a", "b"]\nconcurrency = "3"\nburst = true\n'
        'configure = "app:setup"\n'
    )
    done = blitzq(project, "--json", "worker", "app:queue")
    assert done.returncode == 0, done.stderr
    doc = first(done.stdout)
    assert doc["queues"] == ["a", "b"]
    assert doc["concurrency"] == 3


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--redis-url", "redis://127.0.0.1:1/0", "server", "status"], "--redis-url does not"),
        (["--namespace", "a", "--mode", "fast", "server", "stop"], "--mode, --namespace do not"),
        (["server", "status", "--namespace", "a"], "No such option '--namespace'"),
        (["server", "--redis-url", "redis://x", "start"], "No such option '--redis-url'"),
    ],
)
def test_the_server_commands_refuse_the_broker_options(
    project: Path, argv: list[str], error: str
) -> None:
    """``blitzq server ...`` manages the embedded server of a data directory: a typed URL,
    namespace or mode would be ignored, so it is refused (exit 2); in the environment (set
    for the other commands) they are left alone."""
    done = blitzq(project, *argv, env={"BLITZQ_DATA_DIR": str(project / "data")})
    assert done.returncode == 2, done.stderr
    assert error in done.stderr
    assert not (project / "data").exists()  # nothing started
    (project / "pyproject.toml").write_text('[tool.blitzq.server.status]\nnamespace = "a"\n')
    done = blitzq(project, "server", "status")
    assert done.returncode == 78  # the project file's: a configuration error
    assert "'namespace', which is not an option of `blitzq server status`" in done.stderr
    (project / "pyproject.toml").unlink()
    env = {"BLITZQ_REDIS_URL": "redis://127.0.0.1:1/0", "BLITZQ_NAMESPACE": "a"}
    done = blitzq(project, "--json", "server", "status", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["running"] is False
