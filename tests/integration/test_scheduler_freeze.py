"""Every scheduler of a namespace frozen together (SIGSTOP, a VM pause), then resumed.

Real ``blitzq scheduler`` processes dispatch many ``Every(1)`` entries (``missed="skip"``
and ``missed="run_once"``); all of them are stopped with SIGSTOP, preferably half-way
through a tick, for several occurrences, then resumed. Nothing consumes the queue, so the
stream keeps every dispatched message: its task id names the occurrence
(``periodic:<name>:<unix seconds>``) and its stream id the server time (ms) of the claim
that published it. The assertions are on which occurrences were dispatched, and on the
claim of each one, never on how late anything was by a clock of the test:

* skip: none of the occurrences missed during the freeze is dispatched, except at most the
  one due within the last second at the resume (it is due now);
* run_once: exactly one catch-up, at most one dispatched occurrence that came due during the
  freeze (the buggy scheduler claimed the stale occurrence it decided before the pause too);
* every occurrence claimed after the resume was the newest due when it was claimed, and no
  occurrence is dispatched twice (invariant 7).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from blitzq import Queue
from blitzq.scheduler import Scheduler
from blitzq.schedules import Every
from blitzq.serialization import decode_envelope
from tests.polling import wait_until
from tests.procfs import proc_state

ENTRIES = 120  # of each policy
SCHEDULERS = 2
FROZEN = 4.5  # seconds of server time the schedulers stay stopped

APP = f"""
import blitzq
from blitzq.schedules import Every

queue = blitzq.Queue()


@queue.task(name="freeze.tick")
async def tick() -> None:
    return None


for i in range({ENTRIES}):
    queue.add_periodic(tick, Every(1), name=f"skip-{{i:03d}}", missed="skip")
    queue.add_periodic(tick, Every(1), name=f"once-{{i:03d}}", missed="run_once")
"""


@pytest.fixture
def app_module(tmp_path: Path) -> str:
    """A fresh importable application module (unique name) in ``tmp_path``."""
    name = f"freeze_app_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(APP)
    return name


def _spawn(tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    script = Path(sys.executable).with_name("blitzq")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "blitzq"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *sys.path])
    return subprocess.Popen(
        [*command, *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def _server_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


Dispatch = tuple[int, int]  # (occurrence, claim time in server ms)


def _dispatches(client: redis.Redis, stream: str) -> dict[str, list[Dispatch]]:
    """Each entry's dispatched occurrences with their claim times, in claim order."""
    out: dict[str, list[Dispatch]] = defaultdict(list)
    seen: set[str] = set()
    for entry_id, fields in client.xrange(stream):
        task_id = decode_envelope(fields[b"m"]).id
        assert task_id not in seen, f"{task_id} dispatched twice"
        seen.add(task_id)
        _, name, stamp = task_id.split(":")
        out[name].append((int(stamp), int(entry_id.split(b"-")[0])))
    return out


