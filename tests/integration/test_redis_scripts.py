"""The one Lua loader (``broker/redis/scripts.py``) and the one error translation
(``broker/redis/client.py``) of the Redis brokers.

Scripts are read once per process with their ``--@include`` lines expanded and run by EVALSHA;
a server that lost them (restart, failover, ``SCRIPT FLUSH``) gets them again on NOSCRIPT.
Checked on a private Redis (``redis-server`` on a free port: ``SCRIPT FLUSH`` and
``CONFIG RESETSTAT`` must not touch the shared server) and on this process's ephemeral Valkey.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from importlib import resources

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from blitzq import records
from blitzq.broker import Completion, DeadLetterFields, Scheduled
from blitzq.broker.redis import FastRedisBroker, ReliableRedisBroker, ephemeral, scripts
from blitzq.broker.redis.client import broker_error
from blitzq.broker.redis.common import RedisBroker
from blitzq.broker.redis.keys import TABLE, Keys
from blitzq.exceptions import BrokerError
from blitzq.serialization import Envelope, encode_envelope

from ..conftest import free_port
from .proc_tasks import eventually

#: Scripts the brokers call (every file in lua/ except the included libraries).
CALLED = {
    "cancel", "claim_periodic", "complete", "drop_dead", "fetch_levels", "hand_over",
    "lock_acquire", "lock_renew", "outbox_restore", "outbox_take", "pop_levels", "progress",
    "promote", "prune", "publish", "purge_dead", "rate_acquire", "recover", "renew", "replay",
    "purge_list",  # a purge of a list (a fast queue, an outbox): no MULTI, works when full
    "schedule", "take_handed", "trim_dead", "unique_claim", "unique_enqueue", "trace",
    "unschedule",  # a purge of a queue's delayed tasks (queue purge --delayed)
    "keep_running",
    # the spread layout of a Redis Cluster (spread.py, handoff.py)
    "handoff_publish", "handoff_restore", "handoff_take", "hold", "recover_split",
    "revoke",  # the two-step cancel of a homed task (homes.py)
    "announce_revoked",  # a workflow's steps, marked first, announced after (control_state.py)
    "recent",  # the dashboard's index of ended tasks (worker/recent.py)
    "idle_look", "publish_ring",  # an idle worker's doorbell on a cluster (doorbell.py)
    "register", "unregister",  # worker registrations and their counts (registry.py)
    "worker_timeouts",  # the live workers' visibility timeouts, for recovery (registry.py)
}  # fmt: skip


# ------------------------------------------------------------------ loader (no server)
def test_every_script_is_read_once_with_its_includes_expanded() -> None:
    lua = resources.files("blitzq.broker.redis").joinpath("lua")

    def shipped(text: str) -> str:
        return scripts.strip_comments(scripts.expand_keys(text))

    library = shipped(lua.joinpath("dead_letters.lua").read_text()).rstrip("\n")
    outbox = shipped(lua.joinpath("outbox.lua").read_text()).rstrip("\n")
    # Included by other scripts, never called alone.
    included = {
        "dead_letters", "outbox", "recent_add", "worker_counts", "envelope_head", "claim_idle",
        "record_final", "fencing", "completion_ops", "stream_acks",
    }  # fmt: skip
    assert set(scripts.names()) == CALLED | included
    for name in scripts.names():
        script = scripts.load(name)
        assert script.name == name
        assert scripts.load(name) is script  # cached for the process
        assert not any(line.startswith("--@include") for line in script.source.splitlines())
        assert script.sha == hashlib.sha1(script.source.encode()).hexdigest()
        raw = lua.joinpath(f"{name}.lua").read_text()
        if "--@include outbox.lua" in raw:
            assert outbox in script.source
            assert "local function ob_push(" in script.source
        if "--@include envelope_head.lua" in raw:
            assert "local function envelope_head(" in script.source
        if "--@include record_final.lua" in raw:
            assert "local function record_final(" in script.source
        if "--@include dead_letters.lua" in raw:
            assert library in script.source
            assert "local function dl_note(" in script.source
        elif "--@include" not in raw:  # the file as it is, its KEY calls expanded
            assert script.source == shipped(raw)
        assert not re.search(r"\bKEY\.\w+\(", script.source)  # none left to the server
        assert not any(line.lstrip().startswith("--") for line in script.source.splitlines())
    # Comment lines are sent empty (line numbers kept); a comment after code stays.
    assert scripts.strip_comments("a = 1\n  -- note\nb = '--' -- c") == "a = 1\n\nb = '--' -- c"


def test_an_unknown_script_name_is_an_error() -> None:
    with pytest.raises(FileNotFoundError):
        scripts.load("no_such_script")


# ----------------------------------------------------------- translation (no server)
@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (RedisConnectionError("Connection refused"), True),
        (RedisTimeoutError("Timeout reading from socket"), True),
        (ConnectionResetError(104, "reset by peer"), True),
        (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False),
        (OutOfMemoryError("command not allowed when used memory > 'maxmemory'"), False),
    ],
)
def test_broker_error_names_the_cause_and_says_whether_to_retry(
    error: Exception, transient: bool
) -> None:
    translated = broker_error(error)
    assert isinstance(translated, BrokerError)
    assert translated.transient is transient
    assert translated.out_of_memory is isinstance(error, OutOfMemoryError)
    assert str(translated) == f"{type(error).__name__}: {error}"


def test_a_broker_error_is_not_translated_again() -> None:
    original = BrokerError("Redis did not answer within 6.0 s", True)
    assert broker_error(original) is original


# ------------------------------------------------------------------- on real servers
def _answers(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=0.5) as client:
            return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


@pytest.fixture(params=["redis", "valkey"])
def own_url(request: pytest.FixtureRequest, tmp_path: object) -> Iterator[str]:
    """A server no other test or developer uses: a private ``redis-server`` on a free port
    (no persistence) or this process's ephemeral Valkey."""
    if request.param == "valkey":
        yield ephemeral.ensure_server()
        return
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not _answers(url):
            assert proc.poll() is None, "redis-server exited at start"
            assert time.monotonic() < deadline, "redis-server did not answer within 30 s"
            time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
