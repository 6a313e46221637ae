"""The newcomer's path in the files a new user reads (issue 12): how to install this project
(never ``blitzq`` from PyPI, an unrelated package of that name), what ``make demo`` installs,
where the ``blitzq`` command is after it, and the order of the Quick start. No server needed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]

#: ``pip install blitzq``, ``pip install 'blitzq[x]'``, ``uv add blitzq``... : a requirement
#: named ``blitzq`` that an installer would fetch from the index.
FROM_INDEX = re.compile(
    r"""(?:pip3?\s+install|uv\s+(?:pip\s+install|add)|poetry\s+add)(?:\s+-\S+)*\s+['"]?blitzq\b"""
)
#: A line that warns against it is fine ("never `pip install blitzq`").
WARNING = re.compile(r"\b(never|not|unrelated|another package|different package)\b", re.I)


def _read_by_users() -> list[Path]:
    """README, docs, examples, the Makefile and every source file (its error messages)."""
    files = [ROOT / "README.md", ROOT / "Makefile", ROOT / "pyproject.toml"]
    for folder, patterns in (
        ("docs", ("*.md",)),
        ("examples", ("*.py", "*.md", "Dockerfile", "*.yaml", "*.toml", "*.txt")),
        ("src", ("*.py",)),
        ("bench", ("*.py", "*.md")),
    ):
        for pattern in patterns:
            files.extend((ROOT / folder).rglob(pattern))
    return sorted(set(files))


def test_no_file_points_at_the_blitzq_of_the_package_index() -> None:
    offending = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _read_by_users()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FROM_INDEX.search(line) and not WARNING.search(line)
    ]
    assert offending == [], "install from the checkout (pip install -e '.[extra]'):\n" + "\n".join(
        offending
    )


#: ``blitzq[metrics]`` written as what to install: the index's package with an extra.
EXTRA_OF_INDEX = re.compile(r"\bblitzq\[[a-z]")


def test_no_file_names_an_extra_as_blitzq_of_the_index() -> None:
    """A help text or table saying "needs blitzq[metrics]" sends a user to the index too."""
    offending = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _read_by_users()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if EXTRA_OF_INDEX.search(line) and not WARNING.search(line)
    ]
    assert offending == [], "name the extra of the checkout (pip install -e '.[extra]'):\n" + (
        "\n".join(offending)
    )


def test_the_pattern_catches_the_forms_users_type() -> None:
    for line in (
        "pip install blitzq",
        "pip install 'blitzq[metrics]'",
        'pip install -U "blitzq[fastapi]"',
        "uv add blitzq",
    ):
        assert FROM_INDEX.search(line), line
    for line in ("pip install -e '.[metrics]'", "pip install dist/blitzq-1.0-py3-none-any.whl"):
        assert not FROM_INDEX.search(line), line


def _recipe(makefile: str, target: str) -> tuple[str, list[str]]:
    """The prerequisites and recipe lines of ``target`` in the Makefile."""
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", makefile, re.M)
    assert match, f"no rule for {target}"
    return match.group(1), [line.strip() for line in match.group(2).splitlines()]


def test_make_demo_installs_only_the_runtime_dependencies() -> None:
    makefile = (ROOT / "Makefile").read_text()
    prerequisites, _ = _recipe(makefile, "demo")
    assert prerequisites.split() == ["$(RUNTIME)"]
    _, recipe = _recipe(makefile, "$(RUNTIME)")
    installs = [line for line in recipe if "pip install" in line and "--upgrade pip" not in line]
    assert installs == ["$(PY) -m pip install -q -e ."]  # no extras: no dev set


def test_the_fastapi_extra_has_the_server_its_example_runs_on() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert any(req.startswith("uvicorn") for req in extras["fastapi"])
    example = (ROOT / "examples" / "fastapi_app.py").read_text()
    assert "uvicorn" in example
    assert 'pip install -e ".[fastapi]"' in example


def _section(readme: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", readme, re.M | re.S)
    assert match, f"README has no section {title!r}"
    return match.group(1)


def test_readme_says_where_the_blitzq_command_is() -> None:
    readme = (ROOT / "README.md").read_text()
    for title in ("Installing", "Command line"):
        section = _section(readme, title)
        assert ".venv/bin/blitzq" in section, title
        assert "source .venv/bin/activate" in section, title


def test_quick_start_starts_a_worker_before_enqueueing() -> None:
    quick = _section((ROOT / "README.md").read_text(), "Quick start")
    worker = quick.index("blitzq worker tasks:queue")
    assert quick.index("Start a worker first") < worker < quick.index("# main.py")
    # Where the command is, and that the producer runs beside the worker (embedded server).
    assert ".venv/bin/blitzq" in quick
    assert "from the same directory" in quick
    assert ".venv/bin/python main.py" in quick
    assert "ResultTimeout" in quick
    assert "troubleshooting" in quick


def test_troubleshooting_covers_a_task_that_never_runs() -> None:
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert any("worker" in h and "queue" in h for h in headings)  # the queue nobody reads
    assert any("same server" in h for h in headings)  # the embedded server of the cwd
    assert any("namespace" in h for h in headings)
    assert "./.blitzq" in text
    assert "BLITZQ_DATA_DIR" in text
    assert "-Q emails" in text
    readme = (ROOT / "README.md").read_text()
    assert "docs/troubleshooting.md" in _section(readme, "Quick start")
