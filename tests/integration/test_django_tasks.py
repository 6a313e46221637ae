"""Django's tasks framework on blitzq: a Django project enqueues ``@task`` functions through
``BlitzqTaskBackend`` and reads their results through the framework's API, while
``blitzq worker --django`` (a subprocess, as a user runs it) runs them.

Runs with the ``django-tasks`` backport (Python 3.11, Django 4.2-5.2) or Django 6's
``django.tasks`` (Python >= 3.12): ``make test-django6`` runs this file under Django 6, and
:func:`test_django6_interpreter` does when ``BLITZQ_TEST_DJANGO6_PYTHON`` names one.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.polling import wait_until

pytest.importorskip("django")
try:
    import django.tasks  # noqa: F401
except ImportError:
    pytest.importorskip("django_tasks", reason="needs Django >= 6 or the django-tasks backport")

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = "tests.integration.djtasks.settings"
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def ns(redis_url: str) -> Iterator[str]:
    """A namespace for the whole module (one worker serves every test); deleted after."""
    name = "test-dj-" + uuid.uuid4().hex[:12]
    yield name
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match="{" + name + "}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="module")
def project(redis_url: str, ns: str) -> Iterator[Any]:
    """Django set up in this process with the blitzq backend on the test server (settings
    overridden when another test module configured Django first); the tasks module."""
    import django
    from django.conf import settings
    from django.test.utils import override_settings

    from tests.integration.djtasks.settings import tasks_setting

    if not settings.configured:
        settings.configure(
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
        django.setup()
    override = override_settings(TASKS=tasks_setting(redis_url, ns))
    override.enable()
    try:
        from tests.integration.djtasks import tasks

        yield tasks
        tasks.add.get_backend().queue.close_sync()  # the sync API's loop and connections
    finally:
        override.disable()


@pytest.fixture(scope="module")
def worker(project: Any, redis_url: str, ns: str, tmp_path_factory: Any) -> Iterator[Path]:
    """``blitzq worker --django`` in a subprocess; its log file."""
    log = tmp_path_factory.mktemp("djworker") / "worker.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "BLITZQ_REDIS_URL": redis_url,
        "BLITZQ_NAMESPACE": ns,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "blitzq",
                "worker",
                "--django",
                "--concurrency",
                "8",
                "--unknown-task-grace",
                "0",
            ],  # an unknown name is dead-lettered at once
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: "blitzq worker" in log.read_text() or proc.poll() is not None,
            30,
            "the worker to start",
        )
        assert proc.poll() is None, log.read_text()
        yield log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def finished(result: Any, timeout: float = 20) -> Any:
    """Refresh ``result`` until it is finished (through the framework's API); return it."""

    def done() -> bool:
        result.refresh()
        return bool(result.is_finished)

    wait_until(done, timeout, f"task {result.id} to finish", interval=0.05)
    return result


def test_enqueue_and_read_the_result(project: Any, worker: Path) -> None:
    from django.utils import timezone

    result = project.add.enqueue(2, 3)
    assert result.status == "READY"
    assert result.args == [2, 3]
    finished(result)
    assert result.status == "SUCCESSFUL"
    assert result.return_value == 5
    assert result.errors == []
    assert result.attempts == 1
    # host:pid-slot: the supervised worker's stable id, its supervisor's pid before the slot
    assert re.fullmatch(r".+:\d+-0", result.worker_ids[0]), result.worker_ids
    assert result.enqueued_at <= result.started_at <= result.finished_at <= timezone.now()
    assert timezone.is_aware(result.started_at)
    # Another reader (any process) gets it by id through the backend and the task.
    again = project.add.get_result(result.id)
    assert again.status == "SUCCESSFUL"
    assert again.return_value == 5
    assert again.task.func is project.add.func


def test_failure_reads_failed_with_its_error(project: Any, worker: Path) -> None:
    result = finished(project.boom.enqueue("kaboom"))
    assert result.status == "FAILED"
    (error,) = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "ValueError: kaboom" in error.traceback
    assert "raise ValueError(message)" in error.traceback
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_context_async_and_database(project: Any, worker: Path) -> None:
    ctx = project.whoami.enqueue(7)
    pair = project.slow_add.enqueue(1, 2)
    db = project.query.enqueue()
    assert finished(ctx).return_value == {"id": ctx.id, "attempt": 1, "x": 7}
    assert finished(pair).return_value == [1, 2, 3]
    assert finished(db).return_value == 42


def test_priority_and_queue_name_pick_the_blitzq_queue(project: Any, worker: Path) -> None:
    from blitzq.integrations.django_tasks import InvalidTask

    queue = project.add.get_backend().queue
    low = project.add.using(priority=-5).enqueue(1, 1)
    high = project.shout.enqueue("hi")  # queue_name="emails", priority=10
    normal = project.add.using(queue_name="emails").enqueue(2, 2)
    assert queue.inspect_sync(low.id).queue == "default:low"
    assert queue.inspect_sync(high.id).queue == "emails:high"
    assert queue.inspect_sync(normal.id).queue == "emails"
    assert finished(high).return_value == "HI"
    assert finished(normal).task.queue_name == "emails"
    assert project.add.get_result(normal.id).task.queue_name == "emails"
    assert finished(low).return_value == 2
    with pytest.raises(InvalidTask, match="not valid"):
        project.add.using(queue_name="reports")  # not in QUEUES
    with pytest.raises(InvalidTask, match="priority"):
        project.add.using(priority=101)


def test_run_after_defers_the_task(project: Any, worker: Path) -> None:
    from django.utils import timezone

    queue = project.add.get_backend().queue
    when = timezone.now() + timedelta(seconds=2.5)
    result = project.add.using(run_after=when).enqueue(4, 4)
    record = queue.inspect_sync(result.id)
    assert record.state == "scheduled"
    assert record.due_at == pytest.approx(when.timestamp(), abs=0.01)
    result.refresh()
    assert result.status == "READY"
    finished(result)
    assert result.return_value == 8
    assert result.started_at >= when - timedelta(seconds=0.05)  # the broker's clock decides


def test_enqueue_on_commit(project: Any, worker: Path) -> None:
    from django.db import transaction

    from blitzq.integrations.django_tasks import TaskResultDoesNotExist

    with transaction.atomic():
        kept = project.add.enqueue(10, 1)
        with pytest.raises(TaskResultDoesNotExist):  # not published before the commit
            project.add.get_result(kept.id)
    assert finished(kept).return_value == 11

    dropped: list[Any] = []

    def rolled_back() -> None:
        with transaction.atomic():
            dropped.append(project.add.enqueue(20, 2))
            raise LookupError("roll back")

    with pytest.raises(LookupError):
        rolled_back()
    with pytest.raises(TaskResultDoesNotExist):
        project.add.get_result(dropped[0].id)
    queue = project.add.get_backend().queue
    assert queue.stats_sync(["default"])["queues"]["default"]["waiting"] == 0


def test_unknown_names_are_not_run(project: Any, worker: Path) -> None:
    from blitzq.integrations.django_tasks import TaskResultDoesNotExist

    queue = project.add.get_backend().queue
    handle = queue.send_sync("os.getcwd", [], {}, queue="default")
    record = wait_until(
        lambda: (r := queue.inspect_sync(handle.id)) is not None and r.state.is_final and r,
        20,
        "the message to be dead-lettered",
    )
    assert record.state == "dead_lettered"
    assert record.error_type == "unknown task"
    with pytest.raises(TaskResultDoesNotExist):
        project.add.get_result(handle.id)
    with pytest.raises(TaskResultDoesNotExist):
        project.add.get_result("no-such-id")


async def test_async_api(project: Any, worker: Path) -> None:
    import asyncio

    backend = project.add.get_backend()
    backend.enqueue_on_commit = False  # published on this loop, not through sync_to_async
    try:
        result = await project.add.aenqueue(5, 6)
    finally:
        backend.enqueue_on_commit = True
    for _ in range(400):
        await result.arefresh()
        if result.is_finished:
            break
        await asyncio.sleep(0.05)
    assert result.return_value == 11
    with pytest.raises(RuntimeError):  # the sync API refuses to block the event loop
        project.add.enqueue(1, 1)
    await project.add.get_backend().queue.close()


def test_bad_options_are_refused(project: Any) -> None:
    from blitzq.integrations.django_tasks import BlitzqTaskBackend, InvalidTaskBackend

    with pytest.raises(InvalidTaskBackend, match="unknown OPTIONS"):
        BlitzqTaskBackend("x", {"OPTIONS": {"redis": "redis://"}})
    with pytest.raises(InvalidTaskBackend, match="mode"):
        BlitzqTaskBackend("x", {"OPTIONS": {"mode": "turbo"}})
    with pytest.raises(InvalidTaskBackend, match="ends in"):
        BlitzqTaskBackend("x", {"QUEUES": ["mail:high"]})
    with pytest.raises(TypeError):  # the framework's rule: arguments are JSON data
        project.add.enqueue(object(), 1)


def test_the_backend_path_of_the_settings(project: Any) -> None:
    """``TASKS`` names ``blitzq.integrations.django.BlitzqTaskBackend`` (the settings here and
    in the worker subprocess do); the class lives in ``django_tasks``, under either path."""
    from django.conf import settings
    from django.utils.module_loading import import_string

    from blitzq.integrations.django_tasks import BlitzqTaskBackend
    from blitzq.integrations.django_worker import BACKEND_PATHS

    path = settings.TASKS["default"]["BACKEND"]
    assert path == "blitzq.integrations.django.BlitzqTaskBackend"
    assert type(project.add.get_backend()) is BlitzqTaskBackend
    assert {import_string(p) for p in BACKEND_PATHS} == {BlitzqTaskBackend}


def test_the_worker_finds_a_blitzq_backend_under_either_path(
    project: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``blitzq worker --django`` serves the only blitzq alias of ``TASKS``, whichever of the
    two paths names it."""
    from blitzq.integrations import django_worker

    handler = django_worker.fw.framework.task_backends
    monkeypatch.delenv("BLITZQ_DJANGO_BACKEND", raising=False)
    for path in sorted(django_worker.BACKEND_PATHS):
        other = {"BACKEND": "somewhere.else.Backend"}
        monkeypatch.setattr(handler, "settings", {"default": other, "jobs": {"BACKEND": path}})
        assert django_worker._backend_alias() == "jobs"


def test_worker_command_line_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from blitzq.cli import cli

    monkeypatch.delenv("DJANGO_SETTINGS_MODULE", raising=False)
    runner = CliRunner()
    neither = runner.invoke(cli, ["worker"])
    assert neither.exit_code == 2
    assert "give MODULE:ATTR or --django" in neither.output
    both = runner.invoke(cli, ["worker", "app:queue", "--django"])
    assert both.exit_code == 2
    assert "not both" in both.output
    unset = runner.invoke(cli, ["worker", "--django"])
    assert unset.exit_code == 78  # a configuration error, found before any worker starts
    assert "--django needs DJANGO_SETTINGS_MODULE" in unset.output


def test_threads_share_one_queue(project: Any) -> None:
    """Django makes a backend per thread; they share one Queue (connections, sync loop)."""
    import threading

    from blitzq.integrations.django_tasks import framework

    here = framework.task_backends["default"]
    there: list[Any] = []
    thread = threading.Thread(target=lambda: there.append(framework.task_backends["default"]))
    thread.start()
    thread.join(10)
    assert there[0] is not here
    assert there[0].queue is here.queue


@pytest.mark.timeout(180)
def test_django6_interpreter() -> None:
    """This file again under Django 6 (Python >= 3.12), when ``BLITZQ_TEST_DJANGO6_PYTHON``
    names such an interpreter (``make test-django6`` makes one in ``.venv-dj6``)."""
    python = os.environ.get("BLITZQ_TEST_DJANGO6_PYTHON")
    if not python:
        pytest.skip("BLITZQ_TEST_DJANGO6_PYTHON is not set (make test-django6 runs Django 6)")
    version = subprocess.run(
        [python, "-c", "import django, sys; print(django.VERSION[0], sys.version_info[1])"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    assert int(version[0]) >= 6, f"{python} has Django {version[0]}, not 6"
    env = {k: v for k, v in os.environ.items() if k != "BLITZQ_TEST_DJANGO6_PYTHON"}
    env["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "passed" in done.stdout
