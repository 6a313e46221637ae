"""Which commands start the embedded server, how the others find it, and dead-letter replay.

Only workers and producers start the embedded server. Read-only and admin commands use the
one running for ``$BLITZQ_DATA_DIR``, else for the nearest ``.blitzq`` directory in the current
directory or its parents, or exit 1 saying none runs; they never start a new, empty one.

A dead letter remembers the mode and queue it came from; replay puts it back there (whatever
the replaying Queue's mode), within ``max_message_size``, claiming the unique key again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from blitzq import MessageTooLarge, Queue
from blitzq.broker.redis import embedded
from blitzq.cli import cli
from blitzq.serialization import Envelope, encode_envelope
from tests.integration.test_cli import final_record, json_out, running_worker

# Nothing from the developer's environment: no URL, no data dir.
_NO_URL: dict[str, str | None] = {
    "BLITZQ_REDIS_URL": None,
    "BLITZQ_NAMESPACE": None,
    "BLITZQ_MODE": None,
    "BLITZQ_DATA_DIR": None,
}

READ_ONLY_COMMANDS = [
    ["queue", "stats"],
    ["dead-letter", "list"],
    ["dead-letter", "purge", "--yes"],
    ["dead-letter", "replay", "some-id"],
    ["task", "inspect", "some-id"],
    ["task", "cancel", "some-id"],
]


def blitzq(*args: str, env: dict[str, str | None] | None = None) -> Result:
    """Run ``blitzq ARGS`` in-process with no broker URL from the environment."""
    return CliRunner().invoke(cli, list(args), env={**_NO_URL, **(env or {})})


def _no_data_dir_above(path: Path) -> None:
    """Skip when a directory above ``path`` (outside the test) has a .blitzq of its own."""
    for parent in path.resolve().parents:
        if (parent / ".blitzq").is_dir():
            pytest.skip(f"{parent}/.blitzq exists outside the test's directory")


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current directory with no .blitzq in it or above it."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    _no_data_dir_above(path)
    monkeypatch.chdir(path)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """A project directory; the embedded server of its .blitzq is stopped afterwards."""
    path = tmp_path / "project"
    path.mkdir()
    yield path
    embedded.stop_server(path / ".blitzq")


# ------------------------------------------------------------ who starts the server
@pytest.mark.parametrize("args", READ_ONLY_COMMANDS, ids=" ".join)
def test_read_only_commands_without_a_server_exit_1_and_start_nothing(
    args: list[str], elsewhere: Path, tmp_path: Path
) -> None:
    result = blitzq(*args)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(
        f"Error: no embedded server found: no .blitzq directory in {elsewhere}"
    )
    assert "--redis-url / BLITZQ_REDIS_URL" in result.stderr
    assert result.stdout == ""
    assert list(elsewhere.iterdir()) == []  # no ./.blitzq, no server

    configured = tmp_path / "configured"
    result = blitzq(*args, env={"BLITZQ_DATA_DIR": str(configured)})
    assert result.exit_code == 1, result.output
    assert f"Error: the embedded server of {configured} is not running" in result.stderr
    assert not configured.exists()


def test_scheduler_list_without_a_server_exits_1_and_starts_nothing(elsewhere: Path) -> None:
    module = f"embapp_{uuid.uuid4().hex[:8]}"
    (elsewhere / f"{module}.py").write_text("from blitzq import Queue\nqueue = Queue()\n")
    result = blitzq("scheduler", "list", f"{module}:queue")
    assert result.exit_code == 1, result.output
    assert "no embedded server found" in result.stderr
    assert not (elsewhere / ".blitzq").exists()


def test_server_status_and_stop_without_a_server_create_nothing(elsewhere: Path) -> None:
    status = blitzq("server", "status", "--json")
    assert json_out(status)["running"] is False
    assert json_out(status)["data_dir"] == str(elsewhere / ".blitzq")
    stop = blitzq("server", "stop")
    assert stop.exit_code == 0, stop.output
    assert "no embedded server running" in stop.stdout
    assert list(elsewhere.iterdir()) == []


def test_a_producer_starts_the_server_and_commands_below_find_it(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = "cli-embedded-" + uuid.uuid4().hex[:8]
    monkeypatch.chdir(project)
    producer = Queue(namespace=namespace)  # no URL: a producer starts ./.blitzq
    try:
        producer.send_sync("some.task", [1])
        producer.send_sync("some.task", [2])
    finally:
        producer.close_sync()
    assert embedded.server_status(project / ".blitzq")["running"] is True

    deeper = project / "src" / "pkg"
    deeper.mkdir(parents=True)
    monkeypatch.chdir(deeper)
    stats = json_out(blitzq("--namespace", namespace, "queue", "stats", "--json"))
    assert stats["queues"]["default"]["waiting"] == 2  # the producer's server, not a new one
    status = json_out(blitzq("server", "status", "--json"))
    assert status["running"] is True
    assert status["data_dir"] == str((project / ".blitzq").resolve())
    assert not (deeper / ".blitzq").exists()

    stop = blitzq("server", "stop")
    assert "stopped the embedded server" in stop.stdout
    after = blitzq("--namespace", namespace, "queue", "stats")
    assert after.exit_code == 1
    assert f"the embedded server of {(project / '.blitzq').resolve()} is not running" in (
        after.stderr
    )
    assert embedded.server_status(project / ".blitzq")["running"] is False


# ------------------------------------------------------------------- dead-letter replay
@pytest.fixture
def invoke(redis_url: str, namespace: str) -> Callable[..., Result]:
    """``blitzq --redis-url <test server> --namespace <test ns> ARGS`` (no --mode: reliable)."""

    def run(*args: str) -> Result:
        return blitzq("--redis-url", redis_url, "--namespace", namespace, *args)

    return run


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    """A plain synchronous client on the test server."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def _plant_dead_letter(
    client: redis.Redis, namespace: str, task_id: str, message: bytes, kind: str | None
) -> None:
    """Store a dead letter by hand; ``kind=None`` is one written before blitzq recorded it."""
    fields: dict[str, Any] = {
        "message": message,
        "reason": "failed",
        "error": "RuntimeError: boom",
        "task": "some.task",
        "queue": "default",
        "failed_at": "1.0",
    }
    if kind is not None:
        fields["kind"] = kind
    client.hset(f"{{{namespace}}}:d:{task_id}", mapping=fields)
    client.zadd(f"{{{namespace}}}:dlq", {task_id: 1.0})


