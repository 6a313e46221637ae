"""The dead-letter reasons: one constant (:data:`blitzq.dead_letters.DEAD_LETTER_REASONS`)
that every writer in src/ (worker, Lua scripts, AMQP custody, listing) keeps to, that the docs
list in full, and that ``blitzq dead-letter --reason`` checks (exit 2 for another)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from blitzq import ConfigurationError
from blitzq.cli import cli
from blitzq.client.dead_letter_query import DeadLetterFilter
from blitzq.dead_letters import DEAD_LETTER_REASONS, check_reason

pytestmark = pytest.mark.timeout(20)

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "blitzq"

#: How the writers spell a reason they store.
_WRITERS = [
    (".lua", re.compile(r"'reason',\s*'([^']+)'")),  # HSET ... 'reason', 'malformed message'
    (".py", re.compile(r"reject\(\s*d,\s*\"([^\"]+)\"")),  # worker admission
    (".py", re.compile(r"DeadLetterFields\(\s*[\w.]+,\s*\"([^\"]+)\"")),  # failed, expired
    (
        ".py",
        re.compile(r"^(?:\w*_REASON|UNREADABLE_DEAD_LETTER) = \"([^\"]+)\"", re.M),
    ),  # named ones
]


def _written_reasons() -> set[str]:
    found: set[str] = set()
    for path in SRC.rglob("*"):
        for suffix, pattern in _WRITERS:
            if path.suffix == suffix:
                found.update(pattern.findall(path.read_text()))
    return found


def test_every_reason_written_in_src_is_in_the_constant_and_back() -> None:
    assert _written_reasons() == set(DEAD_LETTER_REASONS)


def test_the_docs_list_every_reason() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("## Dead letters") :]
    intro = section[: section.index("```")]
    table_row = next(line for line in section.splitlines() if line.startswith("| `--reason R`"))
    for reason in DEAD_LETTER_REASONS:
        assert f"`{reason}`" in intro, reason
        assert f"`{reason}`" in table_row, reason


@pytest.mark.parametrize("reason", ["bogus", "unknown-task", "Failed", ""])
def test_an_unknown_reason_is_a_usage_error(reason: str) -> None:
    # No server listens on port 1: the option is refused before anything connects.
    for command in (["list"], ["summary"], ["purge", "--yes"], ["replay", "--all"]):
        result = CliRunner().invoke(
            cli,
            ["--redis-url", "redis://127.0.0.1:1/0", "dead-letter", *command, "--reason", reason],
        )
        assert result.exit_code == 2, (command, result.output)
        assert "not one of" in result.output
        assert "'expired'" in result.output
        assert "'unknown task'" in result.output
    with pytest.raises(ConfigurationError, match="unknown task"):
        check_reason(reason)
    with pytest.raises(ConfigurationError):
        DeadLetterFilter(reason=reason)


def test_every_known_reason_is_accepted() -> None:
    for reason in DEAD_LETTER_REASONS:
        assert check_reason(reason) == reason
        assert DeadLetterFilter(reason=reason).reason == reason
    assert check_reason(None) is None