@pytest.mark.timeout(180)
def test_frozen_schedulers_resume_skip_on_time_and_run_once_with_one_catch_up(
    tmp_path: Path, app_module: str, server_url: str, namespace: str
) -> None:
    args = ["scheduler", f"{app_module}:queue", "--redis-url", server_url]
    procs = [_spawn(tmp_path, *args, "--namespace", namespace) for _ in range(SCHEDULERS)]
    client = redis.Redis.from_url(server_url)
    stream = "{" + namespace + "}:s:default"
    names = [f"{p}-{i:03d}" for i in range(ENTRIES) for p in ("skip", "once")]
    try:

        def running() -> bool:
            found = _dispatches(client, stream)
            return all(len(found.get(n, ())) >= 2 for n in names)

        wait_until(running, 60, "every entry dispatched twice", interval=0.2)

        def mid_tick() -> bool:
            # Some entries have their newest occurrence claimed, some not yet: a tick is
            # under way (the freeze should land inside one, where the decisions are made).
            newest = client.hgetall("{" + namespace + "}:periodic")
            stamps = {int(float(v)) for v in newest.values()}
            return len(stamps) > 1 and len(newest) == len(names)

        with contextlib.suppress(AssertionError):  # a freeze between ticks is one too
            wait_until(mid_tick, 10, "a tick half done", interval=0.002)
        for p in procs:
            p.send_signal(signal.SIGSTOP)
        wait_until(lambda: all(proc_state(p.pid) == "T" for p in procs), 10, "stopped")
        stopped_at = _server_now(client)
        wait_until(lambda: _server_now(client) >= stopped_at + FROZEN, 30, "the freeze")
        resumed_at = _server_now(client)
        for p in procs:
            p.send_signal(signal.SIGCONT)

        def resumed() -> bool:
            found = _dispatches(client, stream)
            return all(any(o > resumed_at + 2 for o, _ in found[n]) for n in names)

        wait_until(resumed, 60, "every entry dispatched again after the resume", interval=0.2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
        errors = [p.communicate(timeout=30)[1].decode(errors="replace") for p in procs]
    found = _dispatches(client, stream)
    client.close()
    assert [p.returncode for p in procs] == [0] * SCHEDULERS, errors
    # Stream ids count whole ms: a claim in the ms of the resume came after it (nothing
    # was claimed while every scheduler was stopped, seconds after the last claim before).
    resumed_ms = int(resumed_at * 1000)
    catch_ups: dict[str, list[int]] = {}
    for name in names:
        before = [o for o, claimed in found[name] if claimed < resumed_ms]
        after = [(o, claimed) for o, claimed in found[name] if claimed >= resumed_ms]
        last = max(before)
        # The freeze spanned several occurrences, none of them claimed before the resume.
        assert int(resumed_at) - last >= 3, (name, last, stopped_at, resumed_at)
        for occurrence, claimed in after:
            # Claimed while it was the newest due occurrence (never a decision made before
            # the freeze, claimed after it).
            assert occurrence * 1000 <= claimed < (occurrence + 1) * 1000, (name, occurrence)
        catch_ups[name] = [o for o, _ in after if o <= resumed_at]
    for name, missed in catch_ups.items():
        if name.startswith("skip"):
            # None of the missed occurrences, but for the one due at the resume (due now).
            assert missed in ([], [int(resumed_at)]), (name, missed, resumed_at)
        else:
            # One catch-up: the newest missed occurrence, or (when the scheduler came round
            # to the entry only after the next one was due) that next one, never two.
            assert len(missed) <= 1, (name, missed, resumed_at)


@pytest.mark.both_servers
async def test_a_claim_is_refused_once_its_occurrence_is_superseded(
    make_queue: Callable[..., Queue],
) -> None:
    queue = make_queue()
    broker = queue.broker
    try:
        now = await broker.server_time()
        # Decided before a pause: the next occurrence came due meanwhile (until passed).
        assert not await broker.claim_periodic("beat", now - 2, b"stale", "default", until=now)
        assert await broker.periodic_last(["beat"]) == {}
        assert await broker.claim_periodic("beat", now - 1, b"due", "default", until=now + 60)
        assert await broker.periodic_last(["beat"]) == {"beat": now - 1}
        # run_all passes no limit: an older occurrence is still refused by the compare-and-set.
        assert not await broker.claim_periodic("beat", now - 2, b"older", "default")
    finally:
        await queue.close()


def test_each_policy_limits_its_claim(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()

    @queue.task(name="freeze.limited")
    async def limited() -> None:
        return None

    scheduler = Scheduler(queue, poll_interval=1.0, grace=1.0)
    entries = {
        policy: queue.add_periodic(limited, Every(10), name=f"limited-{policy}", missed=policy)
        for policy in ("run_all", "run_once", "skip")
    }
    assert scheduler.claim_until(entries["run_all"], 100.0, jumped=False) is None
    # After a forward step every policy dispatches one occurrence: the newest.
    assert scheduler.claim_until(entries["run_all"], 100.0, jumped=True) == 110.0
    assert scheduler.claim_until(entries["run_once"], 100.0, jumped=False) == 110.0
    assert scheduler.claim_until(entries["skip"], 100.0, jumped=False) == 102.0  # 1 s + 1 s
    queue.close_sync()
