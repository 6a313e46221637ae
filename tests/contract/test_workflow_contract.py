"""Contract: the workflow completion ops and reads, on every broker (reliable, fast, ephemeral).

The ops carry opaque bytes; these tests check what a broker does with them: a workflow's
state is created, ended once and announced; a step is published only while the workflow
runs; a chord records each member once and fires exactly once, however often a member's
completion is applied (a redelivered member).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from blitzq.broker import Broker, Completion
from blitzq.broker.effects import (
    COMPLETION_OPS,
    ChordMember,
    Op,
    WorkflowDone,
    WorkflowFail,
    WorkflowStart,
    WorkflowStep,
)

TTL = 600


def now() -> float:
    return time.time()


async def apply(broker: Broker, *ops: Op, queue: str = "q") -> None:
    """Apply ``ops`` in one token-less completion (as ``queue.apply`` and handles do)."""
    await broker.complete([Completion(queue, None, "wf-op", ops=ops)])


def start(workflow_id: str) -> WorkflowStart:
    return WorkflowStart(workflow_id, b"\x90", TTL, now())


def chord_op(
    workflow_id: str,
    index: int,
    result: bytes,
    size: int = 2,
    queue: str = "cb",
    splice: int = 1,
) -> ChordMember:
    return ChordMember(
        workflow_id, "j1", str(index), size, result, TTL, "", queue, b"<head>",
        b"<tail>", now(), splice, TTL,
    )  # fmt: skip


async def drain(broker: Broker, queue: str) -> list[bytes]:
    """Every message waiting in ``queue`` (taken and completed)."""
    out: list[bytes] = []
    while True:
        got = await broker.fetch(queue, 100, 0)
        if not got:
            return out
        out += [d.payload for d in got]
        await broker.complete([Completion(queue, d.token, "x") for d in got])


def test_the_workflow_ops_are_registered() -> None:
    for op in (WorkflowStart, WorkflowStep, WorkflowDone, WorkflowFail, ChordMember):
        assert op in COMPLETION_OPS


async def test_start_then_steps_publish_while_running(broker: Broker) -> None:
    await broker.prepare_consumer(["q", "cb"], "c1")
    await apply(broker, start("w1"), WorkflowStep("w1", "q", b"step-1"))
    state = await broker.workflow_state("w1")
    assert state is not None
    assert state["state"] == b"running"
    assert state["steps"] == b"\x90"
    assert await drain(broker, "q") == [b"step-1"]
    assert await broker.workflow_state("unknown") is None


async def test_done_stores_the_result_once_and_wakes_a_waiter(
    make_broker: Callable[[], Broker],
) -> None:
    waiter_side, worker_side = make_broker(), make_broker()
    await apply(worker_side, start("w2"))
    waiting = asyncio.ensure_future(waiter_side.wait_for_workflow("w2", 10.0))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    began = time.monotonic()
    await apply(worker_side, WorkflowDone("w2", b"\x2a", TTL, now()))
    state = await asyncio.wait_for(waiting, 5.0)
    assert time.monotonic() - began < 0.9, "the waiter was polled, not woken"
    assert state is not None
    assert state["state"] == b"succeeded"
    assert state["result"] == b"\x2a"
    # An ended workflow stays as it ended.
    await apply(worker_side, WorkflowDone("w2", b"\x01", TTL, now()))
    await apply(worker_side, WorkflowFail("w2", "failed", "E", "late", "s9", TTL, now()))
    again = await worker_side.workflow_state("w2")
    assert again is not None
    assert (again["state"], again["result"]) == (b"succeeded", b"\x2a")


async def test_fail_ends_the_workflow_and_no_later_step_is_published(broker: Broker) -> None:
    await broker.prepare_consumer(["q", "cb"], "c1")
    await apply(broker, start("w3"))
    await apply(broker, WorkflowFail("w3", "failed", "ValueError", "bad", "s2", TTL, now()))
    state = await broker.wait_for_workflow("w3", 1.0)
    assert state is not None
    assert state["state"] == b"failed"
    assert (state["error_type"], state["error"], state["step"]) == (b"ValueError", b"bad", b"s2")
    await apply(broker, WorkflowStep("w3", "q", b"too-late"))
    await apply(broker, chord_op("w3", 0, b"\x01", size=1))
    assert await drain(broker, "q") == []
    assert await drain(broker, "cb") == []
    cancelled = "w3c"
    await apply(broker, start(cancelled))
    await apply(broker, WorkflowFail(cancelled, "cancelled", "TaskCancelled", "", "", TTL, now()))
    state = await broker.workflow_state(cancelled)
    assert state is not None
    assert state["state"] == b"cancelled"


async def test_chord_counts_a_redelivered_member_once_and_fires_once(broker: Broker) -> None:
    await broker.prepare_consumer(["cb"], "c1")
    await apply(broker, start("w4"))
    await apply(broker, chord_op("w4", 1, b"B"))
    await apply(broker, chord_op("w4", 1, b"B-again"))  # member 1 redelivered: not member 0
    assert await drain(broker, "cb") == []
    await apply(broker, chord_op("w4", 0, b"A"))
    # The first result of each member counts, in index order, between head and tail.
    assert await drain(broker, "cb") == [b"<head>AB<tail>"]
    await apply(broker, chord_op("w4", 0, b"A"), chord_op("w4", 1, b"B"))  # the last, twice
    assert await drain(broker, "cb") == []


async def test_chord_fires_once_when_the_last_member_is_applied_twice_in_one_batch(
    broker: Broker,
) -> None:
    await broker.prepare_consumer(["cb"], "c1")
    await apply(broker, start("w5"))
    await apply(broker, chord_op("w5", 0, b"A", size=3), chord_op("w5", 1, b"B", size=3))
    await broker.complete(
        [
            Completion("q", None, "m2", ops=(chord_op("w5", 2, b"C", size=3),)),
            Completion("q", None, "m2", ops=(chord_op("w5", 2, b"C", size=3),)),
        ]
    )
    assert await drain(broker, "cb") == [b"<head>ABC<tail>"]


async def test_immutable_callback_gets_no_results_spliced(broker: Broker) -> None:
    await broker.prepare_consumer(["cb"], "c1")
    await apply(broker, start("w6"))
    await apply(broker, chord_op("w6", 0, b"A", splice=0), chord_op("w6", 1, b"B", splice=0))
    assert await drain(broker, "cb") == [b"<head><tail>"]


async def test_a_chord_ending_the_workflow_stores_the_list_as_its_result(broker: Broker) -> None:
    await apply(broker, start("w7"))
    await apply(broker, chord_op("w7", 1, b"B", queue=""))
    state = await broker.workflow_state("w7")
    assert state is not None
    assert state["state"] == b"running"
    await apply(broker, chord_op("w7", 0, b"A", queue=""))
    state = await broker.wait_for_workflow("w7", 1.0)
    assert state is not None
    assert state["state"] == b"succeeded"
    assert state["result"] == b"<head>AB<tail>"


async def test_the_chord_op_applies_atomically_with_the_ack(broker: Broker) -> None:
    await broker.prepare_consumer(["members", "cb"], "c1")
    await apply(broker, start("w8"))
    await broker.publish("members", [b"member-0"])
    (delivery,) = await broker.fetch("members", 1, 0)
    await broker.complete(
        [Completion("members", delivery.token, "m0", ops=(chord_op("w8", 0, b"A", size=1),))]
    )
    assert await drain(broker, "cb") == [b"<head>A<tail>"]
    stats = await broker.queue_stats(["members"])
    assert stats["members"] == {"waiting": 0, "in_flight": 0}
