"""Whose ``pyproject.toml`` configures blitzq (issue 28, item 2): nothing above the project
root (the first directory holding ``.git`` or a ``pyproject.toml`` of the user or root) is
read, a file another user owns (or every user may write) is refused with a warning, and
``blitzq config show`` names the file used and the files refused.

The tests run as root: a file is made another user's with ``os.chown``, and the rule "the
current user or root" is checked for another current user through ``distrust(path, uid)``.
"""

from __future__ import annotations

import json
import logging
import os
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from blitzq import Queue, config
from blitzq.cli import cli

pytestmark = pytest.mark.timeout(60)

OTHER_UID = 4242  # a user that is not root
THIRD_UID = 4343

PLANTED = """
[tool.blitzq]
namespace = "planted"
redis_url = "redis://attacker.example:6379/0"
[tool.blitzq.worker]
configure = ["planted_module:hook"]
"""


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with no BLITZQ_* variable set; the tests lay out projects under it."""
    for name in ("BLITZQ_REDIS_URL", "BLITZQ_NAMESPACE", "BLITZQ_MODE", "BLITZQ_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def plant(directory: Path, text: str = PLANTED, uid: int | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "pyproject.toml"
    path.write_text(textwrap.dedent(text))
    if uid is not None:
        os.chown(path, uid, uid)
    return path


def worker_configure() -> tuple[str, ...]:
    """The ``--configure`` modules ``blitzq worker`` would import, from the defaults."""
    root = cli.make_context("blitzq", ["worker", "app:queue"])
    sub = cli.commands["worker"].make_context("worker", ["app:queue"], parent=root)
    return tuple(sub.params["configure"])


def test_a_pyproject_above_the_git_root_is_not_read(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant(home)  # above the project: the user's own, but not the project's
    repo = home / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "pkg").mkdir()
    monkeypatch.chdir(repo / "pkg")
    found = config.search()
    assert found.file is None
    assert found.root == repo
    assert Queue().namespace == "blitzq"
    assert config.value("redis_url") is None
    assert worker_configure() == ()
    # A worktree's .git is a file: the same root.
    (repo / ".git").rmdir()
    (repo / ".git").write_text("gitdir: /elsewhere\n")
    assert config.search().root == repo
    assert Queue().namespace == "blitzq"
    # Without the .git the walk goes on, and the file above applies (the user's own).
    (repo / ".git").unlink()
    assert config.project_file() == home / "pyproject.toml"
    assert Queue().namespace == "planted"
    assert worker_configure() == ("planted_module:hook",)


def test_the_users_pyproject_without_a_table_is_the_root(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plant(home)
    project = home / "project"
    plant(project, '[project]\nname = "shop"\n')
    monkeypatch.chdir(project)
    found = config.search()
    assert (found.file, found.root) == (None, project)
    assert Queue().namespace == "blitzq"
    shown = CliRunner().invoke(cli, ["config", "show"])
    assert shown.exit_code == 0, shown.output
    assert "project file: none" in shown.stdout
    assert f"project root: {project}" in shown.stdout


def test_a_file_another_user_owns_is_refused_with_a_warning(
    home: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    shared = home / "shared"
    planted = plant(shared, uid=OTHER_UID)
    monkeypatch.chdir(shared)
    with caplog.at_level(logging.WARNING, logger="blitzq.config"):
        assert Queue().namespace == "blitzq"
        assert config.value("redis_url") is None
        assert worker_configure() == ()
        assert Queue().namespace == "blitzq"
    warnings = [r for r in caplog.records if r.name == "blitzq.config"]
    assert len(warnings) == 1, warnings  # once per file and process
    message = warnings[0].getMessage()
    assert str(planted) in message
    assert f"owned by uid {OTHER_UID}, not by you (uid {os.geteuid()}) or root" in message
    assert "BLITZQ_CONFIG" in message
    found = config.search()
    assert found.file is None
    assert found.refused == ((planted, found.refused[0][1]),)
    # config show says which file was refused and why, in text and in JSON.
    text = CliRunner().invoke(cli, ["config", "show"], env={"COLUMNS": "300"})
    assert text.exit_code == 0, text.output
    assert f"refused: {planted}: owned by uid {OTHER_UID}" in text.stdout
    assert "project file: none" in text.stdout
    doc = json.loads(CliRunner().invoke(cli, ["config", "show", "--json"]).stdout)
    assert doc["file"] is None
    assert doc["refused"] == [{"file": str(planted), "reason": found.refused[0][1]}]


def test_a_refused_file_does_not_hide_the_trusted_one_above_it(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = plant(home, '[tool.blitzq]\nnamespace = "mine"\n')
    plant(home / "inner", uid=OTHER_UID)
    monkeypatch.chdir(home / "inner")
    assert config.project_file() == own
    assert Queue().namespace == "mine"


def test_a_file_every_user_may_write_is_refused(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = plant(home)
    path.chmod(0o666)
    monkeypatch.chdir(home)
    assert config.distrust(path) == "writable by every user (mode 666)"
    assert Queue().namespace == "blitzq"
    path.chmod(0o644)
    assert config.distrust(path) is None
    assert Queue().namespace == "planted"


def test_the_ownership_rule_accepts_the_user_and_root_only(home: Path) -> None:
    theirs = plant(home / "a", uid=OTHER_UID)
    roots = plant(home / "b", uid=0)
    third = plant(home / "c", uid=THIRD_UID)
    # The running user (root here): its own (root's) files only.
    assert config.distrust(roots) is None
    assert config.distrust(theirs) is not None
    # Another running user: its own files and root's, nobody else's.
    assert config.distrust(theirs, uid=OTHER_UID) is None
    assert config.distrust(roots, uid=OTHER_UID) is None
    assert config.distrust(third, uid=OTHER_UID) == (
        f"owned by uid {THIRD_UID}, not by you (uid {OTHER_UID}) or root"
    )
    found = config.search(home / "c", uid=OTHER_UID)
    assert found.refused[0][0] == third
    assert config.search(home / "a", uid=OTHER_UID).file == theirs
    # A link the user owns to another user's file is refused, and so is the reverse.
    link = home / "d" / "pyproject.toml"
    link.parent.mkdir()
    link.symlink_to(third)
    assert config.distrust(link) is not None
    link.unlink()
    link.symlink_to(roots)
    os.lchown(link, OTHER_UID, OTHER_UID)
    assert config.distrust(link) is not None


def test_blitzq_config_names_a_file_whoever_owns_it(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The explicit escape: the user chose the file in the environment."""
    deploy = home / "deploy.toml"
    deploy.write_text('[tool.blitzq]\nnamespace = "deployed"\n')
    os.chown(deploy, OTHER_UID, OTHER_UID)
    monkeypatch.setenv("BLITZQ_CONFIG", str(deploy))
    monkeypatch.chdir(home)
    assert config.project_file() == deploy
    assert Queue().namespace == "deployed"


def test_config_show_names_the_file_used(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = home / "shop"
    (project / ".git").mkdir(parents=True)
    used = plant(project, '[tool.blitzq]\nnamespace = "shop"\n')
    (project / "src").mkdir()
    monkeypatch.chdir(project / "src")
    text = CliRunner().invoke(cli, ["config", "show"], env={"COLUMNS": "300"})
    assert text.exit_code == 0, text.output
    assert text.stdout.splitlines()[0] == f"project file: {used}"
    assert f"{used} [tool.blitzq]" in text.stdout  # the namespace's source
    doc = json.loads(CliRunner().invoke(cli, ["config", "show", "--json"]).stdout)
    assert doc["file"] == str(used)
    assert doc["root"] == str(project)
    assert doc["refused"] == []
