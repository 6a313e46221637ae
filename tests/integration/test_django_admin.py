"""blitzq as a Django app (issue 27, point 6): ``python manage.py blitzq_worker`` runs the
tasks of Django's tasks framework as ``blitzq worker --django`` does, and the admin page of
task records shows the records of the tasks that ran to a logged-in staff user.

The test writes a small Django project of its own (``manage.py``, settings with the admin,
SQLite in the test's tmp dir, a tasks module), enqueues through the framework, runs
``manage.py blitzq_worker --burst`` in a subprocess on the real Redis, then reads the admin
page through Django's test client in another subprocess (the project's settings cannot share
this process with the other Django tests' settings).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

pytest.importorskip("django")
try:
    import django.tasks  # noqa: F401

    FRAMEWORK = "django.tasks"
except ImportError:
    pytest.importorskip("django_tasks", reason="needs Django >= 6 or the django-tasks backport")
    FRAMEWORK = "django_tasks"

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)

SETTINGS = """
import os
SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "Asia/Tokyo"  # shown as JST all year
ROOT_URLCONF = "site_proj.urls"
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "blitzq.integrations.django_app",
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["DB_PATH"]}}
TASKS = {"default": {
    "BACKEND": "blitzq.integrations.django.BlitzqTaskBackend",
    "QUEUES": ["default", "emails"],
    "OPTIONS": {"redis_url": os.environ["BLITZQ_REDIS_URL"],
                "namespace": os.environ["BLITZQ_NAMESPACE"]},
}}
"""

URLS = """
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/blitzq/tasks/", include("blitzq.integrations.django_app.urls")),
    path("admin/", admin.site.urls),
]
"""

TASKS = """
from {framework} import task

@task()
def add(a, b):
    return a + b

@task(queue_name="emails")
def send(to):
    raise ValueError("mailbox full: " + to)
"""

MANAGE = """
import os, sys
if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_proj.settings")
    from django.core.management import execute_from_command_line
    execute_from_command_line(sys.argv)
"""

ENQUEUE = """
import json, django
django.setup()
from shop.tasks import add, send
print(json.dumps({"add": add.enqueue(2, 3).id, "send": send.enqueue("ada@example.com").id,
                  "waiting": add.enqueue(40, 2).id}))
"""

RESULTS = """
import json, sys, django
django.setup()
from shop.tasks import add
out = {}
for i in sys.argv[1:]:
    r = add.get_backend().get_result(i)
    out[i] = r.status
print(json.dumps(out))
"""

ADMIN = """
import json, sys, django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from django.contrib.auth.models import User
from django.test import Client
ids = json.loads(sys.argv[1])
anonymous = Client().get("/admin/blitzq/tasks/")
staff = User.objects.create_user("ops", password="pw", is_staff=True)
plain = User.objects.create_user("joe", password="pw")
client = Client()
client.force_login(staff)
def page(url):
    r = client.get(url)
    return [r.status_code, r.content.decode()]
not_staff = Client()
not_staff.force_login(plain)
print(json.dumps({
    "anonymous": [anonymous.status_code, anonymous.get("Location", "")],
    "not_staff": not_staff.get("/admin/blitzq/tasks/").status_code,
    "all": page("/admin/blitzq/tasks/"),
    "failed": page("/admin/blitzq/tasks/?state=failed&state=dead_lettered"),
    "emails": page("/admin/blitzq/tasks/?queue=emails"),
    "search": page("/admin/blitzq/tasks/?q=" + ids["add"][:12]),
    "detail": page("/admin/blitzq/tasks/" + ids["send"] + "/"),
    "missing": page("/admin/blitzq/tasks/no-such-task/"),
}))
"""


@pytest.fixture
def project(tmp_path: Path, redis_url: str) -> Iterator[tuple[Path, dict[str, str]]]:
    """The project's directory and the environment to run it in (a fresh namespace, deleted
    after)."""
    ns = "test-djadmin-" + uuid.uuid4().hex[:10]
    (tmp_path / "site_proj").mkdir()
    (tmp_path / "site_proj" / "__init__.py").write_text("")
    (tmp_path / "site_proj" / "settings.py").write_text(SETTINGS)
    (tmp_path / "site_proj" / "urls.py").write_text(URLS)
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(TASKS.format(framework=FRAMEWORK))
    (tmp_path / "manage.py").write_text(MANAGE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLITZQ_", "DJANGO_"))}
    env |= {
        "BLITZQ_REDIS_URL": redis_url,
        "BLITZQ_NAMESPACE": ns,
        "DB_PATH": str(tmp_path / "db.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "site_proj.settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "src")]),
    }
    yield tmp_path, env
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match="{" + ns + "}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _python(cwd: Path, env: dict[str, str], *args: str, timeout: float = 60) -> Any:
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_manage_py_blitzq_worker_runs_the_tasks_and_the_admin_lists_them(
    project: tuple[Path, dict[str, str]],
) -> None:
    cwd, env = project
    ids = _python(cwd, env, "-c", ENQUEUE)
    # Only the default queue first: the emails task waits (the positional QUEUE option).
    worker = subprocess.run(
        [sys.executable, "manage.py", "blitzq_worker", "default", "--burst", "-c", "4",
         "--log-level", "info"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert "blitzq worker" in worker.stdout, worker.stdout + worker.stderr
    states = _python(cwd, env, "-c", RESULTS, ids["add"], ids["waiting"], ids["send"])
    assert states == {ids["add"]: "SUCCESSFUL", ids["waiting"]: "SUCCESSFUL", ids["send"]: "READY"}
    # Then every queue of QUEUES (no QUEUE given).
    worker = subprocess.run(
        [sys.executable, "manage.py", "blitzq_worker", "--burst"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stdout + worker.stderr
    states = _python(cwd, env, "-c", RESULTS, ids["send"])
    assert states == {ids["send"]: "FAILED"}

    pages = _python(cwd, env, "-c", ADMIN, json.dumps(ids))
    status, location = pages["anonymous"]
    assert status == 302
    assert "/admin/login/" in location
    assert pages["not_staff"] == 302  # a user without is_staff goes to the login too
    status, html = pages["all"]
    assert status == 200
    for task_id in ids.values():
        assert task_id in html
    assert "shop.tasks.add" in html
    assert "shop.tasks.send" in html
    assert "succeeded" in html
    assert "dead_lettered" in html
    assert "ValueError: mailbox full: ada@example.com" in html
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d JST", html), html  # in TIME_ZONE, named
    status, html = pages["failed"]
    assert status == 200
    assert ids["send"] in html
    assert ids["add"] not in html
    assert ids["waiting"] not in html
    status, html = pages["emails"]
    assert status == 200
    assert ids["send"] in html
    assert ids["add"] not in html
    status, html = pages["search"]
    assert status == 200
    assert ids["add"] in html
    assert ids["send"] not in html
    assert ids["waiting"] not in html
    status, html = pages["detail"]
    assert status == 200
    assert "Traceback" in html
    assert "mailbox full" in html
    assert pages["missing"][0] == 404


def test_a_bad_worker_option_exits_2_naming_it(project: tuple[Path, dict[str, str]]) -> None:
    cwd, env = project
    done = subprocess.run(
        [sys.executable, "manage.py", "blitzq_worker", "--burst", "-c", "0"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--concurrency" in done.stderr
    assert "Traceback" not in done.stderr