async def admin(own_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(own_url)
    yield client
    await client.aclose()


@pytest.fixture
async def reliable(own_url: str, admin: aioredis.Redis) -> AsyncIterator[ReliableRedisBroker]:
    namespace = f"test-scripts-{uuid.uuid4().hex[:10]}"
    broker = ReliableRedisBroker(own_url, namespace)
    yield broker
    await broker.close()
    async for key in admin.scan_iter(match=f"{namespace}:*"):
        await admin.delete(key)


async def test_the_expanded_key_calls_make_the_names_keys_makes(admin: aioredis.Redis) -> None:
    """Every ``KEY.<name>`` call, expanded and run by the server, builds the name
    :class:`Keys` builds in Python (each part filled with its own name)."""
    keys = Keys("n s")
    for name, key in TABLE.items():
        args = ", ".join(f"ARGV[{i}]" for i in range(1, len(key.parts) + 2))
        lua = scripts.expand_keys(f"return KEY.{name}({args})")
        parts = [f"<{part}>" for part in key.parts]
        built = await admin.eval(lua, 0, keys.prefix, *parts)
        member = getattr(keys, name)
        assert built.decode() == (member(*parts) if parts else member), name


async def _loaded(admin: aioredis.Redis, names: list[str]) -> list[bool]:
    return list(await admin.script_exists(*(scripts.load(n).sha for n in names)))


async def _round(broker: RedisBroker, tag: str) -> None:
    """Publish, fetch and complete one task with a record, claim a unique key, take a lock:
    scripts from state.py, reliable.py and control.py."""
    queue = f"q-{tag}"
    await broker.prepare_consumer([queue], "c1")
    await broker.publish(queue, [tag.encode(), b"second " + tag.encode()])  # publish.lua (2)
    (delivery,) = await broker.fetch_first([queue], 1, 0)  # fetch_levels / pop_levels
    assert delivery.payload == tag.encode()
    stale = await broker.complete(
        [Completion(queue, delivery.token, tag, record=b"done " + tag.encode(), record_ttl=60)]
    )
    assert stale == []
    assert await broker.get_record(tag) == b"done " + tag.encode()
    assert await broker.claim_unique([(f"u-{tag}", tag, 60.0)]) == [None]
    assert await broker.acquire_lock(f"l-{tag}", tag, 1, 30.0) == 0.0


async def test_scripts_run_by_evalsha_and_come_back_after_script_flush(
    reliable: ReliableRedisBroker, admin: aioredis.Redis, own_url: str
) -> None:
    used = ["publish", "fetch_levels", "complete", "unique_claim", "lock_acquire"]
    await _round(reliable, "t1")
    assert await _loaded(admin, used) == [True] * len(used)

    await admin.script_flush()
    assert await _loaded(admin, used) == [False] * len(used)
    await _round(reliable, "t2")  # each call meets NOSCRIPT once, loads, runs
    assert await _loaded(admin, used) == [True] * len(used)

    if own_url.startswith("redis://"):  # the private redis-server: count the commands
        await admin.config_resetstat()
        await _round(reliable, "t3")
        stats = await admin.info("commandstats")
        calls = {name: int(row["calls"]) for name, row in stats.items()}
        assert calls.get("cmdstat_evalsha") == len(used)
        assert "cmdstat_eval" not in calls
        assert "cmdstat_script|load" not in calls


async def test_fast_mode_scripts_come_back_after_script_flush(
    own_url: str, admin: aioredis.Redis
) -> None:
    namespace = f"test-scripts-{uuid.uuid4().hex[:10]}"
    broker = FastRedisBroker(own_url, namespace)
    try:
        await broker.publish("q", [b"a"])
        await admin.script_flush()
        assert [d.payload for d in await broker.fetch_first(["q"], 5, 0)] == [b"a"]
        assert await _loaded(admin, ["pop_levels"]) == [True]
    finally:
        await broker.close()
        async for key in admin.scan_iter(match=f"{namespace}:*"):
            await admin.delete(key)


async def test_an_error_inside_a_script_is_a_lasting_broker_error(
    reliable: ReliableRedisBroker, admin: aioredis.Redis
) -> None:
    await admin.set(reliable.state.keys.schedule, b"not a sorted set")  # WRONGTYPE in schedule.lua
    with pytest.raises(BrokerError) as caught:
        await reliable.schedule([Scheduled("t1", "q", b"m", delay=60.0)])
    assert caught.value.transient is False
    assert "WRONGTYPE" in str(caught.value)
    assert isinstance(caught.value.__cause__, ResponseError)


async def test_an_unreachable_server_is_a_transient_broker_error_everywhere() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0?socket_connect_timeout=0.5"
    broker = ReliableRedisBroker(url, "test-scripts-unreachable")
    try:
        calls = {
            "ping (a command)": broker.ping(),
            "dead_letter_count (a script)": broker.dead_letter_count(),
            "claim_unique (a control script)": broker.claim_unique([("k", "t", 1.0)]),
        }
        for what, call in calls.items():
            with pytest.raises(BrokerError) as caught:
                await call
            assert caught.value.transient is True, what
        for what, generator in {
            "events": broker.events(),
            "watch_progress": broker.watch_progress("t1"),
        }.items():
            with pytest.raises(BrokerError) as caught:
                await anext(generator)
            assert caught.value.transient is True, what
            await generator.aclose()
    finally:
        await broker.close()


# ------------------------------------------- a dead letter never replaces a final record
def _message(task_id: str, queue: str) -> bytes:
    return encode_envelope(Envelope(task_id, "tests.noop", queue, []), 1 << 20)


def _dead(body: bytes, queue: str) -> DeadLetterFields:
    return DeadLetterFields(
        body, "max deliveries exceeded", "delivered 5 times", "tests.noop", queue, time.time()
    )


async def test_a_dead_letter_is_never_written_over_a_final_record(
    reliable: ReliableRedisBroker,
) -> None:
    """``complete.lua``: a completion with a dead letter whose task's record is final already
    (its completion committed by an earlier delivery whose ack was lost) applies only its
    ack; the record stands and nothing is dead-lettered, retried or published."""
    queue = "q-final"
    await reliable.prepare_consumer([queue], "c1")
    over, live = _message("t-over", queue), _message("t-live", queue)
    await reliable.publish(queue, [over, live])
    d_over, d_live = await reliable.fetch_first([queue], 2, 0)
    done = records.succeeded("t-over", "tests.noop", queue, 1, 0.0, 0.0, "w")
    await reliable.set_record("t-over", done, 600)
    error = "delivered 5 times"
    stale = await reliable.complete(
        [
            Completion(
                queue,
                d.token,
                task_id,
                records.deliveries_exceeded(task_id, "tests.noop", queue, 5, error, 0.0),
                600,
                dead_letter=_dead(body, queue),
                reschedule=body,
                delay=0.0,
            )
            for d, task_id, body in ((d_over, "t-over", over), (d_live, "t-live", live))
        ]
    )
    assert stale == []
    assert await reliable.get_record("t-over") == done
    assert await reliable.get_dead_letter("t-over") is None
    assert (await reliable.get_dead_letter("t-live")) is not None  # not final: as before
    assert await reliable.scheduled_count() == 1  # t-live's only
    assert (await reliable.queue_stats([queue]))[queue] == {"waiting": 0, "in_flight": 0}
    assert (await reliable.counters()).get("dead_letters_skipped") == 1


async def test_recovery_acks_an_entry_past_max_deliveries_whose_record_is_final(
    reliable: ReliableRedisBroker,
) -> None:
    """``recover.lua``: an abandoned entry past ``max_deliveries`` whose task's record is
    final is acked and deleted without a dead letter; one whose record is not is
    dead-lettered as before."""
    queue = "q-final-rec"
    await reliable.prepare_consumer([queue], "c1")
    await reliable.publish(queue, [_message("r-over", queue), _message("r-live", queue)])
    assert len(await reliable.fetch_first([queue], 2, 0)) == 2  # pending, never acked
    done = records.succeeded("r-over", "tests.noop", queue, 1, 0.0, 0.0, "w")
    await reliable.set_record("r-over", done, 600)
    taken = [0, 0]

    async def recovered() -> dict[str, int]:
        requeued, dead = await reliable.recover(queue, 0.001, 10, 1, 600)
        taken[0] += requeued
        taken[1] += dead
        return (await reliable.queue_stats([queue]))[queue]

    await eventually(recovered, lambda s: s == {"waiting": 0, "in_flight": 0}, 30)
    assert taken == [0, 1]  # r-live dead-lettered, r-over only acked
    assert await reliable.get_record("r-over") == done
    assert await reliable.get_dead_letter("r-over") is None
    assert await reliable.get_dead_letter("r-live") is not None
    live = records.TaskRecord.from_bytes(await reliable.get_record("r-live") or b"")
    assert live.state is records.TaskState.DEAD_LETTERED
    assert (await reliable.counters()).get("dead_letters_skipped") == 1
