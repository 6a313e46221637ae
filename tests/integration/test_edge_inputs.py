"""Bad input at the lookup and command-line edges (issue 28, item 4), against a real Redis.

Every API taking a task id, queue or schedule name checks it where it enters with one
validator (:func:`blitzq.serialization.lookup_key`): a lone surrogate is the
:class:`~blitzq.SerializationError` enqueue raises for it, never a raw ``UnicodeEncodeError``
from the Redis client. The command line refuses JSON options that are too deep, hold a
non-finite number or are of the wrong type, cron expressions of other than five fields, and
arguments that are not UTF-8, each as a usage error (exit 2) naming the option or argument,
with the JSON error document under ``--json``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from click.testing import CliRunner, Result

from blitzq import ConfigurationError, Queue, SerializationError, TaskHandle
from blitzq.cli import cli
from blitzq.limits import MAX_JSON_DEPTH
from blitzq.runtime_schedules import add_schedule, remove_schedule, runtime_schedules
from tests.integration.test_cli_ops import ROOT, subprocess_env

pytestmark = pytest.mark.timeout(60)

#: A task id holding a lone surrogate (what ``"\ud800"`` in code, or a non-UTF-8 argument
#: decoded by Python, gives).
BAD = "a\ud800b"
#: What Python makes of the argument ``b"a\xffb"`` (``surrogateescape``), as click gets it.
ARG = "a\udcffb"
#: The end of the message enqueue's SerializationError carries for it.
NOT_UTF8 = "cannot be encoded as UTF-8"


async def test_enqueue_refuses_the_surrogate_with_a_serialization_error(
    make_queue: Callable[..., Queue],
) -> None:
    q = make_queue()

    @q.task(name="t")
    async def t() -> None: ...

    try:
        with pytest.raises(SerializationError, match=NOT_UTF8):
            await t.options(task_id=BAD).enqueue()
        with pytest.raises(SerializationError, match=NOT_UTF8):
            await t.options(queue=BAD).enqueue()
    finally:
        await q.close()


def _lookups(q: Queue) -> dict[str, Callable[[], Awaitable[Any]]]:
    """Every async lookup of ``q`` (and of a handle or a workflow) called with :data:`BAD`."""
    handle: TaskHandle[Any] = TaskHandle(q, BAD, "default", "t")

    async def first_progress() -> Any:
        return await anext(q.watch_progress(BAD, timeout=1))

    return {
        "inspect": lambda: q.inspect(BAD),
        "get_result": lambda: q.get_result(BAD, timeout=0.1),
        "get_results": lambda: q.get_results(["ok", BAD], timeout=0.1),
        "why_no_result": lambda: q._results.why_no_result(BAD),
        "cancel": lambda: q.cancel(BAD),
        "retry": lambda: q.retry(BAD),
        "get_progress": lambda: q.get_progress(BAD),
        "watch_progress": first_progress,
        "purge_queue": lambda: q.purge_queue(BAD),
        "stats": lambda: q.stats(queues=["default", BAD]),
        "handle.result": lambda: handle.result(timeout=0.1),
        "handle.status": handle.status,
        "handle.cancel": handle.cancel,
        "workflow.status": lambda: q.workflow(BAD).status(),
        "add_schedule": lambda: add_schedule(q, BAD, "t", every=60),
        "remove_schedule": lambda: remove_schedule(q, BAD),
    }


async def test_every_async_lookup_refuses_a_lone_surrogate_as_enqueue_does(
    make_queue: Callable[..., Queue],
) -> None:
    q = make_queue()
    try:
        for name, call in _lookups(q).items():
            with pytest.raises(SerializationError, match=NOT_UTF8) as caught:
                await call()
            assert not isinstance(caught.value, UnicodeError), name
        # Nothing was corrupted: the connections and the namespace still work.
        assert await q.inspect("no-such-task") is None
        assert await runtime_schedules(q) == []
        assert (await q.stats(queues=["default"]))["queues"]["default"]["waiting"] == 0
    finally:
        await q.close()


def test_every_sync_twin_refuses_a_lone_surrogate(make_queue: Callable[..., Queue]) -> None:
    q = make_queue()
    handle: TaskHandle[Any] = TaskHandle(q, BAD, "default", "t")
    calls: dict[str, Callable[[], Any]] = {
        "inspect_sync": lambda: q.inspect_sync(BAD),
        "get_result_sync": lambda: q.get_result_sync(BAD, timeout=0.1),
        "get_results_sync": lambda: q.get_results_sync([BAD], timeout=0.1),
        "cancel_sync": lambda: q.cancel_sync(BAD),
        "retry_sync": lambda: q.retry_sync(BAD),
        "get_progress_sync": lambda: q.get_progress_sync(BAD),
        "purge_queue_sync": lambda: q.purge_queue_sync(BAD),
        "stats_sync": lambda: q.stats_sync(queues=[BAD]),
        "handle.result_sync": lambda: handle.result_sync(timeout=0.1),
        "handle.status_sync": handle.status_sync,
        "handle.cancel_sync": handle.cancel_sync,
    }
    try:
        for name, call in calls.items():
            with pytest.raises(SerializationError, match=NOT_UTF8) as caught:
                call()
            assert not isinstance(caught.value, UnicodeError), name
        assert q.inspect_sync("no-such-task") is None
    finally:
        q.close_sync()


async def test_lookups_refuse_ids_and_names_that_are_not_str(
    make_queue: Callable[..., Queue],
) -> None:
    q = make_queue()
    try:
        with pytest.raises(ConfigurationError, match="task id must be a str, got 123"):
            await q.inspect(123)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="task id must be a str, got None"):
            await q.cancel(None)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="task id must be a str"):
            await q.get_progress(b"raw")  # type: ignore[arg-type]
        # A str is an iterable of names too: one name must come as a list.
        with pytest.raises(ConfigurationError, match="queues must be a list of queue names"):
            await q.stats(queues="default")
        with pytest.raises(ConfigurationError, match="queue name must be a str"):
            await q.stats(queues=[1])  # type: ignore[list-item]
    finally:
        await q.close()


def test_a_namespace_that_is_not_unicode_is_a_configuration_error(server_url: str) -> None:
    with pytest.raises(ConfigurationError, match=NOT_UTF8):
        Queue(redis_url=server_url, namespace=BAD)


# ----------------------------------------------------------------- command line
@pytest.fixture
def invoke(server_url: str, namespace: str) -> Callable[..., Result]:
    """``blitzq --redis-url <server> --namespace <ns> ARGS`` in-process (click's runner)."""
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(
            cli,
            ["--redis-url", server_url, "--namespace", namespace, *args],
            env={"BLITZQ_REDIS_URL": None, "BLITZQ_NAMESPACE": None, "COLUMNS": "80"},
            catch_exceptions=False,
        )

    return run


def _usage_error(result: Result, start: str) -> dict[str, Any]:
    """The JSON error document of a ``--json`` command that failed with exit code 2 and
    ``start`` at the head of its message (no traceback on stderr)."""
    assert result.exit_code == 2, (result.stdout, result.stderr)
    doc: dict[str, Any] = json.loads(result.stdout)
    assert doc["exit_code"] == 2
    assert doc["error"].startswith(start), doc
    assert "Traceback" not in result.stderr
    return doc


DEEP = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)


