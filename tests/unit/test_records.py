"""The record writer: each builder writes the keys and values blitzq has always written for
its state (the dicts below are the pre-builder code's records), and records written by that
code still read."""

from __future__ import annotations

import dataclasses
import time
import uuid
from typing import Any

import pytest

from blitzq import records
from blitzq.exceptions import SerializationError
from blitzq.records import RECORD_FIELDS, TaskRecord, TaskState
from blitzq.serialization import dumps, loads

ID, TASK, QUEUE, WORKER = "t-1", "app.add", "default", "w-1"
T0, T1 = 1700000000.25, 1700000001.5


def written(data: bytes) -> dict[str, Any]:
    """A record's map, ``finished_at`` checked to be about now and then set to ``None``."""
    out = loads(data)
    assert isinstance(out, dict)
    assert list(out) == [k for k in RECORD_FIELDS if k in out]  # the one key order
    if out.get("finished_at") is not None:
        assert abs(out["finished_at"] - time.time()) < 60
        out["finished_at"] = None
    return out


def run_fields(state: str, finished: bool = True) -> dict[str, Any]:
    """The run-record head the worker has always written (finished_at blanked)."""
    return {
        "id": ID, "task": TASK, "queue": QUEUE, "state": state, "attempts": 2,
        "enqueued_at": T0, "started_at": T1, "finished_at": None, "worker": WORKER,
    }  # fmt: skip


def test_record_fields_are_task_record_fields() -> None:
    names = [f.name for f in dataclasses.fields(TaskRecord)]
    # result_stored is derived from the stored fields, due_at read from the schedule, and
    # args, kwargs, args_truncated from the one stored key "call" (the arguments' preview).
    derived = {"result_stored", "due_at", "args", "kwargs", "args_truncated"}
    assert set(RECORD_FIELDS) == set(names) - derived | {"call"}


@pytest.mark.parametrize("scheduled", [False, True])
def test_queued(scheduled: bool) -> None:
    state = "scheduled" if scheduled else "queued"
    assert written(records.queued(ID, TASK, QUEUE, T0, scheduled)) == {
        "id": ID, "task": TASK, "queue": QUEUE, "state": state, "attempts": 0, "enqueued_at": T0,
    }  # fmt: skip


def test_running_has_no_finished_at() -> None:
    data = records.running(ID, TASK, QUEUE, 2, T0, T1, WORKER)
    assert loads(data) == run_fields("running")
    assert TaskRecord.from_bytes(data).state is TaskState.RUNNING


@pytest.mark.parametrize(
    "value",
    [42, None, "x", [1, {"a": b"b"}], {"when": uuid.UUID(int=7)}],
)
def test_succeeded_with_result(value: Any) -> None:
    data = records.succeeded(ID, TASK, QUEUE, 2, T0, T1, WORKER, value)
    assert written(data) == run_fields("succeeded") | {"result": loads(dumps(value))}
    record = TaskRecord.from_bytes(data)
    assert record.result == value
    assert record.result_stored is True


def test_succeeded_without_result_has_no_result_key() -> None:
    data = records.succeeded(ID, TASK, QUEUE, 2, T0, None, WORKER)
    assert written(data) == run_fields("succeeded") | {"started_at": None}
    assert TaskRecord.from_bytes(data).result_stored is False


@pytest.mark.parametrize("value", [object(), {1: "int key"}, 1 << 70])
def test_succeeded_refuses_values_that_are_not_plain_data(value: Any) -> None:
    with pytest.raises(SerializationError):
        records.succeeded(ID, TASK, QUEUE, 2, T0, T1, WORKER, value)


def test_retrying() -> None:
    data = records.retrying(ID, TASK, QUEUE, 2, T0, T1, WORKER, "builtins.ValueError", "bad")
    assert written(data) == run_fields("retrying") | {
        "error_type": "builtins.ValueError", "error": "bad",
    }  # fmt: skip


