"""Settings without code (issue 12, "Settings"): ``[tool.blitzq]`` in pyproject.toml and the
``BLITZQ_*`` variables, with their precedence (argument > environment > file > default), and
``blitzq config show``."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from blitzq import ConfigurationError, Queue
from blitzq.cli import cli

CLEAN = {"BLITZQ_REDIS_URL": "", "BLITZQ_NAMESPACE": "", "BLITZQ_MODE": "", "BLITZQ_CONFIG": ""}


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project directory (the current directory) with no BLITZQ_* variables set."""
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(project: Path, text: str) -> None:
    (project / "pyproject.toml").write_text(textwrap.dedent(text))


def test_queue_reads_the_project_table_below_the_environment(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project, '[tool.blitzq]\nnamespace = "shop"\nmode = "fast"\n')
    (project / "sub").mkdir()
    monkeypatch.chdir(project / "sub")  # the nearest pyproject.toml upwards
    assert Queue().namespace == "shop"
    assert Queue().mode == "fast"
    monkeypatch.setenv("BLITZQ_NAMESPACE", "from-env")
    assert Queue().namespace == "from-env"
    assert Queue(namespace="explicit").namespace == "explicit"


def test_a_typo_in_the_table_is_an_error_naming_the_file(project: Path) -> None:
    write(project, '[tool.blitzq]\nnamspace = "shop"\n')
    with pytest.raises(ConfigurationError, match=r"pyproject.toml: unknown setting 'namspace'"):
        Queue()
    result = CliRunner().invoke(cli, ["config", "show"])
    assert result.exit_code == 78  # a configuration error (EX_CONFIG), not a usage error
    assert "unknown setting 'namspace'" in result.output


def test_cli_options_come_from_the_command_tables(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        project,
        """
        [tool.blitzq]
        namespace = "shop"
        [tool.blitzq.worker]
        concurrency = 7
        unknown-task-grace = 12.5
        """,
    )

    def parsed(*args: str) -> dict[str, object]:
        root = cli.make_context("blitzq", ["worker", *args])
        sub = cli.commands["worker"].make_context("worker", list(args), parent=root)
        return dict(sub.params)

    params = parsed("app:queue")
    assert params["concurrency"] == 7
    (project / "pyproject.toml").unlink()  # no file: the option's own default
    default = next(p.default for p in cli.commands["worker"].params if p.name == "concurrency")
    assert parsed("app:queue")["concurrency"] == default != 7
    write(project, "[tool.blitzq.worker]\nconcurrency = 7\n")
    assert params["unknown_task_grace"] == 12.5
    monkeypatch.setenv("BLITZQ_WORKER_CONCURRENCY", "9")  # click's automatic variable
    assert parsed("app:queue")["concurrency"] == 9
    assert parsed("app:queue", "-c", "11")["concurrency"] == 11
    write(project, "[tool.blitzq.worker]\nconcurency = 7\n")
    result = CliRunner().invoke(cli, ["queue", "stats"])
    assert result.exit_code == 78
    assert "'concurency', which is not an option of `blitzq worker`" in result.output
    write(project, "[tool.blitzq.wrker]\nconcurrency = 7\n")
    result = CliRunner().invoke(cli, ["queue", "stats"])
    assert result.exit_code == 78
    assert "[tool.blitzq.wrker] names no command" in result.output