def _message(task_id: str, *args: Any) -> bytes:
    return encode_envelope(Envelope(task_id, "some.task", "default", list(args)), 1 << 20)


def test_replay_of_a_fast_mode_dead_letter_goes_back_to_the_fast_list(
    make_queue: Callable[..., Queue],
    invoke: Callable[..., Result],
    raw: redis.Redis,
    namespace: str,
) -> None:
    queue = make_queue(mode="fast")
    runs: list[int] = []

    @queue.task(name="fails_once", retries=0)
    async def fails_once(n: int) -> int:
        runs.append(n)
        if len(runs) == 1:
            raise RuntimeError("the first run fails")
        return n * 2

    handle = fails_once.enqueue_sync(21)
    with running_worker(queue):
        assert final_record(queue, handle.id).state.value == "dead_lettered"
    listing = json_out(invoke("dead-letter", "list", "--json"))
    assert [(d["id"], d["mode"]) for d in listing["dead_letters"]] == [(handle.id, "fast")]

    # The CLI runs in reliable mode (no --mode): the message still goes to the fast list.
    replayed = json_out(invoke("dead-letter", "replay", handle.id, "--json"))
    assert replayed == {"replayed": True, "id": handle.id, "queue": "default", "mode": "fast"}
    assert raw.llen(f"{{{namespace}}}:l:default") == 1
    assert raw.exists(f"{{{namespace}}}:s:default") == 0
    assert json_out(invoke("dead-letter", "list", "--json"))["total"] == 0

    with running_worker(queue):  # a fast worker runs it
        record = final_record(queue, handle.id)
    assert (record.state.value, record.result, record.attempts) == ("succeeded", 42, 1)
    assert runs == [21, 21]
    queue.close_sync()