@pytest.mark.parametrize("dead", [False, True])
def test_failed_or_dead_lettered(dead: bool) -> None:
    data = records.failed(ID, TASK, QUEUE, 2, T0, T1, WORKER, "E", "m", "Traceback ...", dead)
    state = "dead_lettered" if dead else "failed"
    assert written(data) == run_fields(state) | {
        "error_type": "E", "error": "m", "traceback": "Traceback ...",
    }  # fmt: skip


def test_cancelled_by_worker() -> None:
    data = records.cancelled(ID, TASK, QUEUE, 3, T0, WORKER)
    assert written(data) == {
        "id": ID, "task": TASK, "queue": QUEUE, "state": "cancelled", "attempts": 3,
        "enqueued_at": T0, "finished_at": None, "worker": WORKER,
        "error_type": "TaskCancelled", "error": "cancelled by request",
    }  # fmt: skip


def test_cancelled_by_worker_keeps_when_its_run_started() -> None:
    data = records.cancelled(ID, TASK, QUEUE, 3, T0, WORKER, started_at=T1)
    assert written(data) == {
        "id": ID, "task": TASK, "queue": QUEUE, "state": "cancelled", "attempts": 3,
        "enqueued_at": T0, "started_at": T1, "finished_at": None, "worker": WORKER,
        "error_type": "TaskCancelled", "error": "cancelled by request",
    }  # fmt: skip
    assert list(loads(data)) == [k for k in records.RECORD_FIELDS if k in loads(data)]


def test_cancelling_is_not_final_and_reads_back() -> None:
    assert not TaskState.CANCELLING.is_final
    assert TaskState("cancelling") is TaskState.CANCELLING


def test_cancel_request() -> None:
    assert loads(records.cancel_request(ID, T1)) == {
        "id": ID, "task": "", "queue": "", "state": "cancelled",
        "error_type": "TaskCancelled", "error": "cancelled by request", "finished_at": T1,
    }  # fmt: skip


def test_rejected() -> None:
    data = records.rejected(ID, "", QUEUE, 1, "malformed message", "bad bytes", WORKER)
    assert written(data) == {
        "id": ID, "task": "", "queue": QUEUE, "state": "dead_lettered", "attempts": 1,
        "error_type": "malformed message", "error": "bad bytes", "finished_at": None,
        "worker": WORKER,
    }  # fmt: skip


def test_expired() -> None:
    assert loads(records.expired(ID, TASK, QUEUE, 0, T0, T1, WORKER, "waited")) == {
        "id": ID, "task": TASK, "queue": QUEUE, "state": "expired", "attempts": 0,
        "enqueued_at": T0, "finished_at": T1, "worker": WORKER,
        "error_type": "TaskExpired", "error": "waited",
    }  # fmt: skip


def test_refused_keeps_the_refused_records_run_fields() -> None:
    previous = records.succeeded(ID, TASK, QUEUE, 2, T0, T1, WORKER, "x" * 100)
    data = records.refused(ID, QUEUE, previous, "blitzq.exceptions.BrokerError", "too big")
    assert written(data) == run_fields("failed") | {
        "error_type": "blitzq.exceptions.BrokerError", "error": "too big",
    }  # fmt: skip


@pytest.mark.parametrize("previous", [None, b"\xc1 not msgpack", dumps([1, 2])])
def test_refused_without_a_readable_record(previous: bytes | None) -> None:
    assert written(records.refused(ID, QUEUE, previous, "E", "m")) == {
        "id": ID, "task": "", "queue": QUEUE, "state": "failed", "attempts": 0,
        "enqueued_at": None, "started_at": None, "finished_at": None, "worker": None,
        "error_type": "E", "error": "m",
    }  # fmt: skip


def test_deliveries_exceeded() -> None:
    assert loads(records.deliveries_exceeded(ID, TASK, QUEUE, 5, "crashed", T1)) == {
        "id": ID, "task": TASK, "queue": QUEUE, "state": "dead_lettered", "attempts": 5,
        "error_type": "MaxDeliveriesExceeded", "error": "crashed", "finished_at": T1,
    }  # fmt: skip


