"""``blitzq worker --reload --watch-dir DIR``: a ``.py`` change under an extra directory reloads
the workers, and every start with ``--reload`` logs a WARNING that it is for development.

A real supervisor subprocess on the test Redis (fixtures of ``test_process_control``); waits
are on events (the reload line in the supervisor's output, new worker processes), with
deadlines.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tests.polling import wait_until
from tests.reliability.test_process_control import APP_SOURCE, client, start, workers_are
from tests.reliability.test_supervisor import Supervised

__all__ = ["client", "start"]  # fixtures used here

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
    pytest.mark.timeout(120),
]


def test_a_change_under_a_watch_dir_reloads_the_workers(
    start: Callable[..., Supervised], client: redis.Redis, namespace: str, tmp_path: Path
) -> None:
    pytest.importorskip("watchfiles")
    app_dir, extra = tmp_path / "app", tmp_path / "shared"
    app_dir.mkdir()
    extra.mkdir()
    module = f"watch_app_{uuid.uuid4().hex[:8]}"
    (app_dir / f"{module}.py").write_text(APP_SOURCE.format(value="first"))
    sup = start("--reload", "--watch-dir", str(extra), app=f"{module}:queue", cwd=app_dir)
    (old,) = workers_are(sup, client, namespace, 1)
    output = sup.output()
    assert "WARNING" in output
    assert "--reload is for development only" in output
    assert str(extra) in output
    (extra / "helpers.py").write_text("VALUE = 2\n")
    wait_until(
        lambda: "reloading every worker (changed:" in sup.output(),
        40,
        f"a reload\n{sup.output()}",
    )
    wait_until(lambda: (p := sup.workers()) and old not in p, 40, f"a new worker\n{sup.output()}")
