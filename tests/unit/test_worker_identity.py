"""A worker's default id (``worker/identity.py``): ``host:supervisor-slot`` under a
supervisor, so two supervisors on one host never share one; ``host:pid:random`` without."""

from __future__ import annotations

import socket

import pytest

from blitzq.worker.identity import SUPERVISOR_ENV, default_worker_id, new_instance
from blitzq.worker.ports import SLOT_ENV


def test_a_slot_id_names_its_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    host = socket.gethostname()
    monkeypatch.setenv(SLOT_ENV, "0")
    monkeypatch.setenv(SUPERVISOR_ENV, "4211")
    first = default_worker_id(new_instance())
    monkeypatch.setenv(SUPERVISOR_ENV, "4300")
    second = default_worker_id(new_instance())
    assert (first, second) == (f"{host}:4211-0", f"{host}:4300-0")
    monkeypatch.setenv(SLOT_ENV, "3")
    assert default_worker_id("x") == f"{host}:4300-3"  # the same across the slot's restarts


def test_a_slot_set_by_hand_keeps_its_bare_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOT_ENV, "2")
    for value in (None, "", "not-a-pid"):
        if value is None:
            monkeypatch.delenv(SUPERVISOR_ENV, raising=False)
        else:
            monkeypatch.setenv(SUPERVISOR_ENV, value)
        assert default_worker_id("x") == f"{socket.gethostname()}:2"


def test_an_unsupervised_worker_is_named_by_its_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SLOT_ENV, raising=False)
    monkeypatch.setenv(SUPERVISOR_ENV, "4211")  # no slot: not a supervisor's worker
    one, two = new_instance(), new_instance()
    assert one != two
    assert default_worker_id(one) == f"{socket.gethostname()}:{one}"
    assert default_worker_id(one) != default_worker_id(two)
