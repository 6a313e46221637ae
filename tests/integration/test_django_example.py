"""The Django tasks example (examples/django_tasks_app/): ``/result/<id>`` of an id the backend
has no record of answers 404 with a JSON error, not a 500. Run in a subprocess: the example
has settings of its own (``settings``, ``ROOT_URLCONF = "app"``), which cannot share this
process with the other Django tests' settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("django")
try:
    import django.tasks  # noqa: F401
except ImportError:
    pytest.importorskip("django_tasks", reason="needs Django >= 6 or the django-tasks backport")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "django_tasks_app"
pytestmark = pytest.mark.timeout(60)

_SCRIPT = """
import json, django
django.setup()
from django.test import Client
client = Client()
answers = [client.get("/result/" + i) for i in ("no-such-id", "0d9f6c2e-unknown")]
print(json.dumps([[a.status_code, a["Content-Type"], a.content.decode()] for a in answers]))
"""


def test_result_of_an_unknown_id_is_a_404_with_a_json_error(redis_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLITZQ_", "DJANGO_"))}
    env |= {
        "BLITZQ_REDIS_URL": redis_url,
        "BLITZQ_NAMESPACE": "test-djexample",
        "DJANGO_SETTINGS_MODULE": "settings",
        "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(ROOT / "src")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=45,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    for (status, kind, body), task_id in zip(
        answers, ("no-such-id", "0d9f6c2e-unknown"), strict=True
    ):
        assert status == 404, body
        assert kind == "application/json"
        assert json.loads(body) == {"error": f"no task result with id {task_id}"}
