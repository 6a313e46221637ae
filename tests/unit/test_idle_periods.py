"""The periods of an idle worker's per-queue work are shared among its queues (issue 25): the
doorbell's safety looks (``broker/redis/doorbell.py``) and the consumer prunings
(``worker/pruning.py``) come at most once per gap whatever the number of queues, and a read
looks again only at the queues a ring named since their last look."""

from __future__ import annotations

import math

from blitzq.broker.redis import doorbell
from blitzq.broker.redis.doorbell import Doorbell, revisit_gap, revisit_period, watch_ttl
from blitzq.worker.pruning import PRUNE_EVERY, PRUNE_GAP, prune_gap


def test_few_queues_keep_their_period_and_many_share_a_flat_budget() -> None:
    assert revisit_period(1) == doorbell.IDLE_BLOCK
    assert revisit_gap(1) == doorbell.IDLE_BLOCK
    assert revisit_gap(4) == doorbell.IDLE_BLOCK / 4
    for n in (16, 64, 1000):  # one look per REVISIT_GAP, each queue every n gaps
        assert revisit_gap(n) == doorbell.REVISIT_GAP
        assert revisit_period(n) == n * doorbell.REVISIT_GAP
        assert watch_ttl(n) >= 2 * revisit_period(n)  # a mark outlives the next look
    assert prune_gap(3) == PRUNE_EVERY / 3
    assert prune_gap(192) == PRUNE_GAP


def _looked(bell: Doorbell, queues: list[str], now: float) -> list[str]:
    chosen = bell.to_look(queues, now, {})
    for q in chosen:
        bell.looked[q] = now
    return chosen


def test_a_read_looks_only_at_queues_rung_since_and_one_safety_look_per_gap() -> None:
    bell = Doorbell()
    queues = [f"q{i}" for i in range(64)]
    assert bell.to_look(queues, 0.0, {}) == queues  # not armed: every queue, every read
    bell.arm(True)
    assert _looked(bell, queues, 0.0)[:64] == queues
    gap = revisit_gap(64)
    assert bell.to_look(queues, 1.0, {}) == []  # nothing rung, no safety look due
    bell.ring("q7")
    assert bell.to_look(queues, 2.0, {}) == ["q7"]
    bell.looked["q7"] = 2.0
    seen = []
    for turn in range(1, 64):  # then one safety look per gap, the least recently looked
        now = turn * gap
        chosen = _looked(bell, queues, now)
        assert len(chosen) == 1
        seen += chosen
    assert "q7" not in seen
    assert len(set(seen)) == 63
    bell.arm(False)
    assert bell.looked == {}
    bell.arm(True)  # subscribed again: a push may have been missed, every queue is looked at
    assert bell.to_look(queues, 100 * gap, {})[:64] == queues


def test_every_other_safety_look_goes_to_a_queue_whose_look_found_messages() -> None:
    bell = Doorbell()
    bell.arm(True)
    queues = ["a", "b", "c"]
    bell.looked.update(a=0.0, b=1.0, c=2.0)
    vacant = {"a": True, "b": True, "c": False}
    bell.revisited = -math.inf
    now = 2.0 + doorbell.IDLE_BLOCK
    picks = []
    for i in range(4):
        t = now + i * revisit_gap(3)
        picks += bell.to_look(queues, t, vacant)
        bell.looked[picks[-1]] = t
    assert picks[0] == "c"  # held messages at its last look, IDLE_BLOCK ago
    assert picks[1] == "a"  # then the least recently looked
