"""The Docker example (examples/docker/) stays in step with the CLI: every service's command
is a real ``blitzq`` command with real options, every ``BLITZQ_*`` variable is one blitzq
reads, and the image installs blitzq from the local source, never from PyPI (an unrelated
package of that name lives there). Docker itself is not needed."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from blitzq import Queue, config
from blitzq.cli import cli

yaml = pytest.importorskip("yaml")

pytestmark = pytest.mark.timeout(60)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "docker"


def _compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLE / "compose.yaml").read_text())
    return loaded


def _blitzq_services() -> dict[str, dict[str, Any]]:
    """The services that run the example's image (all but the broker)."""
    services = _compose()["services"]
    return {name: s for name, s in services.items() if "build" in s}


def _command_path(argv: list[str]) -> tuple[list[str], list[click.Context]]:
    """The subcommand names of ``blitzq ARGV`` and a click context per level (with the
    automatic ``BLITZQ_...`` prefix the CLI gives each)."""
    assert argv[0] == "blitzq"
    ctx = click.Context(cli, info_name="blitzq", auto_envvar_prefix="BLITZQ")
    contexts, path = [ctx], []
    command: click.Command = cli
    for token in argv[1:]:
        if not isinstance(command, click.Group) or token not in command.commands:
            break
        command = command.commands[token]
        ctx = click.Context(command, parent=ctx, info_name=token)
        contexts.append(ctx)
        path.append(token)
    return path, contexts


def test_compose_broker_keeps_data_and_never_evicts() -> None:
    valkey = _compose()["services"]["valkey"]
    command = " ".join(valkey["command"])
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command
    assert valkey["volumes"]


def test_every_command_and_option_is_real() -> None:
    services = _blitzq_services()
    assert {"worker", "scheduler", "app"} <= set(services)
    runner = CliRunner()
    seen = set()
    for name, service in services.items():
        argv = service["command"]
        if argv[0] != "blitzq":
            assert argv[:2] == ["python", "app.py"], name
            continue
        path, contexts = _command_path(argv)
        assert path, f"{name}: {argv} names no blitzq command"
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, f"{name}: blitzq {' '.join(path)} --help: {result.output}"
        known = {opt for ctx in contexts for p in ctx.command.params for opt in p.opts}
        for token in argv[1 + len(path) :]:
            if token.startswith("-"):
                assert token.split("=")[0] in known, f"{name}: no option {token} in {path}"
        seen.add(" ".join(path))
    assert {"worker", "scheduler run"} <= seen
    worker = services["worker"]
    port = worker["command"][worker["command"].index("--health-port") + 1]
    assert f"127.0.0.1:{port}/ready" in " ".join(worker["healthcheck"]["test"])


def _reads(name: str, contexts: list[click.Context], monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether blitzq reads variable ``name`` (a setting, or an option of one of the
    commands in ``contexts`` through its own or click's automatic variable)."""
    if name == config.CONFIG_ENV or name in {s.env for s in config.SETTINGS}:
        return True
    monkeypatch.setenv(name, "1")
    try:
        return any(
            p.resolve_envvar_value(ctx) == "1"
            for ctx in contexts
            for p in ctx.command.params
            if isinstance(p, click.Option)
        )
    finally:
        monkeypatch.delenv(name)


def test_every_variable_is_read_by_blitzq(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, service in _blitzq_services().items():
        argv = service["command"]
        contexts = _command_path(argv)[1] if argv[0] == "blitzq" else []
        env = service["environment"]
        assert {"BLITZQ_REDIS_URL", "BLITZQ_NAMESPACE"} <= set(env), name
        for variable in env:
            if variable.startswith("BLITZQ_"):
                assert _reads(variable, contexts, monkeypatch), f"{name}: {variable} is not read"
    assert "BLITZQ_WORKER_CONCURRENCY" in _blitzq_services()["worker"]["environment"]


def test_dockerfile_installs_the_local_source() -> None:
    text = (EXAMPLE / "Dockerfile").read_text()
    instructions = "\n".join(
        line for line in text.splitlines() if not line.lstrip().startswith("#")
    )
    installs = re.findall(r"pip install ([^&\n]+)", instructions)
    assert installs
    for line in installs:
        for arg in shlex.split(line):
            if arg.startswith("-"):
                continue
            # a path of the build context (or a wheel built from it), never an index name
            assert arg.startswith(("./", "/", ".")) or arg.endswith(".whl"), arg
    assert "COPY src" in text
    assert "COPY pyproject.toml" in text


def test_the_app_module_loads() -> None:
    spec = importlib.util.spec_from_file_location("docker_example_app", EXAMPLE / "app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert isinstance(module.queue, Queue)
    assert {"checksum", "word_count", "heartbeat"} <= {
        name.rsplit(".", 1)[-1] for name in module.queue.tasks
    }
