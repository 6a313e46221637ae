"""``import blitzq.cli`` and ``blitzq --help`` load no queue, broker, event loop or rich: the
root group imports each command's module when that command is used (``cli/root.py``,
:class:`~blitzq.cli.LazyCommands`), and what it lists without importing matches the commands."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from blitzq.cli import COMMANDS, WORKER_ADMIN, cli

pytestmark = pytest.mark.timeout(60)

#: Modules that a command's callback may load, never the import of the CLI or its help.
HEAVY = ("blitzq.queue", "blitzq.worker", "redis", "asyncio", "rich", "croniter", "msgspec")

_PROBE = """
import json, sys
from blitzq.cli import main
if sys.argv[1:] == ["--help"]:
    try:
        main(["--help"])
    except SystemExit:
        pass
heavy = sorted(m for m in sys.modules if any(m == h or m.startswith(h + ".") for h in %r))
print(json.dumps(heavy), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [[], ["--help"]], ids=["import", "help"])
def test_the_cli_loads_nothing_heavy(argv: list[str], tmp_path: object) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE % (HEAVY,), *argv],
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
        cwd=str(tmp_path),  # no pyproject.toml with a [tool.blitzq] table above it
    )
    loaded = json.loads(done.stderr.strip().splitlines()[-1])
    assert loaded == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_listed_help_is_the_commands_own(name: str) -> None:
    command = cli.commands[name]
    assert command.name == name
    stand_in = click.Command(name, short_help=COMMANDS[name][2], help=COMMANDS[name][3])
    for limit in (30, 45, 80, 200):
        assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit)


def test_every_command_is_listed_and_wired() -> None:
    assert sorted(cli.commands) == sorted(COMMANDS)
    worker = cli.commands["worker"]
    redis_url = next(p for p in worker.params if p.name == "redis_url")
    assert isinstance(redis_url, click.Option)
    assert isinstance(redis_url.envvar, list)
    assert redis_url.envvar[0] == "BLITZQ_WORKER_REDIS_URL"


def test_worker_admin_names_match_the_group() -> None:
    from blitzq.cli.workers import worker_admin_group

    assert set(worker_admin_group.commands) == WORKER_ADMIN
