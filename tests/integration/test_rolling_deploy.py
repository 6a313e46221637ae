"""Rolling deploys with real worker processes: a task only the new workers know.

Two ``blitzq worker`` processes consume one queue: the old release (no task
``deploy.new``) and the new one (which has it). Workers advertise their task names in their
registration; the old worker hands a message it cannot run to a live worker that knows its
task (still leased, the knower woken at once) instead of putting it back on the schedule,
so each message reaches a knower after at most one take by the old worker, whoever fetched
it first. With no knower alive the message waits until ``unknown_task_grace`` and is
dead-lettered, as before.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from blitzq import Queue, TaskState
from blitzq.serialization import loads
from tests.polling import wait_until

OLD_APP = """
import blitzq

queue = blitzq.Queue(name="deploy")


@queue.task(name="deploy.old")
async def old(x: int) -> int:
    return x
"""

NEW_APP = (
    OLD_APP
    + """

@queue.task(name="deploy.new")
async def new(x: int) -> int:
    return x * 2
"""
)

MESSAGES = 40


def _spawn(tmp_path: Path, module: str, url: str, namespace: str, *extra: str) -> Any:
    script = Path(sys.executable).with_name("blitzq")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "blitzq"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
    log = (tmp_path / f"{module}.log").open("wb")
    args = ["worker", f"{module}:queue", "-Q", "deploy", "-c", "8", "--log-level", "info"]
    args += ["--redis-url", url, "--namespace", namespace, "--no-supervise", *extra]
    return subprocess.Popen(
        [*command, *args], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=log
    )


def _stop(*procs: Any) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _registered(client: redis.Redis, namespace: str) -> dict[int, dict[str, Any]]:
    """Live workers' registrations by pid."""
    raw = client.hgetall("{" + namespace + "}:workers")
    infos = [loads(v) for v in raw.values()]
    return {info["pid"]: info for info in infos}


def _holders(client: redis.Redis, namespace: str) -> dict[str, int]:
    """Consumers holding delivered, unacknowledged messages of ``deploy``, with counts."""
    summary = client.xpending("{" + namespace + "}:s:deploy", "blitzq")
    return {c["name"].decode(): int(c["pending"]) for c in summary["consumers"]}


def _apps(tmp_path: Path) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    old, new = f"old_app_{tag}", f"new_app_{tag}"
    (tmp_path / f"{old}.py").write_text(OLD_APP)
    (tmp_path / f"{new}.py").write_text(NEW_APP)
    return old, new


