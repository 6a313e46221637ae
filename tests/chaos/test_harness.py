"""The chaos suite's own tools: the fault proxy does what it says, and the invariant checks
catch what they should (so a green chaos run means something)."""

from __future__ import annotations

import contextlib
import socket
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .conftest import ChaosServer
from .invariants import (
    Execution,
    Fault,
    Figures,
    check_concurrency,
    check_duplicates,
    check_periodic,
)
from .proxy import FaultProxy


@pytest.fixture
def proxy(chaos_server: ChaosServer) -> FaultProxy:
    made = FaultProxy("127.0.0.1", chaos_server.port)
    made.start()
    yield made
    made.stop()


def client(url: str) -> redis.Redis:
    # No retries: each fault must show as an error here.
    return redis.Redis.from_url(url, socket_timeout=1.0, retry=Retry(NoBackoff(), 0))


def test_proxy_forwards_and_adds_latency(proxy: FaultProxy) -> None:
    c = client(proxy.url)
    assert c.ping()
    proxy.set_latency(0.3)
    started = time.monotonic()
    assert c.set("k", "v")
    assert time.monotonic() - started >= 0.5  # request and reply each delayed 0.3 s
    proxy.set_latency(0.0)
    assert c.get("k") == b"v"
    c.close()


def test_proxy_cut_resets_open_connections_only(proxy: FaultProxy) -> None:
    raw = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    raw.sendall(b"PING\r\n")
    assert raw.recv(100) == b"+PONG\r\n"
    assert proxy.cut() == 1
    with contextlib.suppress(ConnectionResetError):  # a reset, or else EOF
        assert raw.recv(100) == b""
    raw.close()
    c = client(proxy.url)
    assert c.ping()  # a new connection works
    assert proxy.connections == 2
    c.close()


def test_proxy_half_open_leaves_old_connections_silent(proxy: FaultProxy) -> None:
    c = client(proxy.url)
    assert c.ping()
    assert proxy.half_open() == 1
    with pytest.raises(redis.TimeoutError):
        c.ping()
    fresh = client(proxy.url)
    assert fresh.ping()
    fresh.close()


def test_proxy_partition_holds_everything_until_healed(proxy: FaultProxy) -> None:
    c = client(proxy.url)
    assert c.ping()
    proxy.partition()
    with pytest.raises(redis.TimeoutError):
        c.ping()
    with pytest.raises(redis.TimeoutError):
        client(proxy.url).ping()  # new connections hang too
    proxy.heal()
    assert client(proxy.url).ping()


def run(item: str, pid: int, start: float, end: float | None) -> Execution:
    return Execution("work", item, item, pid, start, end)


def test_duplicates_are_explained_only_by_a_fault_of_their_process() -> None:
    kill = Fault("kill_worker", frozenset({1}), 100.0, 100.0)
    executions = [
        run("a", 1, 99.0, None),  # killed mid-run ...
        run("a", 2, 103.0, 103.5),  # ... and recovered: explained
        run("b", 2, 99.0, 99.5),  # ran twice on a process no fault hit: not explained
        run("b", 3, 104.0, 104.5),
        run("c", 1, 50.0, 50.5),  # ran twice long before the fault: not explained
        run("c", 2, 51.0, 51.5),
        run("d", 2, 110.0, 110.5),  # once: fine
    ]
    figures = Figures("t", 1)
    unexplained = check_duplicates(executions, [kill], 3.0, figures)
    assert [u.split(":")[0] for u in unexplained] == ["work b", "work c"]
    assert (figures.duplicates, figures.duplicated_tasks) == (3, 3)
    # A restart of the server hits every process.
    restart = Fault("redis_restart", None, 99.2, 99.8)
    assert check_duplicates(executions, [kill, restart], 3.0, Figures("t", 1)) == [unexplained[1]]


def test_three_runs_need_two_in_flight_at_faults() -> None:
    kill = Fault("kill_worker", frozenset({1}), 100.0, 100.0)
    executions = [run("a", 1, 99.0, None), run("a", 2, 120.0, 121.0), run("a", 3, 130.0, 131.0)]
    assert len(check_duplicates(executions, [kill], 3.0, Figures("t", 1))) == 1


def test_periodic_check_catches_double_claims_gaps_and_lost_occurrences() -> None:
    def tick(occurrence: int) -> Execution:
        return Execution("tick", str(occurrence), f"p:{occurrence}", 1, occurrence, occurrence)

    claims = {b"10|1|1": b"1", b"11|1|2": b"1", b"11|2|1": b"1", b"13|1|3": b"1"}
    count, problems = check_periodic(claims, [tick(10), tick(11)], 1)
    assert count == 3
    assert problems == [
        "occurrence 11 claimed 2 times",
        "occurrence 12 never dispatched",
        "occurrence 13 claimed but never ran",
    ]
    assert check_periodic({b"10|1|1": b"1"}, [tick(10), tick(11)], 1) == (2, [])


def test_concurrency_check_counts_overlaps_per_process() -> None:
    kill = Fault("kill_worker", frozenset({1}), 10.0, 10.0)
    executions = [
        run("a", 1, 0.0, 5.0),
        run("b", 1, 1.0, None),  # killed at 10
        run("c", 1, 4.0, 6.0),  # three at once in pid 1 during [4, 5)
        run("d", 1, 6.0, 7.0),  # starts as c ends: not a fourth
        run("e", 2, 0.0, 1.0),
        run("f", 2, 1.0, 2.0),
    ]
    assert check_concurrency(executions, [kill], {1: 3, 2: 1}) == (3, [])
    assert check_concurrency(executions, [kill], {1: 2, 2: 1}) == (
        3,
        ["pid 1 ran 3 bodies at once (concurrency 2)"],
    )
