"""The machine-readable spec (``python -m blitzq.spec``): the committed files under docs/ are
what the code gives, byte for byte; generation is deterministic (no environment, project file
or memory address leaks in); ``--check`` names stale files; and the spec says what the code
does (every exception and its CLI exit code, every option's variable as click reads it, every
constructor parameter, the envelope's fields)."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

import blitzq
from blitzq import exceptions
from blitzq.cli import cli
from blitzq.cli.workers import worker_admin_group
from blitzq.serialization import Envelope
from blitzq.spec import REGENERATE, generate, main, stale

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

pytestmark = pytest.mark.timeout(120)


def spec(name: str) -> Any:
    """A committed spec file, parsed."""
    return json.loads((DOCS / "spec" / name).read_text(encoding="utf-8"))


def test_committed_spec_is_current() -> None:
    """Regenerating gives the committed files byte for byte."""
    old = stale(DOCS)
    assert not old, (
        f"the machine-readable spec is stale: {', '.join(old)}; regenerate it from the "
        f"repository root with `{REGENERATE}` and commit the result"
    )


def test_generation_ignores_the_environment_and_project_file(tmp_path: Path) -> None:
    """``--check`` in another directory with a [tool.blitzq] table and BLITZQ_* variables set
    still finds the committed files current: none of it leaks into the output."""
    (tmp_path / "pyproject.toml").write_text(
        '[tool.blitzq]\nnamespace = "other"\n[tool.blitzq.worker]\nconcurrency = 7\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env.update(
        PYTHONPATH=str(ROOT / "src"),
        BLITZQ_NAMESPACE="elsewhere",
        BLITZQ_WORKER_CONCURRENCY="3",
        BLITZQ_REDIS_URL="redis://example.invalid:1/0",
        PYTHONHASHSEED="12345",
    )
    done = subprocess.run(
        [sys.executable, "-m", "blitzq.spec", "--check", "--docs", str(DOCS)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stderr


def test_output_is_deterministic_and_address_free() -> None:
    first, second = generate(DOCS), generate(DOCS)
    assert first == second
    for name, text in first.items():
        assert " at 0x" not in text, name
        assert str(ROOT) not in text, name  # no path of this checkout
        if name.endswith(".json"):
            data = json.loads(text)
            assert text == json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_check_names_stale_files_and_write_fixes_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for page in DOCS.glob("*.md"):
        shutil.copy(page, docs / page.name)
    assert main(["--docs", str(docs), "--check"]) == 1  # nothing written yet
    assert "spec/errors.json" in capsys.readouterr().err
    assert main(["--docs", str(docs)]) == 0
    assert main(["--docs", str(docs), "--check"]) == 0
    for name in generate(docs):
        assert (docs / name).read_bytes() == (DOCS / name).read_bytes(), name
    (docs / "spec" / "cli.json").write_text("{}\n")
    (docs / "llms.txt").unlink()
    assert main(["--docs", str(docs), "--check"]) == 1
    err = capsys.readouterr().err
    assert "spec/cli.json" in err
    assert "llms.txt" in err
    assert "spec/errors.json" not in err
    assert REGENERATE in err
    assert main(["--docs", str(tmp_path / "missing")]) == 2


# ------------------------------------------------------------------- the spec is the code
def test_every_exception_class_is_listed_with_its_exit_code() -> None:
    listed = {e["name"]: e for e in spec("errors.json")["errors"]}
    classes = {
        name
        for name, obj in vars(exceptions).items()
        if isinstance(obj, type)
        and issubclass(obj, BaseException)
        and obj.__module__ == "blitzq.exceptions"
    }
    assert set(listed) == classes
    assert listed["ConfigurationError"]["cli_exit_code"] == 78  # EX_CONFIG, every command
    assert listed["BrokerError"]["cli_exit_code"] == 1
    assert listed["TaskFailed"]["cli_exit_code"] == 1
    assert listed["Retry"]["cli_exit_code"] is None  # raised in tasks, not met by the CLI
    assert listed["NoRetry"]["base"] == "Exception"
    assert listed["MessageTooLarge"]["base"] == "SerializationError"
    for name, entry in listed.items():
        assert entry["summary"], name
        assert entry["public"] == (name in blitzq.__all__)


def _contexts() -> list[tuple[click.Command, click.Context]]:
    """Every command with a context chained as the ``blitzq`` group makes them."""
    out = []

    def walk(command: click.Command, ctx: click.Context) -> None:
        out.append((command, ctx))
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, click.Context(sub, parent=ctx, info_name=name))

    root = click.Context(cli, info_name="blitzq", auto_envvar_prefix="BLITZQ")
    walk(cli, root)
    # `blitzq worker list|shutdown`: the root group resolves them to this group (cli/workers.py).
    admin = click.Context(worker_admin_group, parent=root, info_name="worker")
    for name, sub in worker_admin_group.commands.items():
        walk(sub, click.Context(sub, parent=admin, info_name=name))
    return out


def test_every_option_variable_is_the_one_click_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    by_command = {c["command"]: c for c in spec("cli.json")["commands"]}
    checked = 0
    for command, ctx in _contexts():
        entry = by_command[ctx.command_path]
        listed = {p["param"]: p for p in entry["params"] if p["kind"] == "option"}
        for param in command.params:
            if not isinstance(param, click.Option) or param.hidden:
                continue
            (env,) = listed[param.name]["env"][:1]
            assert env.startswith("BLITZQ_"), (ctx.command_path, param.name)
            monkeypatch.setenv(env, "spec-probe")
            assert param.resolve_envvar_value(ctx) == "spec-probe", (ctx.command_path, env)
            monkeypatch.delenv(env)
            checked += 1
    assert checked > 100
    config = spec("config.json")
    assert len(config["cli_options"]) == checked


def test_ranges_and_choices_come_from_click() -> None:
    worker = next(c for c in spec("cli.json")["commands"] if c["command"] == "blitzq worker")
    params = {p["name"]: p for p in worker["params"]}
    assert params["--concurrency"]["range"]["min"] == 1
    assert params["--concurrency"]["default"] == 100
    assert params["--concurrency"]["env"] == ["BLITZQ_WORKER_CONCURRENCY"]
    assert params["--log-format"]["choices"] == ["text", "json"]
    assert params["--burst-idle-timeout"]["range"] == {"finite": True, "max": 86400.0, "min": 0.0}
    # its own variable, below the command's (which click reads first)
    assert params["--workers"]["env"] == ["BLITZQ_WORKER_WORKERS", "BLITZQ_WORKERS"]
    assert params["--redis-url"]["env"] == ["BLITZQ_WORKER_REDIS_URL", "BLITZQ_REDIS_URL"]
    assert params["--watch-dir"]["multiple"] is True
    codes = {c["code"] for c in spec("cli.json")["exit_codes"]}
    assert codes == {0, 1, 2, 71, 75, 78}


def test_constructor_parameters_are_the_signatures() -> None:
    constructors = spec("config.json")["constructors"]
    for name, cls in (("Queue", blitzq.Queue), ("Worker", blitzq.Worker)):
        names = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        assert [p["name"] for p in constructors[name]] == names
    worker = {p["name"]: p for p in constructors["Worker"]}
    queue = {p["name"]: p for p in constructors["Queue"]}
    assert worker["burst_idle_timeout"] == {
        **worker["burst_idle_timeout"],
        "annotation": "float",
        "default": 0.0,
        "units": "seconds",
    }
    assert worker["max_memory_per_child"]["units"] == "megabytes"
    assert worker["queue"]["required"] is True
    assert queue["max_message_size"]["units"] == "bytes"
    assert queue["max_deliveries"]["units"] is None
    assert queue["visibility_timeout"]["default"] == 60.0
    policy = {p["name"]: p for p in constructors["RetryPolicy"]}
    assert policy["backoff"]["default"] == "exponential"


def test_settings_are_config_settings() -> None:
    from blitzq.config import SETTINGS

    listed = {s["name"]: s for s in spec("config.json")["settings"]}
    assert set(listed) == {s.name for s in SETTINGS}
    for s in SETTINGS:
        assert listed[s.name]["env"] == s.env
        assert listed[s.name]["default"] == s.default


def test_message_schemas_follow_the_structs() -> None:
    messages = spec("messages.json")
    assert [f["name"] for f in messages["envelope_fields"]] == list(Envelope.__struct_fields__)
    assert all(f["doc"] for f in messages["envelope_fields"])
    schemas = messages["schemas"]
    assert {"Envelope", "TaskRecord", "DeadLetter", "Progress"} <= set(schemas)
    assert len(schemas["Envelope"]["prefixItems"]) == len(Envelope.__struct_fields__)
    refs = re.findall(r'"\$ref": "#/schemas/([^"]+)"', json.dumps(messages))
    assert refs, "TaskRecord.state refers to TaskState"
    assert set(refs) <= set(schemas)  # every reference resolves inside the file


def test_llms_txt_links_every_page_and_spec_file() -> None:
    text = (DOCS / "llms.txt").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == "# blitzq"
    assert lines[2].startswith("> ")
    for page in DOCS.glob("*.md"):
        assert f"]({page.name})" in text, page.name
    for name in ("errors", "config", "cli", "messages"):
        assert f"](spec/{name}.json)" in text
    for target in [line.split("](")[1].split(")")[0] for line in lines if "](" in line]:
        assert (DOCS / target).is_file(), target
