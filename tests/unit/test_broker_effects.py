"""The typed completion effects encode to the exact tuples ``lua/complete.lua`` reads."""

from __future__ import annotations

from typing import Any

import pytest

from blitzq import BrokerError
from blitzq.broker import effects


@pytest.mark.parametrize(
    ("op", "wire"),
    [
        (effects.Publish("q", b"m"), ("publish", "", "q", b"m")),
        (effects.Publish("q", b"m", "l"), ("publish", "l", "q", b"m")),
        (effects.WorkflowStart("w", b"\x90", 60, 1.5), ("workflow_start", "w", b"\x90", 60, "1.5")),
        (effects.WorkflowStep("w", "q", b"m"), ("workflow_step", "w", "", "q", b"m")),
        (effects.WorkflowDone("w", b"r", 60, 2.0), ("workflow_done", "w", b"r", 60, "2.0")),
        (
            effects.WorkflowFail("w", "failed", "E", "boom", "s1", 60, 3.25),
            ("workflow_fail", "w", "failed", "E", "boom", "s1", 60, "3.25"),
        ),
        (
            effects.ChordMember("w", "j1", "0", 2, b"A", 60, "", "cb", b"<", b">", 4.0, 1, 90, 512),
            ("chord", "w", "j1", "0", 2, b"A", 60, "", "cb", b"<", b">", "4.0", 1, 90, 512),
        ),
        (effects.UniqueRelease("t:k", "id"), ("unique_release", "t:k", "id")),
        (effects.LockRelease("k", "h"), ("lock_release", "k", "h")),
        (effects.Progress("id", 5.0, b"d", 60), ("progress", "id", "5.0", b"d", 60)),
    ],
)
def test_each_effect_encodes_to_its_wire_tuple(op: effects.Op, wire: tuple[Any, ...]) -> None:
    assert effects.encode_op(op) == wire
    assert effects.op_size(op) == sum(len(i) if isinstance(i, str | bytes) else 8 for i in wire)


def test_every_effect_is_registered_once() -> None:
    names = list(effects.COMPLETION_OPS.values())
    assert len(names) == len(set(names)) == 9


def test_a_value_that_is_no_effect_is_a_permanent_broker_error() -> None:
    unknown: Any = ("publish", "", "q", b"m")
    with pytest.raises(BrokerError) as refused:
        effects.encode_op(unknown)
    assert refused.value.transient is False