def test_records_written_before_the_builders_still_read() -> None:
    # The exact maps (key order included) the hand-built dicts wrote.
    old_success = dumps(run_fields("succeeded") | {"finished_at": T1, "result": [1, 2]})
    record = TaskRecord.from_bytes(old_success)
    assert (record.state, record.result, record.attempts) == (TaskState.SUCCEEDED, [1, 2], 2)
    assert (record.enqueued_at, record.started_at, record.finished_at) == (T0, T1, T1)
    assert record.result_stored is True
    old_rejected = dumps({
        "id": ID, "task": "", "queue": QUEUE, "state": "dead_lettered", "attempts": 1,
        "error_type": "unknown task", "error": "no such task", "finished_at": T1,
        "worker": WORKER,
    })  # fmt: skip
    record = TaskRecord.from_bytes(old_rejected)
    assert (record.state, record.error_type, record.worker) == (
        TaskState.DEAD_LETTERED, "unknown task", WORKER,
    )  # fmt: skip
    new = records.succeeded(ID, TASK, QUEUE, 2, T0, T1, WORKER, [1, 2])
    old_map, new_map = loads(old_success), loads(new)
    old_map["finished_at"] = new_map["finished_at"]
    assert dumps(old_map) == new  # the same bytes as before, key order included


# ------------------------------------------------------------------- the arguments' preview
CALL = ([1, "two"], {"three": b"\x03"})
SHOWN = {"args": [1, "two"], "kwargs": {"three": "b'\\x03'"}, "truncated": False}


@pytest.mark.parametrize(
    "build",
    [
        lambda call: records.queued(ID, TASK, QUEUE, T0, False, call),
        lambda call: records.running(ID, TASK, QUEUE, 2, T0, T1, WORKER, call),
        lambda call: records.succeeded(ID, TASK, QUEUE, 2, T0, T1, WORKER, 5, call=call),
        lambda call: records.succeeded(ID, TASK, QUEUE, 2, T0, T1, WORKER, call=call),
        lambda call: records.retrying(ID, TASK, QUEUE, 2, T0, T1, WORKER, "E", "m", call),
        lambda call: records.failed(ID, TASK, QUEUE, 2, T0, T1, WORKER, "E", "m", "", call=call),
        lambda call: records.failed(ID, TASK, QUEUE, 2, T0, T1, WORKER, "E", "m", "", True, call),
        lambda call: records.cancelled(ID, TASK, QUEUE, 3, T0, WORKER, call),
        lambda call: records.expired(ID, TASK, QUEUE, 0, T0, T1, WORKER, "waited", call),
    ],
)
def test_a_record_keeps_the_preview_of_its_call_as_its_last_key(build: Any) -> None:
    without, with_call = loads(build(None)), loads(build(CALL))
    assert list(with_call) == [k for k in RECORD_FIELDS if k in with_call]
    assert "call" not in without
    assert list(with_call)[-1] == "call"
    assert with_call["call"] == SHOWN
    record = TaskRecord.from_bytes(build(CALL))
    assert (record.args, record.kwargs, record.args_truncated) == (
        SHOWN["args"], SHOWN["kwargs"], False,
    )  # fmt: skip
    assert record.to_dict()["args"] == SHOWN["args"]
    assert TaskRecord.from_bytes(build(None)).args is None


def test_a_cut_preview_reads_as_truncated_and_refused_keeps_it() -> None:
    previous = records.succeeded(ID, TASK, QUEUE, 2, T0, T1, WORKER, 1, call=(["x" * 9000], {}))
    record = TaskRecord.from_bytes(previous)
    assert record.args_truncated is True
    assert record.args is not None
    assert record.args[0].endswith("…")
    refused = TaskRecord.from_bytes(records.refused(ID, QUEUE, previous, "E", "too big"))
    assert (refused.args, refused.args_truncated) == (record.args, True)


def test_a_stored_call_of_the_wrong_shape_reads_as_none() -> None:
    odd = dumps(run_fields("failed") | {"call": {"args": "not a list", "kwargs": {}}})
    assert TaskRecord.from_bytes(odd).args is None
