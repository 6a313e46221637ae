"""``blitzq dead-letter replay --all`` run from two shells at once: each dead letter is
replayed once (the replay script's compare-and-delete), also when the task fails again and is
dead-lettered anew under its id before the slower shell reaches it; and its ``--rate`` cap.

Both shells are the real command: ``python -m blitzq`` subprocesses, or click's runner for
the one whose listing the test holds back; a real Worker and Redis.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner

import blitzq.client.admin as admin_module
from blitzq import Queue
from blitzq.broker import Broker
from blitzq.cli import cli
from blitzq.client.dead_letter_query import DeadLetterFilter
from blitzq.serialization import decode_envelope
from tests.integration.proc_tasks import worker_thread
from tests.integration.test_cli_ops import _CLEAN_ENV, ROOT, blitzq, subprocess_env
from tests.polling import wait_until

pytestmark = pytest.mark.timeout(120)


def replay_all(url: str, namespace: str) -> subprocess.Popen[bytes]:
    """Start ``blitzq dead-letter replay --all --json`` as another shell would."""
    return subprocess.Popen(
        blitzq(url, namespace, "dead-letter", "replay", "--all", "--json"),
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def outcomes(proc: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
    """The outcomes a finished ``replay --all --json`` printed (exit code 0 checked)."""
    out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err.decode()[-2000:]
    return list(json.loads(out)["outcomes"])


def test_two_shells_replaying_all_replay_each_dead_letter_once(
    make_queue: Callable[..., Queue], redis_url: str
) -> None:
    queue = make_queue(name="race")
    runs: Counter[int] = Counter()
    failing = threading.Event()
    failing.set()

    @queue.task(name="race.flaky", retries=0)
    async def flaky(n: int) -> int:
        runs[n] += 1
        if failing.is_set():
            raise RuntimeError(f"first life of {n}")
        return n

    count = 40
    with worker_thread(queue, queues=["race"], concurrency=8):
        handles = [flaky.enqueue_sync(n) for n in range(count)]
        wait_until(lambda: queue.dead_letter_count_sync() == count, 60, "the dead letters")
        failing.clear()
        shells = [replay_all(redis_url, queue.namespace) for _ in range(2)]
        first, second = (outcomes(p) for p in shells)
        for n, h in enumerate(handles):
            assert h.result_sync(timeout=60) == n
        wait_until(lambda: sum(runs.values()) == 2 * count, 60, "every replayed task to run")
    replayed = [o["id"] for o in first + second if o["outcome"] == "replayed"]
    assert sorted(replayed) == sorted(h.id for h in handles)  # each one exactly once
    assert {o["outcome"] for o in first + second} <= {"replayed", "gone"}
    assert runs == Counter(dict.fromkeys(range(count), 2))
    assert queue.dead_letter_count_sync() == 0
    queue.close_sync()


def test_a_shell_does_not_replay_a_dead_letter_that_failed_again_since_it_listed(
    make_queue: Callable[..., Queue], redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shell B lists (the scan of ``replay --all``); shell A replays the same dead letter,
    which fails again and is dead-lettered anew; B then reaches it: the dead letter it listed
    is gone, and the new one (not matching B's listing) stays for the operator."""
    queue = make_queue(name="race")
    runs: list[int] = []

    @queue.task(name="race.broken", retries=0)
    async def broken(n: int) -> None:
        runs.append(n)
        raise RuntimeError(f"still broken: {n}")

    real_scan = admin_module.scan

    async def listed_then_other_shell(
        broker: Broker, flt: DeadLetterFilter, now: float | None = None
    ) -> AsyncIterator[Any]:
        letters = [dl async for dl in real_scan(broker, flt, now)]
        assert len(letters) == 1
        (letter,) = letters
        shell_a = await asyncio.create_subprocess_exec(
            *blitzq(redis_url, queue.namespace, "dead-letter", "replay", letter.id),
            cwd=ROOT,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(shell_a.communicate(), 60)
        assert shell_a.returncode == 0, err.decode()[-2000:]
        for _ in range(1200):  # the worker runs it again, and it is dead-lettered anew
            again = await broker.get_dead_letter(letter.id)
            if again is not None and again.failed_at != letter.failed_at:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the task replayed by shell A was not dead-lettered again")
        for dl in letters:
            yield dl

    with worker_thread(queue, queues=["race"], concurrency=2):
        handle = broken.enqueue_sync(7)
        wait_until(lambda: queue.dead_letter_count_sync() == 1, 60, "the dead letter")
        before = queue.dead_letters_sync()[0].failed_at
        monkeypatch.setattr(admin_module, "scan", listed_then_other_shell)
        result = CliRunner().invoke(
            cli,
            ["--redis-url", redis_url, "--namespace", queue.namespace,
             "dead-letter", "replay", "--all", "--json"],
            env=_CLEAN_ENV,
            catch_exceptions=False,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        assert [o["outcome"] for o in json.loads(result.stdout)["outcomes"]] == ["gone"]
        (kept,) = queue.dead_letters_sync()
        assert kept.id == handle.id
        assert kept.failed_at > before
        assert runs == [7, 7]  # its first life and shell A's replay; none from shell B
    queue.close_sync()


def test_replay_all_with_a_rate_replays_every_match_oldest_first(
    make_queue: Callable[..., Queue], redis_url: str
) -> None:
    """``--rate 20/s`` (its pacing: tests/unit/test_replay_pacing.py): every match is
    replayed, oldest first, into the stream it came from."""
    queue = make_queue(name="paced")

    @queue.task(name="race.down", retries=0)
    async def down(n: int) -> None:
        raise RuntimeError(f"down {n}")

    count = 5
    with worker_thread(queue, queues=["paced"], concurrency=2):
        for n in range(count):
            down.enqueue_sync(n)
        wait_until(lambda: queue.dead_letter_count_sync() == count, 60, "the dead letters")
    oldest_first = [d.id for d in reversed(queue.dead_letters_sync())]
    result = CliRunner().invoke(
        cli,
        ["--redis-url", redis_url, "--namespace", queue.namespace,
         "dead-letter", "replay", "--all", "--rate", "20/s", "--json"],
        env=_CLEAN_ENV,
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    outcomes = json.loads(result.stdout)["outcomes"]
    assert [o["id"] for o in outcomes] == oldest_first
    assert {o["outcome"] for o in outcomes} == {"replayed"}
    with redis.Redis.from_url(redis_url) as client:
        entries = client.xrange("{" + queue.namespace + "}:s:paced")
    assert [decode_envelope(fields[b"m"]).id for _, fields in entries] == oldest_first
    assert queue.dead_letter_count_sync() == 0
    queue.close_sync()