def test_replay_of_a_reliable_dead_letter_from_a_fast_mode_cli(
    make_queue: Callable[..., Queue],
    invoke: Callable[..., Result],
    raw: redis.Redis,
    namespace: str,
) -> None:
    _plant_dead_letter(raw, namespace, "r1", _message("r1", 1), kind="s")
    replayed = json_out(invoke("--mode", "fast", "dead-letter", "replay", "r1", "--json"))
    assert replayed["mode"] == "reliable"
    assert raw.xlen(f"{{{namespace}}}:s:default") == 1
    assert raw.exists(f"{{{namespace}}}:l:default") == 0


def test_an_old_dead_letter_without_its_mode_goes_to_the_queue_mode(
    make_queue: Callable[..., Queue], raw: redis.Redis, namespace: str
) -> None:
    fast, reliable = make_queue(mode="fast"), make_queue(mode="reliable")
    _plant_dead_letter(raw, namespace, "old-1", _message("old-1", 1), kind=None)
    _plant_dead_letter(raw, namespace, "old-2", _message("old-2", 2), kind=None)
    assert {d.id: d.mode for d in fast.dead_letters_sync()} == {"old-1": None, "old-2": None}

    handle = fast.retry_sync("old-1")
    assert handle is not None
    assert (handle.id, handle.queue, handle.duplicate) == ("old-1", "default", False)
    assert raw.llen(f"{{{namespace}}}:l:default") == 1
    assert reliable.retry_sync("old-2") is not None
    assert raw.xlen(f"{{{namespace}}}:s:default") == 1
    assert fast.dead_letter_count_sync() == 0
    fast.close_sync()
    reliable.close_sync()


def test_replay_respects_max_message_size(
    make_queue: Callable[..., Queue],
    invoke: Callable[..., Result],
    raw: redis.Redis,
    namespace: str,
) -> None:
    big = _message("big", "x" * 500)
    assert len(big) > 500
    _plant_dead_letter(raw, namespace, "big", big, kind="s")

    refused = invoke("dead-letter", "replay", "big", "--max-message-size", "256")
    assert refused.exit_code == 1
    assert refused.stderr.startswith("Error: dead letter big cannot be replayed: message of")
    assert "256" in refused.stderr
    small = make_queue(max_message_size=256)
    with pytest.raises(MessageTooLarge):
        small.retry_sync("big")
    small.close_sync()
    # Nothing was published and the dead letter stays.
    assert raw.exists(f"{{{namespace}}}:s:default") == 0
    assert json_out(invoke("dead-letter", "list", "--json"))["total"] == 1

    replayed = json_out(invoke("dead-letter", "replay", "big", "--json"))  # default: 1 MiB
    assert replayed["replayed"] is True
    assert raw.xlen(f"{{{namespace}}}:s:default") == 1


@pytest.mark.parametrize("mode", ["reliable", "fast"])
def test_replay_respects_the_unique_key(
    make_queue: Callable[..., Queue], invoke: Callable[..., Result], mode: str
) -> None:
    queue = make_queue(mode=mode)
    runs: list[int] = []

    @queue.task(name="uniq", unique=True, retries=0)
    async def uniq(n: int) -> int:
        runs.append(n)
        if len(runs) == 1:
            raise RuntimeError("the first run fails")
        return n

    first = uniq.enqueue_sync(7)
    with running_worker(queue):
        assert final_record(queue, first.id).state.value == "dead_lettered"
    second = uniq.enqueue_sync(7)  # the dead letter freed the key: a new task holds it
    assert not second.duplicate

    refused = invoke("--mode", mode, "dead-letter", "replay", first.id)
    assert refused.exit_code == 1
    assert f"task {second.id} holds its unique key" in refused.stderr
    held = queue.retry_sync(first.id)
    assert held is not None
    assert (held.duplicate, held.id) == (True, second.id)
    assert [d.id for d in queue.dead_letters_sync()] == [first.id]  # kept

    with running_worker(queue):  # the holder runs and frees the key
        assert final_record(queue, second.id).state.value == "succeeded"
    replayed = json_out(invoke("--mode", mode, "dead-letter", "replay", first.id, "--json"))
    assert replayed["id"] == first.id
    third = uniq.enqueue_sync(7)  # the replayed task holds the key now
    assert (third.duplicate, third.id) == (True, first.id)
    with running_worker(queue):
        assert final_record(queue, first.id).state.value == "succeeded"
    assert runs == [7, 7, 7]
    queue.close_sync()