@pytest.mark.parametrize(
    ("option", "value", "start"),
    [
        ("--args", "[1e999]", "--args: 1e999 is not a finite number"),
        ("--args", "[-1e999]", "--args: -1e999 is not a finite number"),
        ("--args", "[NaN]", "--args: NaN is not a JSON number"),
        ("--args", "[Infinity]", "--args: Infinity is not a JSON number"),
        ("--args", DEEP, f"--args: nested deeper than {MAX_JSON_DEPTH} levels"),
        ("--args", "[" * 100_000 + "]" * 100_000, "--args: nested deeper than"),
        ("--args", "[18446744073709551616]", "--args: 18446744073709551616 is outside"),
        ("--args", '["\\ud800"]', "--args: the string '\\ud800' is not valid Unicode"),
        ("--args", "{}", "--args: expected a JSON list, got an object"),
        ("--args", "{", "--args: not JSON: "),
        ("--kwargs", "[]", "--kwargs: expected a JSON object, got a list"),
        ("--kwargs", '{"a": NaN}', "--kwargs: NaN is not a JSON number"),
        ("--kwargs", '{"a": ' * 40 + "1" + "}" * 40, "--kwargs: nested deeper than"),
    ],
    ids=lambda v: v[:24] if isinstance(v, str) else None,
)
def test_schedule_add_refuses_bad_json_naming_the_option(
    invoke: Callable[..., Result], option: str, value: str, start: str
) -> None:
    result = invoke(
        "--json", "schedule", "add", "bad", "--task", "t", "--every", "60", option, value
    )
    _usage_error(result, start)
    assert json.loads(invoke("--json", "schedule", "list").stdout) == {"schedules": []}


