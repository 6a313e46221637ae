"""Redis Sentinel: a Queue on ``redis+sentinel://`` follows a failover without a restart.

The test starts its own primary, one replica and three sentinels on free ports (stopped at
the end) and runs a worker through the sentinel URL while ``SENTINEL FAILOVER`` moves the
primary. The original primary has ``min-replicas-to-write 1``: once its replica is promoted
it refuses writes (NOREPLICAS) instead of acknowledging writes that the resynchronisation
would drop (docs/guarantees.md, "Across a Sentinel failover").
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from blitzq import BrokerError, ConfigurationError, Queue
from blitzq.broker.redis.sentinel import make_sentinel_client, parse_sentinel_url

from ..conftest import free_port
from ..polling import wait_until
from .proc_tasks import eventually, make_worker, running

SERVICE = "blitzqtest"
#: The Redis servers' password (``requirepass``), and the sentinels' own.
SERVER_PASSWORD, SENTINEL_PASSWORD = "srv-pw", "sent-pw"

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None, reason="needs the redis-server binary"
)


class SentinelSet:
    """A primary, a replica and three sentinels on free ports of 127.0.0.1, the servers and
    the sentinels each with a password of their own.

    Args:
        min_replicas: give the first primary ``min-replicas-to-write 1`` (see :meth:`start`).

    Attributes:
        upstream: the port the replica replicates from and the sentinels monitor the primary
            at (set before :meth:`start`; default the primary's): a test puts a proxy of its
            own there to stall the replication (the sentinels would move a replica that
            follows another address than theirs back to the primary's).
    """

    def __init__(self, min_replicas: bool = True) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="blitzq-sentinel-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.primary, self.replica = free_port(), free_port()
        self.sentinels = [free_port() for _ in range(3)]
        self.min_replicas = min_replicas
        self.upstream = self.primary

    def _server(self, port: int, *extra: str) -> None:
        args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--repl-diskless-sync-delay", "0", "--dir", str(self.dir)]
        args += ["--requirepass", SERVER_PASSWORD, "--masterauth", SERVER_PASSWORD, *extra]
        self.procs.append(subprocess.Popen(args, stdout=subprocess.DEVNULL))

    def start(self) -> None:
        # Only the first primary refuses writes without a replica: after the failover the
        # new primary has none until Sentinel makes the old one its replica (a test-sized
        # setup: docs/guarantees.md, "A Sentinel failover").
        if self.min_replicas:
            self._server(
                self.primary, "--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"
            )
        else:
            self._server(self.primary)
        self._server(self.replica, "--replicaof", "127.0.0.1", str(self.upstream))
        replica = self.client(self.replica)
        wait_until(
            lambda: (
                (_ask(lambda: replica.info("replication")) or {}).get("master_link_status") == "up"
            ),
            30,
            "the replica in sync",
        )
        for port in self.sentinels:
            conf = self.dir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\nlogfile {self.dir}/s{port}.log\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.upstream} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 2000\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
                f"sentinel auth-pass {SERVICE} {SERVER_PASSWORD}\n"
                f"requirepass {SENTINEL_PASSWORD}\nsentinel sentinel-pass {SENTINEL_PASSWORD}\n"
            )
            command = ["redis-server", str(conf), "--sentinel"]
            self.procs.append(subprocess.Popen(command, stdout=subprocess.DEVNULL))
        for port in self.sentinels:  # SENTINEL FAILOVER needs a replica it has just heard
            sentinel = self.client(port, sentinel=True)
            wait_until(lambda s=sentinel: _replica_ready(s), 90, "a replica fit to promote")

    def client(self, port: int, sentinel: bool = False, decode: bool = True) -> redis.Redis:
        """A client of the server (or, with ``sentinel``, the sentinel) on ``port``; with
        ``decode`` false its replies are bytes (a stream's binary messages)."""
        password = SENTINEL_PASSWORD if sentinel else SERVER_PASSWORD
        return redis.Redis(port=port, password=password, socket_timeout=5, decode_responses=decode)

    def primary_port(self) -> int:
        sentinel = self.client(self.sentinels[0], sentinel=True)
        return int(sentinel.sentinel_get_master_addr_by_name(SERVICE)[1])

    def url(self, query: str = "", dead: int | None = None) -> str:
        """The ``redis+sentinel://`` URL of the set (``query``: more parameters; ``dead``: a
        port where nothing listens, listed before the live sentinels)."""
        ports = ([dead] if dead is not None else []) + self.sentinels
        hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
        url = f"redis+sentinel://:{SERVER_PASSWORD}@{hosts}/{SERVICE}/0"
        return f"{url}?sentinel_password={SENTINEL_PASSWORD}" + (f"&{query}" if query else "")

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _replica_ready(sentinel: redis.Redis) -> bool:
    """Whether ``sentinel`` sees a connected, in-sync replica it got INFO from lately (else
    ``SENTINEL FAILOVER`` answers NOGOODSLAVE)."""
    replicas = _ask(lambda: sentinel.sentinel_slaves(SERVICE)) or []
    return any(
        not r.get("is_disconnected")
        and not r.get("is_sdown")
        and r.get("master-link-status") == "ok"
        and int(r.get("info-refresh", 10**9)) < 5000
        for r in replicas
    )


def _ask(call: Callable[[], Any]) -> Any:
    """``call()``, or ``None`` while the server does not answer yet."""
    try:
        return call()
    except (redis.RedisError, OSError):
        return None


@pytest.fixture
def sentinels() -> Iterator[SentinelSet]:
    """A started :class:`SentinelSet`, stopped after the test."""
    servers = SentinelSet()
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


async def test_url_grammar() -> None:
    """The URL forms of docs/configuration.md and their errors."""
    parsed = parse_sentinel_url(
        "redis+sentinel://user:s%40cret@h1:26380,h2,[::1]:26381/mymaster/3"
        "?sentinel_password=spw&socket_timeout=2"
    )
    assert parsed.sentinels == [("h1", 26380), ("h2", 26379), ("::1", 26381)]
    assert parsed.service == "mymaster"
    assert parsed.sentinel_options == {"password": "spw"}
    assert parsed.server_url == "redis://user:s%40cret@sentinel-primary/3?socket_timeout=2"
    waited = parse_sentinel_url("redis+sentinel://h1/m?wait_replicas=2&wait_timeout=0.25")
    assert (waited.wait_replicas, waited.wait_timeout) == (2, 0.25)
    assert waited.server_url == "redis://sentinel-primary/"
    for bad in (
        "redis+sentinel://h1/m?wait_replicas=x",
        "redis+sentinel://h1/m?wait_replicas=1&wait_timeout=0",
        "redis+sentinel://h1/m?wait_replicas=1&wait_timeout=9&socket_timeout=5",
        "redis+sentinel:///mymaster",
        "redis+sentinel://h1:26379/",
        "redis+sentinel://h1:notaport/mymaster",
        "redis+sentinel://h1/mymaster/zero",
        "redis+sentinel://h1/mymaster/0/extra",
    ):
        with pytest.raises(ConfigurationError):
            Queue(redis_url=bad).broker  # noqa: B018 -- the broker is made on first use


def test_enqueues_wait_for_the_replicas_unless_the_url_opts_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A user-style test lost 146 of 300 enqueues across a ``SENTINEL FAILOVER`` on a URL
    without ``wait_replicas``, with no error: a producer's writes now wait for the replicas
    that exist by default, and only ``wait_replicas=0`` opts them out. Nothing is logged
    either way (the warning that said the URL had the window is gone with the window)."""
    service = f"durable-{uuid.uuid4().hex[:8]}"
    hosts = f"127.0.0.1:{free_port()}"
    expected = {"": (True, 0), "?wait_replicas=0": (False, 0), "?wait_replicas=2": (True, 2)}
    with caplog.at_level(logging.WARNING, logger="blitzq.broker"):
        for query, (enqueues, replicas) in expected.items():
            client = make_sentinel_client(f"redis+sentinel://{hosts}/{service}{query}")
            assert (client.wait_enqueues, client.wait_replicas) == (enqueues, replicas), query
            assert (
                parse_sentinel_url(f"redis+sentinel://{hosts}/s{query}").wait_enqueues is enqueues
            )
    assert not [r for r in caplog.records if "wait_replicas" in r.getMessage()]
    # Every URL waits now (a worker's writes, the enqueues): wait_timeout stays under the
    # socket's timeout whatever wait_replicas says.
    with pytest.raises(ValueError, match="must be under socket_timeout"):
        make_sentinel_client(f"redis+sentinel://{hosts}/{service}?wait_timeout=6&socket_timeout=5")
    # A producer's WAIT is longer than a worker's (a busy host's replica may take a second:
    # an enqueue must not fail for it), under the socket's timeout, never under wait_timeout.
    bounds = {"": 2.0, "?socket_timeout=1": 0.5, "?wait_timeout=3&socket_timeout=10": 3.0}
    for query, seconds in bounds.items():
        client = make_sentinel_client(f"redis+sentinel://{hosts}/{service}{query}")
        assert client.enqueue_wait_timeout == seconds, query


@pytest.mark.timeout(240)  # the set's setup may take 90 s on a loaded machine
async def test_failover_loses_no_task(sentinels: SentinelSet) -> None:
    """Tasks enqueued before, during and after ``SENTINEL FAILOVER`` all complete; a delayed
    task due during it runs; an enqueue during it succeeds or raises BrokerError.

    The producer waits for its replica (``wait_replicas=1``): an enqueue the old primary
    applied in the instant before it saw its replica go is reported, not acknowledged. With
    one replica, the new primary has none until Sentinel makes the old one its replica, so
    enqueues raise BrokerError until then. The worker does not wait: a completion the
    failover loses is redelivered after its (short) visibility timeout.
    """
    namespace = f"sentinel-{uuid.uuid4().hex[:8]}"
    producer = Queue(redis_url=sentinels.url("wait_replicas=1&wait_timeout=2"), namespace=namespace)
    consumer = Queue(redis_url=sentinels.url(), namespace=namespace, visibility_timeout=2.0)
    done: set[int] = set()

    async def record(n: int) -> int:
        done.add(n)
        return n

    send = producer.task(name="sentinel.record")(record)
    consumer.task(name="sentinel.record")(record)
    refused = 0

    async def enqueue(n: int, **options: Any) -> Any:
        nonlocal refused
        try:
            return await send.options(**options).enqueue(n)
        except BrokerError:
            refused += 1  # a clear, typed error is allowed during the failover
            return None

    async def enqueue_until_accepted(n: int) -> Any:
        async def attempt() -> Any:
            return await enqueue(n)

        return await eventually(attempt, lambda handle: handle is not None)

    old_primary = sentinels.primary_port()
    async with running(make_worker(consumer, concurrency=4)):
        before = [await send.enqueue(n) for n in range(20)]
        assert await before[0].result(timeout=30) == 0
        delayed = await send.options(delay=0.5).enqueue(1000)  # due during the failover

        failover = asyncio.create_task(
            asyncio.to_thread(
                sentinels.client(sentinels.sentinels[0], sentinel=True).execute_command,
                "SENTINEL",
                "FAILOVER",
                SERVICE,
            )
        )
        during: list[Any] = []
        moved: Callable[[], bool] = lambda: sentinels.primary_port() != old_primary  # noqa: E731
        n = 100
        while not await asyncio.to_thread(moved):
            if failover.done() and failover.exception() is not None:
                break  # refused: awaiting it below raises the reason
            during.append(await enqueue(n))
            n += 1
            await asyncio.sleep(0.02)
        await failover
        after = [await enqueue_until_accepted(n) for n in range(10_000, 10_005)]
        accepted = [h for h in [*before, delayed, *during, *after] if h is not None]
        for handle in accepted:
            await handle.result(timeout=60)
        # The pub/sub connections (the worker's event listener, the result listener) moved
        # to the new primary too: it has subscribers on the namespace's channels.
        new_primary = sentinels.client(sentinels.primary_port())

        async def channels() -> list[str]:
            names = await asyncio.to_thread(new_primary.pubsub_channels, f"*{namespace}*")
            return list(names)

        await eventually(channels, bool)
    await producer.close()
    await consumer.close()
    assert 1000 in done
    assert {*range(20), *range(10_000, 10_005)} <= done
    assert {h.id for h in accepted} >= {h.id for h in during if h is not None}
    assert sentinels.primary_port() != old_primary
    assert during  # the loop ran at least once during the failover


@pytest.mark.timeout(60)
async def test_unreachable_sentinels_fail_fast_with_one_line() -> None:
    """Sentinels that refuse connections make ``enqueue`` raise BrokerError within the
    documented bound (about 10 s; redis-py's nested retries took minutes), with a short
    message naming the service and each sentinel tried, not redis-py's client repr."""
    dead = [free_port(), free_port()]
    hosts = ",".join(f"127.0.0.1:{port}" for port in dead)
    queue = Queue(redis_url=f"redis+sentinel://{hosts}/{SERVICE}", namespace="sentinel-dead")
    send = queue.task(name="sentinel.dead")(_identity)
    try:
        with pytest.raises(BrokerError) as raised:
            await send.enqueue(1)
        # A second call within the same outage fails after one attempt (no second 10 s).
        with pytest.raises(BrokerError):
            await send.enqueue(2)
    finally:
        await queue.close()
    message = str(raised.value)
    assert raised.value.transient
    assert repr(SERVICE) in message
    for port in dead:
        assert f"127.0.0.1:{port}: connection refused" in message
    assert len(message) < 300
    assert "ConnectionPool" not in message


@pytest.mark.timeout(240)
async def test_dead_sentinel_listed_first(sentinels: SentinelSet) -> None:
    """A sentinel that refuses connections, listed before the live ones, does not stop the
    broker: enqueues and results work (the live sentinel is asked first after the first
    discovery). A service no sentinel monitors (a typo) fails at once, not transient."""
    namespace = f"sentinel-{uuid.uuid4().hex[:8]}"
    queue = Queue(redis_url=sentinels.url(dead=free_port()), namespace=namespace)
    send = queue.task(name="sentinel.identity")(_identity)
    async with running(make_worker(queue, concurrency=2)):
        handles = [await send.enqueue(n) for n in range(5)]
        assert [await h.result(timeout=30) for h in handles] == list(range(5))
    await queue.close()
    typo = Queue(redis_url=sentinels.url().replace(f"/{SERVICE}/", "/nosuchservice/"))
    try:
        with pytest.raises(BrokerError) as raised:
            await typo.task(name="sentinel.identity")(_identity).enqueue(1)
    finally:
        await typo.close()
    assert not raised.value.transient
    assert "'nosuchservice'" in str(raised.value)
    assert "does not monitor it" in str(raised.value)


async def _identity(n: int) -> int:
    return n


async def test_result_pushes_arrive_while_every_pooled_connection_is_busy(
    sentinels: SentinelSet,
) -> None:
    """Through Sentinel too, the result listener's pub/sub connection is its own (a Sentinel
    pool of its own on the same service): with the command pool's only connection held, the
    completion pattern is confirmed and a push arrives."""
    namespace = f"sentinel-{uuid.uuid4().hex[:8]}"
    producer = Queue(redis_url=sentinels.url("max_connections=1&timeout=60"), namespace=namespace)
    try:
        listener = producer.broker.state.conn._results  # type: ignore[attr-defined]
        pool = listener._client.connection_pool
        held = await pool.get_connection()
        try:
            channel = producer.broker.state.keys.done_channel(uuid.uuid4().hex)  # type: ignore[attr-defined]
            fut = await asyncio.wait_for(listener.subscribe(channel), timeout=15)
            publisher = sentinels.client(sentinels.primary_port())
            await asyncio.to_thread(publisher.publish, channel, b"pushed")
            assert await asyncio.wait_for(fut, timeout=15) == b"pushed"
            listener.release(channel, fut)
        finally:
            await pool.release(held)
    finally:
        await producer.close()
