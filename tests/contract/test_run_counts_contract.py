"""The namespace's run counters (``counters()`` ``processed`` / ``failed``) count a run in the
same atomic step as its completion's writes, wherever the store says it does
(``StateStore.counts``): a completion applied counts its run once, a stale one (fenced: none of
its writes applied) counts nothing, also inside a batch of mixed outcomes.

The worker sets ``Completion.tally`` only where ``state.counts`` is true (else its
registrations count the run); these tests do the same, so on a store that counts nothing with
its writes they check that nothing is counted there.
"""

from __future__ import annotations

from collections.abc import Callable

from blitzq.broker import Broker, Completion

from .test_broker_contract import Q, consumer, ids, message
from .test_fencing_contract import lose_lease, needs_fencing, record


def tallied(broker: Broker, c: Completion, tally: int) -> tuple[Completion, int, int]:
    """``c`` with its run's tally set as a worker sets it (only where the store counts it),
    and what it adds to (processed, failed) once applied."""
    if not broker.state.counts(c):
        return c, 0, 0
    c.tally = tally
    return c, int(tally == 1), int(tally == 2)


async def runs(broker: Broker) -> tuple[int, int]:
    """The namespace's (processed, failed) counters."""
    counters = await broker.counters()
    return counters.get("processed", 0), counters.get("failed", 0)


async def test_an_applied_completion_counts_its_run_once(broker: Broker) -> None:
    await consumer(broker)
    await broker.publish(Q, [message(f"c{i}") for i in range(4)])
    d = await broker.fetch(Q, 4, 0)
    assert len(d) == 4
    made = [
        tallied(broker, Completion(Q, d[0].token, "c0", record("c0", "succeeded", "w"), 60), 1),
        tallied(broker, Completion(Q, d[1].token, "c1", record("c1", "failed", "w"), 60), 2),
        tallied(broker, Completion(Q, d[2].token, "c2"), 1),  # acked, nothing stored
        tallied(  # a retry: a run that failed
            broker, Completion(Q, d[3].token, "c3", reschedule=message("c3"), delay=60.0), 2
        ),
    ]
    assert await broker.complete([c for c, _, _ in made]) == []
    assert await runs(broker) == (sum(p for _, p, _ in made), sum(f for _, _, f in made))


async def test_a_stale_completion_counts_no_run(
    broker: Broker, make_broker: Callable[[], Broker]
) -> None:
    """A fenced completion in a batch of fresh ones, its outcome unlike theirs, both as
    records and as bare acks: only the fresh ones' runs count."""
    needs_fencing(broker)
    rescuer = make_broker()
    old, new = await lose_lease(broker, rescuer, "s0")
    theirs, p0, f0 = tallied(
        broker, Completion(Q, new.token, "s0", record("s0", "succeeded", "w2"), 60), 1
    )
    assert await rescuer.complete([theirs]) == []
    await broker.publish(Q, [message(f"s{i}") for i in range(1, 5)])
    d = await broker.fetch(Q, 4, 0)
    assert ids(d) == ["s1", "s2", "s3", "s4"]
    stored = [
        tallied(broker, Completion(Q, d[0].token, "s1", record("s1", "succeeded", "w"), 60), 1),
        tallied(broker, Completion(Q, old.token, "s0", record("s0", "failed", "w"), 60), 2),
        tallied(broker, Completion(Q, d[1].token, "s2", record("s2", "failed", "w"), 60), 2),
    ]
    stale = await broker.complete([c for c, _, _ in stored])
    assert [c.task_id for c in stale] == ["s0"]
    bare = [
        tallied(broker, Completion(Q, d[2].token, "s3"), 1),
        tallied(broker, Completion(Q, old.token, "s0"), 1),
        tallied(broker, Completion(Q, d[3].token, "s4"), 2),
    ]
    stale = await broker.complete([c for c, _, _ in bare])
    assert [c.task_id for c in stale] == ["s0"]
    fresh = [stored[0], stored[2], bare[0], bare[2]]
    expected = (p0 + sum(p for _, p, _ in fresh), f0 + sum(f for _, _, f in fresh))
    assert await runs(broker) == expected
    if broker.state.counts(theirs):
        assert expected == (3, 2)  # s0 (the rescuer), s1, s3; s2, s4
