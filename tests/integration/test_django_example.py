"""The Django tasks example (examples/django_tasks_app/), run as its docstring and
docs/integrations.md tell a user to: ``blitzq worker --django`` and ``python app.py runserver``
from the example's directory, a signup POSTed to the dev server, its ``/result/<id>`` polled
until the worker's return value is there; the signup view published on commit and not at all
on rollback; and ``/result/<id>`` of an id the backend has no record of answers 404 with a
JSON error, not a 500. Everything runs in subprocesses: the
example has settings of its own (``settings``, ``ROOT_URLCONF = "app"``), which cannot share
this process with the other Django tests' settings."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.polling import wait_until
from tests.ports import free_port

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


@pytest.fixture
def example_ns(redis_url: str) -> Iterator[str]:
    """A namespace of this test's own; its keys are deleted after."""
    name = "test-djexample-" + uuid.uuid4().hex[:12]
    yield name
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match="{" + name + "}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


#: No proxy for the dev server on 127.0.0.1, whatever ``http_proxy`` the environment has.
_HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _http(url: str, form: dict[str, str] | None = None) -> tuple[int, Any]:
    """GET ``url`` (POST ``form``, form-encoded as ``curl -d`` sends it): status, JSON body."""
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    try:
        with _HTTP.open(url, data=data, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.timeout(120)
def test_signup_through_the_dev_server_and_a_worker(
    redis_url: str, example_ns: str, tmp_path: Path
) -> None:
    """The README's session: the worker (``DJANGO_SETTINGS_MODULE=settings blitzq worker
    --django``) and the dev server (``python app.py runserver PORT --noreload``) started from
    the example's directory on the test Redis and a namespace of their own, the SQLite file in
    ``tmp_path`` (the example puts it in ``tempfile.gettempdir()``, so ``TMPDIR``). A signup
    enqueues ``send_welcome`` inside ``transaction.atomic()``, published on commit; the task
    reads the row back in the worker, and its return value comes back through
    ``/result/<id>``. (Whether the publish waits for the commit is not decided here: a message
    published before it would usually still find the row; the next test decides it.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLITZQ_", "DJANGO_"))}
    env |= {
        "BLITZQ_REDIS_URL": redis_url,
        "BLITZQ_NAMESPACE": example_ns,
        "TMPDIR": str(tmp_path),
        # This checkout's blitzq; the example's directory is not on it: each command finds
        # the example's modules from where it runs, as a user's shell does.
        "PYTHONPATH": str(ROOT / "src"),
    }
    # The console script the README runs (it does not put the current directory on
    # sys.path, unlike ``python -m blitzq``); ``-m`` when this interpreter has none.
    script = Path(sys.executable).with_name("blitzq")
    blitzq = [str(script)] if script.exists() else [sys.executable, "-m", "blitzq"]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    worker_log, server_log = tmp_path / "worker.log", tmp_path / "server.log"

    def logs() -> str:
        return (
            f"--- worker:\n{worker_log.read_text()[-3000:]}\n"
            f"--- server:\n{server_log.read_text()[-3000:]}"
        )

    with worker_log.open("wb") as worker_out, server_log.open("wb") as server_out:
        worker = subprocess.Popen(
            [*blitzq, "worker", "--django"],
            cwd=EXAMPLE,
            env={**env, "DJANGO_SETTINGS_MODULE": "settings"},
            stdout=worker_out,
            stderr=subprocess.STDOUT,
        )
        server = subprocess.Popen(
            [sys.executable, "app.py", "runserver", str(port), "--noreload"],
            cwd=EXAMPLE,
            env=env,  # app.py sets DJANGO_SETTINGS_MODULE=settings itself
            stdout=server_out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(
            lambda: "blitzq worker" in worker_log.read_text() or worker.poll() is not None,
            60,
            "the worker to start",
        )
        assert worker.poll() is None, logs()

        def server_answers() -> bool:
            assert server.poll() is None, logs()
            try:
                _http(f"{base}/result/warm-up")
            except OSError:  # not listening yet
                return False
            return True

        wait_until(server_answers, 60, "the dev server to answer", interval=0.1)

        for signup_id, name in enumerate(["ada", "grace"], start=1):
            status, body = _http(f"{base}/signup", {"name": name})
            assert status == 200, (body, logs())
            assert body["signup_id"] == signup_id
            result_id = body["result_id"]
            seen: list[str] = []

            def finished(result_id: str = result_id, seen: list[str] = seen) -> Any:
                status, body = _http(f"{base}/result/{result_id}")
                assert status == 200, (body, logs())
                seen.append(body["status"])
                return body if body["status"] in ("SUCCESSFUL", "FAILED") else None

            final = wait_until(finished, 60, f"task {result_id} to finish", interval=0.1)
            assert final == {
                "status": "SUCCESSFUL",
                "return_value": f"Welcome, {name}! (signup #{signup_id})",
            }, logs()
            # Published once committed, so never unknown (404) in between; READY and
            # RUNNING may or may not be caught by the polling.
            assert set(seen) <= {"READY", "RUNNING", "SUCCESSFUL"}, seen

        status, body = _http(f"{base}/result/no-such-id")
        assert (status, body) == (404, {"error": "no task result with id no-such-id"})
        assert worker.poll() is None, logs()
        assert server.poll() is None, logs()
    finally:
        _stop(server)
        _stop(worker)


_ON_COMMIT_SCRIPT = """
import json, os, app, redis
app.main(["app.py", "check"])  # django.setup() and the signup table, as `app.py runserver`
from django.db import connection, transaction
from django.test import Client
from tasks import TaskResultDoesNotExist, send_welcome

client = Client()
server = redis.Redis.from_url(os.environ["BLITZQ_REDIS_URL"])
pattern = "{" + os.environ["BLITZQ_NAMESPACE"] + "}:*"
def keys():
    return sorted(key.decode() for key in server.scan_iter(match=pattern))
def known(result_id):
    try:
        return send_welcome.get_result(result_id).status
    except TaskResultDoesNotExist:
        return None
out = {}

class RolledBack(Exception):
    pass
try:
    with transaction.atomic():
        rolled_back = client.post("/signup", {"name": "eve"}).json()
        raise RolledBack
except RolledBack:
    pass
out["rolled_back"] = [keys(), known(rolled_back["result_id"])]
answer = client.get("/result/" + rolled_back["result_id"])
out["rolled_back_view"] = [answer.status_code, answer.json()]

with transaction.atomic():
    committed = client.post("/signup", {"name": "bob"}).json()
    out["before_commit"] = [keys(), known(committed["result_id"])]
out["after_commit"] = [len(keys()) > 0, known(committed["result_id"])]
answer = client.get("/result/" + committed["result_id"])
out["committed_view"] = [answer.status_code, answer.json()]
with connection.cursor() as cursor:
    cursor.execute("SELECT id, name FROM signup")
    out["rows"] = cursor.fetchall()
print(json.dumps(out))
"""


def test_the_signup_is_published_on_commit_and_not_at_all_on_rollback(
    redis_url: str, example_ns: str, tmp_path: Path
) -> None:
    """The example's ``ENQUEUE_ON_COMMIT``, decided without a worker: its signup view (Django's
    test client, the example's settings) run inside an outer ``transaction.atomic()``, so the
    view's own block is a savepoint and ``on_commit`` waits for the outer one. The example's
    view has no rollback path of its own; rolling the outer block back stands for one. Rolled
    back: no row, no key in the namespace, ``/result/<id>`` 404. Committed: nothing in Redis
    and no record until the commit, then the record (``READY``, no worker runs here)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BLITZQ_", "DJANGO_"))}
    env |= {
        "BLITZQ_REDIS_URL": redis_url,
        "BLITZQ_NAMESPACE": example_ns,
        "TMPDIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(ROOT / "src")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", _ON_COMMIT_SCRIPT],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=45,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["rolled_back"] == [[], None]
    assert out["rolled_back_view"][0] == 404
    assert out["before_commit"] == [[], None]
    assert out["after_commit"] == [True, "READY"]
    assert out["committed_view"] == [200, {"status": "READY", "return_value": None}]
    assert out["rows"] == [[1, "bob"]]