def test_cli_global_settings_and_config_show(
    project: Path, redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project, f'[tool.blitzq]\nredis_url = "{redis_url}"\nnamespace = "{namespace}"\n')
    stats = CliRunner().invoke(cli, ["queue", "stats", "--json"])
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.stdout)["namespace"] == namespace
    shown = CliRunner().invoke(cli, ["config", "show", "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    rows = {row["name"]: row for row in doc["settings"]}
    assert doc["file"] == str(project / "pyproject.toml")
    assert rows["namespace"]["value"] == namespace
    assert rows["namespace"]["source"].endswith("pyproject.toml [tool.blitzq]")
    assert rows["mode"]["source"] == "default"
    assert rows["mode"]["value"] == "reliable"  # the value that applies, not a blank
    assert rows["amqp_url"]["value"] is None
    assert rows["amqp_url"]["unset"].startswith("none")
    human = CliRunner().invoke(cli, ["config", "show"])
    assert human.exit_code == 0, human.output
    lines = {line.split()[0]: line for line in human.stdout.splitlines() if line.strip()}
    assert f"{project / 'pyproject.toml'} [tool.blitzq]" in lines["namespace"]  # not eaten
    assert lines["mode"].split()[1:3] == ["reliable", "default"]
    assert "- (the embedded server)" not in lines["redis_url"]  # set in the file
    assert "(none: messages travel on the Redis server)" in lines["amqp_url"]
    monkeypatch.setenv("BLITZQ_NAMESPACE", "other")
    rows = {r["name"]: r for r in json.loads(
        CliRunner().invoke(cli, ["config", "show", "--json"]).output)["settings"]}  # fmt: skip
    assert rows["namespace"] == {
        "name": "namespace", "value": "other", "source": "env BLITZQ_NAMESPACE",
        "env": "BLITZQ_NAMESPACE",
    }  # fmt: skip
    typed = CliRunner().invoke(cli, ["--namespace", "typed", "config", "show"])
    assert "command line" in typed.output
    # BLITZQ_CONFIG names another file.
    other = project / "deploy.toml"
    other.write_text('[tool.blitzq]\nmode = "fast"\n')
    monkeypatch.setenv("BLITZQ_CONFIG", str(other))
    assert Queue(redis_url=redis_url).mode == "fast"


def test_each_level_of_the_precedence_for_an_application_module(
    project: Path, redis_url: str, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a deployment meets it: ``blitzq check MODULE:ATTR`` on a module whose Queue passes
    its own namespace (``coded``) and one that leaves it unset (``plain``). A typed flag wins
    over the module; the environment and the file only fill in what the module left unset."""
    module = f"precedence_app_{namespace.replace('-', '_')}"
    (project / f"{module}.py").write_text(
        'from blitzq import Queue\n\ncoded = Queue(namespace="from-code")\nplain = Queue()\n'
    )
    monkeypatch.setattr(sys, "path", list(sys.path))  # the CLI puts the cwd first on it

    def namespace_of(attr: str, *flags: str, **env: str) -> str:
        sys.modules.pop(module, None)  # a fresh import: a typed flag changes the module's Queue
        variables: dict[str, str | None] = dict.fromkeys((*CLEAN, "BLITZQ_AMQP_URL"))
        variables.update(env, BLITZQ_REDIS_URL=redis_url)
        result = CliRunner().invoke(
            cli, [*flags, "--json", "check", f"{module}:{attr}"], env=variables
        )
        assert result.exit_code in (0, 78), result.output  # 78: a warning of the shared server
        return str(json.loads(result.stdout)["namespace"])

    assert namespace_of("plain") == "blitzq"  # the default
    assert namespace_of("coded") == "from-code"
    write(project, '[tool.blitzq]\nnamespace = "from-file"\n')
    assert namespace_of("plain") == "from-file"
    assert namespace_of("coded") == "from-code"
    assert namespace_of("plain", BLITZQ_NAMESPACE="from-env") == "from-env"
    assert namespace_of("coded", BLITZQ_NAMESPACE="from-env") == "from-code"
    for attr in ("plain", "coded"):
        assert namespace_of(attr, "--namespace", "typed", BLITZQ_NAMESPACE="from-env") == "typed"
    sys.modules.pop(module, None)


def test_a_subcommand_of_a_group_reads_its_nested_table_and_variable(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        project,
        '[tool.blitzq]\nlog_level = "debug"\n[tool.blitzq.scheduler.run]\npoll-interval = 2.5\n',
    )
    monkeypatch.delenv("BLITZQ_SCHEDULER_RUN_POLL_INTERVAL", raising=False)
    monkeypatch.delenv("BLITZQ_LOG_LEVEL", raising=False)
    group = cli.commands["scheduler"]
    assert isinstance(group, click.Group)

    def parsed(*flags: str) -> dict[str, object]:
        root = cli.make_context("blitzq", ["scheduler", "run", "app:queue", *flags])
        middle = group.make_context("scheduler", ["run", "app:queue"], parent=root)
        run = group.commands["run"].make_context("run", ["app:queue", *flags], parent=middle)
        return {"poll_interval": run.params["poll_interval"], "log_level": run.params["log_level"]}

    assert parsed() == {"poll_interval": 2.5, "log_level": "debug"}  # the file
    monkeypatch.setenv("BLITZQ_SCHEDULER_RUN_POLL_INTERVAL", "4")
    monkeypatch.setenv("BLITZQ_LOG_LEVEL", "warning")
    assert parsed() == {"poll_interval": 4.0, "log_level": "warning"}  # the environment
    assert parsed("--poll-interval", "0.5")["poll_interval"] == 0.5  # the command line


def test_a_relative_data_dir_of_the_file_is_relative_to_the_file(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command run in a subdirectory of the project meets the same embedded server as a
    worker run at its root (the "my task never runs" trap of a cwd-relative data dir)."""
    from blitzq.broker.redis.embedded import data_dir_from_env, find_data_dir

    monkeypatch.delenv("BLITZQ_DATA_DIR", raising=False)
    write(project, '[tool.blitzq]\ndata_dir = "var/bq"\n')
    (project / "src" / "app").mkdir(parents=True)
    for cwd in (project, project / "src" / "app"):
        monkeypatch.chdir(cwd)
        assert data_dir_from_env() == project / "var" / "bq"
        assert find_data_dir() == project / "var" / "bq"
        root = cli.make_context("blitzq", ["server", "status"])
        server = cli.commands["server"]
        assert isinstance(server, click.Group)
        middle = server.make_context("server", ["status"], parent=root)
        status = server.commands["status"].make_context("status", [], parent=middle)
        assert status.params["data_dir"] == project / "var" / "bq"  # --data-dir's default
        shown = json.loads(CliRunner().invoke(cli, ["config", "show", "--json"]).stdout)
        row = next(r for r in shown["settings"] if r["name"] == "data_dir")
        assert row["value"] == str(project / "var" / "bq")
    monkeypatch.setenv("BLITZQ_DATA_DIR", "here")  # the variable: relative to the cwd
    assert data_dir_from_env() == project / "src" / "app" / "here"


def test_an_invalid_setting_names_its_origin_and_config_show_marks_it(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project, '[tool.blitzq]\nmode = "fsat"\n[tool.blitzq.worker]\nshutdown_timeout = "abc"\n')
    where = f"{project / 'pyproject.toml'} [tool.blitzq]"
    with pytest.raises(ConfigurationError, match=r"pyproject.toml \[tool.blitzq\]: mode must"):
        Queue()
    refused = CliRunner().invoke(cli, ["queue", "stats"])
    assert refused.exit_code == 78  # from the project file: a configuration error
    assert f"Invalid value for '--mode' (from {where} mode)" in refused.stderr
    assert "env var" not in refused.stderr
    monkeypatch.setenv("BLITZQ_MODE", "x")
    assert "(from env var BLITZQ_MODE)" in CliRunner().invoke(cli, ["queue", "stats"]).stderr
    assert (
        "(from the command line)" in CliRunner().invoke(cli, ["--mode", "y", "task", "list"]).stderr
    )
    monkeypatch.delenv("BLITZQ_MODE")
    shown = CliRunner().invoke(cli, ["--json", "config", "show"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    mode = next(r for r in doc["settings"] if r["name"] == "mode")
    assert mode["value"] == "fsat"
    assert mode["source"] == where
    assert mode["error"] == "'fsat' is not one of 'reliable', 'fast'"
    assert doc["errors"] == {"worker.shutdown_timeout": "'abc' is not a number of seconds"}
    human = CliRunner().invoke(cli, ["config", "show"])
    assert human.exit_code == 0, human.output
    assert "INVALID: 'fsat' is not one of 'reliable', 'fast'" in human.stdout
    assert "shutdown_timeout: INVALID: 'abc' is not a number of seconds" in human.stdout


def test_an_empty_global_option_is_refused_not_a_fallback(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BLITZQ_NAMESPACE", "from-env")
    for option in ("--namespace", "--redis-url", "--amqp-url"):
        result = CliRunner().invoke(cli, [option, "", "queue", "stats"])
        assert result.exit_code == 2, (option, result.output)
        assert f"Invalid value for '{option}' (from the command line): must not be empty" in (
            result.stderr
        )
    with pytest.raises(ConfigurationError, match="namespace must be a non-empty"):
        Queue(namespace="")


def test_usage_errors_under_json_print_the_error_document(project: Path) -> None:
    for argv in (
        ["--json", "dead-letter", "list", "--reason", "bogus"],
        ["dead-letter", "list", "--json", "--reason", "bogus"],
        ["--json", "schedule", "add", "n", "--task", "t", "--every", "0.5"],
        ["--json", "task", "list", "--no-such-option"],
        ["--json", "no-such-command"],
    ):
        result = CliRunner().invoke(cli, argv)
        assert result.exit_code == 2, (argv, result.output)
        doc = json.loads(result.stdout)
        assert doc["exit_code"] == 2
        assert doc["error"]
    every = CliRunner().invoke(
        cli, ["--json", "schedule", "add", "n", "--task", "t", "--every", "0.5"]
    )
    assert "range 1 to" in json.loads(every.stdout)["error"]
    nan = CliRunner().invoke(
        cli,
        ["--json", "schedule", "add", "n", "--task", "t", "--every", "5", "--args", '[{"x": NaN}]'],
    )
    assert nan.exit_code == 2
    assert "NaN is not a JSON number" in json.loads(nan.stdout)["error"]
