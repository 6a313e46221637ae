"""An empty broker URL is refused, never read as "unset": ``Queue(redis_url='')`` and
``BLITZQ_REDIS_URL=`` (set to the empty string) raise ``ConfigurationError`` naming the fix
(leave it out for the embedded server), and the commands exit 78, instead of silently
starting an embedded server in the current directory (docs/configuration.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from blitzq import ConfigurationError, Queue

from .test_exit_codes import APP, blitzq

pytestmark = pytest.mark.timeout(120)


def test_an_empty_redis_url_argument_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"redis_url='' is empty: leave redis_url out"):
        Queue(redis_url="")


async def test_an_empty_environment_variable_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLITZQ_REDIS_URL", "")
    queue = Queue(namespace="empty-url")

    @queue.task
    async def noop() -> None:
        pass

    try:
        with pytest.raises(ConfigurationError, match="BLITZQ_REDIS_URL is set but empty"):
            await noop.enqueue()
    finally:
        await queue.close()
    assert not (tmp_path / ".blitzq").exists()


@pytest.mark.parametrize(
    "args",
    [["worker", APP], ["worker", APP, "--no-supervise"], ["queue", "stats"]],
    ids=lambda a: " ".join(a),
)
def test_commands_exit_78_on_an_empty_environment_variable(args: list[str], tmp_path: Path) -> None:
    code, out = blitzq(*args, env={"BLITZQ_REDIS_URL": ""}, cwd=tmp_path)
    assert code == 78, out
    assert "BLITZQ_REDIS_URL is set but empty" in out
    assert not (tmp_path / ".blitzq").exists()
