"""blitzq.arg_preview: a JSON-able preview of (args, kwargs), at most 2048 bytes as JSON, cut
with clear marks, and never raising whatever the values; and the note that says why a task
shows none (blitzq.client.task_args.args_note)."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from typing import Any

import pytest

from blitzq.arg_preview import CUT, MAX_PREVIEW_BYTES, preview
from blitzq.client.task_args import args_note
from blitzq.records import TaskRecord, TaskState
from blitzq.serialization import dumps, loads


def size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON (strict: NaN or infinity raise)."""
    return len(
        json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    )


def check(args: Any, kwargs: Any, limit: int = MAX_PREVIEW_BYTES) -> dict[str, Any]:
    """The preview, checked: its keys, under the cap, strict JSON, and storable in a record."""
    out = preview(args, kwargs, limit)
    assert set(out) == {"args", "kwargs", "truncated"}
    assert isinstance(out["args"], list)
    assert isinstance(out["kwargs"], dict)
    assert size(out) <= limit
    assert loads(dumps(out)) == out  # MessagePack round trip: what a record stores
    return out


class Unprintable:
    """Its repr raises."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")


class Shouty:
    """An ordinary object with a repr."""

    def __repr__(self) -> str:
        return "<Shouty!>"


def test_small_plain_arguments_are_kept_as_they_are() -> None:
    args = [1, -2.5, "text", None, True, [1, [2]], {"k": {"n": 1}}]
    out = check(tuple(args), {"a": 1, "b": "é"})
    assert out == {"args": args, "kwargs": {"a": 1, "b": "é"}, "truncated": False}


def test_values_that_are_not_json_become_text() -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    ident = uuid.UUID(int=7)
    out = check(
        (b"\x00\xff", when, dt.date(2026, 1, 2), ident, decimal.Decimal("1.10"), Shouty()),
        {"nan": float("nan"), "inf": float("-inf"), "big": 1 << 70, "set": Unprintable()},
    )
    assert out["args"] == [
        "b'\\x00\\xff'", when.isoformat(), "2026-01-02", str(ident), "1.10", "<Shouty!>",
    ]  # fmt: skip
    assert out["kwargs"] == {
        "nan": "nan", "inf": "-inf", "big": str(1 << 70), "set": "<Unprintable object>",
    }  # fmt: skip
    assert out["truncated"] is False


def test_keys_that_are_not_str_and_lone_surrogates() -> None:
    out = check(("\ud800ok",), {1: "one", (2, 3): "pair", "\udcff": 0})
    assert out["args"] == ["\\ud800ok"]
    assert out["kwargs"] == {"1": "one", "(2, 3)": "pair", "\\udcff": 0}


def test_a_huge_string_is_cut_and_marked() -> None:
    out = check(("x" * 1_000_000,), {})
    (text,) = out["args"]
    assert text.endswith(CUT)
    assert text[:-1] == "x" * (len(text) - 1)
    assert len(text) > MAX_PREVIEW_BYTES - 100  # the budget is used, not wasted
    assert out["truncated"] is True


def test_many_items_end_with_a_count_of_those_left_out() -> None:
    out = check((list(range(10_000)),), {f"k{i}": i for i in range(5_000)})
    (numbers,) = out["args"]
    assert numbers[:3] == [0, 1, 2]
    shown = len(numbers) - 1
    assert numbers[-1] == f"{CUT} {10_000 - shown} more"
    assert out["kwargs"][CUT] == f"{5_000 - (len(out['kwargs']) - 1)} more"
    assert len(out["kwargs"]) > 2  # kwargs keep room of their own
    assert out["truncated"] is True


@pytest.mark.parametrize("width", [1, 3, 4])  # multi-byte characters count as bytes
def test_multibyte_text_stays_under_the_cap(width: int) -> None:
    char = {1: "a", 3: "€", 4: "😀"}[width]
    out = check((char * 5_000, [char * 300] * 50), {char: char * 9_000})
    assert out["truncated"] is True


def test_deep_and_cyclic_values() -> None:
    deep: list[Any] = []
    inner = deep
    for _ in range(100):
        inner.append([])
        inner = inner[0]
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)
    out = check((deep, cyclic), {})
    assert out["truncated"] is True
    assert f"[{CUT}]" in json.dumps(out, ensure_ascii=False)


def test_bytes_are_cut_before_their_repr_is_made() -> None:
    out = check((b"\x01" * 10_000_000,), {})
    assert out["args"][0].startswith("b'\\x01")
    assert out["args"][0].endswith(CUT)
    assert out["truncated"] is True


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [(None, None), ("one", "not a dict"), (iter([1]), 5), ((), {"x": object()})],
)
def test_arguments_of_any_shape_never_raise(args: Any, kwargs: Any) -> None:
    check(args, kwargs)


def test_a_smaller_limit() -> None:
    out = check(("y" * 500, "z" * 500), {"w": "v" * 500}, limit=200)
    assert out["truncated"] is True


# ---------------------------------------------------------------- why none are shown
@pytest.mark.parametrize(
    ("record", "letter", "says"),
    [
        (TaskRecord("t", "app.add", "q", TaskState.SUCCEEDED), False, "unless track_state is on"),
        (TaskRecord("t", "", "", TaskState.RUNNING), False, "in its message only"),
        (TaskRecord("t", "", "", TaskState.CANCELLED), False, "cancelled before a worker"),
        (TaskRecord("t", "app.add", "q", TaskState.DEAD_LETTERED), False, "dead letter is gone"),
        (TaskRecord("t", "app.add", "q", TaskState.DEAD_LETTERED), True, "could not be decoded"),
        (TaskRecord("t", "app.add", "q", TaskState.QUEUED), False, "unless track_state is on"),
        (TaskRecord("t", "app.add", "q", TaskState.FAILED), False, "did not keep them"),
    ],
)
def test_the_note_says_why_no_arguments_are_shown(
    record: TaskRecord, letter: bool, says: str
) -> None:
    assert says in args_note(record, letter)