@pytest.mark.timeout(120)
def test_an_old_worker_hands_a_task_it_does_not_know_to_a_new_worker_at_most_once(
    tmp_path: Path, server_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    old_app, new_app = _apps(tmp_path)
    client = redis.Redis.from_url(server_url)
    producer = make_queue(name="deploy")
    old = _spawn(tmp_path, old_app, server_url, namespace)
    new = _spawn(tmp_path, new_app, server_url, namespace)
    old_log = tmp_path / f"{old_app}.log"

    def handed() -> Counter[str]:
        text = old_log.read_text(errors="replace")
        return Counter(re.findall(r"task (\S+) \(deploy\.new\) is unknown here: handed", text))

    try:
        workers = wait_until(
            lambda: len(r := _registered(client, namespace)) == 2 and r, 30, "both workers"
        )
        assert "deploy.new" in workers[new.pid]["tasks"]
        assert "deploy.new" not in workers[old.pid]["tasks"]
        # 1. The new worker frozen: the old one takes every message, and hands each over.
        new.send_signal(signal.SIGSTOP)
        try:
            first = [producer.send_sync("deploy.new", (i,)) for i in range(MESSAGES)]
            # Every message delivered, none left with the old worker: each handed over (or
            # taken by the new worker's read blocked when it was frozen: one per level).
            wait_until(
                lambda: _holders(client, namespace) == {workers[new.pid]["id"]: MESSAGES},
                60,
                "every message handed to the new worker",
            )
        finally:
            new.send_signal(signal.SIGCONT)
        # 2. Both running: whichever takes a message first, it runs on the new worker.
        second = [producer.send_sync("deploy.new", (i,)) for i in range(MESSAGES, 2 * MESSAGES)]
        handles = first + second

        def records() -> list[Any]:
            found = [producer.inspect_sync(h.id) for h in handles]
            done = [r for r in found if r is not None and r.state is TaskState.SUCCEEDED]
            return found if len(done) == len(handles) else []

        found = wait_until(records, 60, "every deploy.new message to run")
    finally:
        _stop(old, new)
        client.close()
    for i, record in enumerate(found):
        assert record.result == 2 * i
        assert f":{new.pid}:" in (record.worker or "")  # only the knower ran them
        assert record.attempts == 1  # a hand-over spends no attempt
    counts = handed()
    # The frozen worker's blocked read (one message per priority level) took the others.
    assert len({h.id for h in first} & set(counts)) >= MESSAGES - 3
    assert set(counts) <= {h.id for h in handles}
    assert max(counts.values()) == 1, counts  # ... and each at most once
    assert "back on the schedule" not in old_log.read_text()  # never left to backoff
    assert producer.dead_letter_count_sync() == 0


@pytest.mark.timeout(120)
def test_with_no_knower_alive_an_unknown_task_waits_for_the_grace_then_dead_letters(
    tmp_path: Path, server_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    old_app, _ = _apps(tmp_path)
    client = redis.Redis.from_url(server_url)
    producer = make_queue(name="deploy")
    old = _spawn(tmp_path, old_app, server_url, namespace, "--unknown-task-grace", "5")
    try:
        wait_until(lambda: _registered(client, namespace), 30, "the worker's registration")
        handle = producer.send_sync("deploy.new", (1,))
        dead = wait_until(lambda: producer.dead_letters_sync(), 60, "the dead letter")
    finally:
        _stop(old)
        client.close()
    assert [d.id for d in dead] == [handle.id]
    assert dead[0].reason == "unknown task"
    log = (tmp_path / f"{old_app}.log").read_text(errors="replace")
    assert "back on the schedule" in log  # deferred while no worker knew it
    assert "handed to worker" not in log


@pytest.mark.both_servers
async def test_a_handed_delivery_is_taken_once_by_its_consumer_only(
    make_queue: Callable[..., Queue],
) -> None:
    old, new, third = (make_queue(name="deploy") for _ in range(3))
    try:
        for queue, consumer in ((old, "w-old"), (new, "w-new"), (third, "w-third")):
            await queue.broker.prepare_consumer(["deploy"], consumer)
        handle = await old.send("deploy.new", (1,))
        [delivery] = await old.broker.fetch("deploy", 10, 0)
        assert delivery.token is not None
        # Only the consumer holding the delivery can hand it over.
        assert not await third.broker.transport.hand_over("deploy", delivery.token, "w-new", 60)
        assert await old.broker.transport.hand_over("deploy", delivery.token, "w-new", 60)
        assert not await old.broker.transport.hand_over("deploy", delivery.token, "w-new", 60)
        assert await third.broker.transport.take_handed("deploy", 10) == []
        [taken] = await new.broker.transport.take_handed("deploy", 10)
        assert (taken.token, taken.payload, taken.deliveries) == (
            delivery.token,
            delivery.payload,
            1,  # a hand-over spends no delivery
        )
        assert await new.broker.transport.take_handed("deploy", 10) == []  # once
        # It is leased to the new consumer now: its lease renews there, not here.
        assert await new.broker.heartbeat("deploy", [delivery.token]) == 1
        assert await old.broker.heartbeat("deploy", [delivery.token]) == 0
        assert handle.id in delivery.payload.decode(errors="replace")
    finally:
        for queue in (old, new, third):
            await queue.close()