def test_schedule_add_takes_plain_json(invoke: Callable[..., Result]) -> None:
    args = '[1, 2.5, "x", [null, true], 18446744073709551615]'
    kwargs = '{"a": {"b": [1]}}'
    every = ["--task", "t", "--every", "60"]
    result = invoke("--json", "schedule", "add", "ok", *every, "--args", args, "--kwargs", kwargs)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(invoke("--json", "schedule", "list").stdout)["schedules"]
    assert entry["args"] == [1, 2.5, "x", [None, True], 2**64 - 1]
    assert entry["kwargs"] == {"a": {"b": [1]}}


@pytest.mark.parametrize(
    ("cron", "tz", "start"),
    [
        ("0 0 * * * 5", None, "--cron: invalid cron expression '0 0 * * * 5': 6 fields"),
        ("* * * * * * 2030", None, "--cron: invalid cron expression '* * * * * * 2030': 7"),
        ("0 0 * *", None, "--cron: invalid cron expression '0 0 * *': 4 fields"),
        ("@reboot", None, "--cron: invalid cron expression '@reboot': the shorthands are"),
        ("0 9 * * *", "Mars/Base", "--tz: unknown time zone 'Mars/Base'"),
    ],
)
def test_schedule_add_takes_five_cron_fields(
    invoke: Callable[..., Result], cron: str, tz: str | None, start: str
) -> None:
    zone = ["--tz", tz] if tz else []
    result = invoke("--json", "schedule", "add", "bad", "--task", "t", "--cron", cron, *zone)
    _usage_error(result, start)
    assert (
        invoke("--json", "schedule", "add", "ok", "--task", "t", "--cron", "@daily").exit_code == 0
    )


@pytest.mark.parametrize(
    "args",
    [
        ["task", "inspect", ARG],
        ["task", "cancel", ARG],
        ["dead-letter", "show", ARG],
        ["dead-letter", "replay", ARG],
        ["dead-letter", "list", "--task", ARG],
        ["queue", "stats", "--queues", ARG],
        ["schedule", "remove", ARG],
        ["schedule", "add", ARG, "--task", "t", "--every", "60"],
    ],
    ids=lambda a: "-".join(x for x in a[:3] if x.isascii()),
)
def test_every_command_refuses_an_argument_that_is_not_utf8(
    invoke: Callable[..., Result], args: list[str]
) -> None:
    _usage_error(invoke("--json", *args), "the argument 'a\\xffb' is not valid UTF-8")
    plain = invoke(*args)
    assert plain.exit_code == 2
    assert "Error: the argument 'a\\xffb' is not valid UTF-8" in plain.stderr


def test_json_task_inspect_with_non_utf8_argv_prints_the_json_error(
    server_url: str, namespace: str
) -> None:
    """The real thing: bytes that are not UTF-8 in ``argv``, through ``python -m blitzq``."""
    argv: list[str | bytes] = [sys.executable, "-m", "blitzq", "--redis-url", server_url]
    argv += ["--namespace", namespace, "--json", "task", "inspect", b"a\xffb"]
    done = subprocess.run(
        argv, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=45
    )
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout) == {
        "error": "the argument 'a\\xffb' is not valid UTF-8 text (blitzq takes UTF-8 "
        "arguments only)",
        "exit_code": 2,
    }
    assert "Traceback" not in done.stderr


def test_a_namespace_variable_that_is_not_utf8_is_a_configuration_error(server_url: str) -> None:
    """``BLITZQ_NAMESPACE`` holding bytes that are not UTF-8: exit 78 (a configuration error,
    ``EX_CONFIG``) with the JSON document naming the variable."""
    env = subprocess_env() | {"BLITZQ_NAMESPACE": ARG}  # os.fsencode: b"a\xffb"
    argv = [sys.executable, "-m", "blitzq", "--redis-url", server_url, "--json", "queue", "stats"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=45)
    assert done.returncode == 78, done.stderr
    doc = json.loads(done.stdout)
    assert doc["exit_code"] == 78
    assert "(from env var BLITZQ_NAMESPACE): namespace 'a\\udcffb': " in doc["error"]
    assert NOT_UTF8 in doc["error"]
    assert "Traceback" not in done.stderr
