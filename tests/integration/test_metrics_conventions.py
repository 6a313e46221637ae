"""Metrics by the Prometheus conventions (issue 27, point 4), on a real Redis: the
``process_*`` metrics of the worker's process, the age of each queue's oldest waiting
message, failures by exception type (bounded), the namespace's stale completions as a
counter (and an OpenMetrics page that parses), and the producer's enqueued counter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)

from blitzq import ConfigurationError, Queue
from blitzq.metrics import producer_collector
from blitzq.middleware import EnqueueRefused, Middleware, Outgoing
from blitzq.workflow import group

from .proc_tasks import eventually, make_worker, running
from .test_metrics import Samples, parse, scrape, value

pytestmark = pytest.mark.timeout(90)


class CardDeclined(Exception):
    """An application's own exception type (its label is module-qualified)."""


async def test_process_metrics_failures_by_exception_and_stale_counter(
    make_queue: Callable[..., Queue], namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blitzq.worker import tally

    monkeypatch.setattr(tally, "MAX_EXCEPTION_NAMES", 2)
    queue = make_queue(name="conv")

    @queue.task(name="value", retries=0)
    async def bad_value() -> None:
        raise ValueError("no")

    @queue.task(name="card", retries=0, dead_letter=False)
    async def bad_card() -> None:
        raise CardDeclined("declined")

    @queue.task(name="key", retries=0)
    async def bad_key() -> None:
        raise KeyError("third type: past the cap of 2")

    def failures(s: Samples) -> dict[tuple[str, str], float]:
        return {
            (dict(labels)["task"], dict(labels)["exception"]): v
            for (name, labels), v in s.items()
            if name == "blitzq_task_failures_total"
        }

    worker = make_worker(queue, metrics_port=0, ops_host="127.0.0.1")
    async with running(worker):
        # One after the other, so that the first two types take the two labels.
        expected: dict[tuple[str, str], float] = {}
        card = f"{__name__}.CardDeclined"
        for task, label in ((bad_value, "ValueError"), (bad_card, card), (bad_key, "other")):
            await task.enqueue()
            expected[(task.name, label)] = 1
            samples = await eventually(lambda: scrape(worker), lambda s: failures(s) == expected)
        assert failures(samples) == {
            ("value", "ValueError"): 1,
            ("card", card): 1,
            ("key", "other"): 1,
        }
        # process_* of the worker's own process (Linux /proc).
        assert (value(samples, "process_resident_memory_bytes") or 0) > 0
        assert value(samples, "process_cpu_seconds_total") is not None
        assert value(samples, "process_start_time_seconds") is not None
        # The namespace's stale completions: a counter, no longer a gauge of that name.
        assert value(samples, "blitzq_namespace_stale_completions_total", namespace=namespace) == 0
        assert value(samples, "blitzq_namespace_stale_completions", namespace=namespace) is None
        # The OpenMetrics page (what Prometheus asks for first) has no clashing families.
        address = worker.ops.metrics_address
        assert address is not None
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(
                f"http://127.0.0.1:{address[1]}/metrics",
                headers={"Accept": "application/openmetrics-text; version=1.0.0"},
            )
        assert response.headers["content-type"].startswith("application/openmetrics-text")
        names = [f.name for f in openmetrics_families(response.text)]
        assert len(names) == len(set(names))
        assert "blitzq_namespace_stale_completions" in names
    await queue.close()


@pytest.mark.parametrize("mode", ["reliable", "fast"])
async def test_oldest_waiting_age_per_queue(make_queue: Callable[..., Queue], mode: str) -> None:
    """Reliable mode reads the age from the stream; fast mode's lists cannot tell it without
    reading the message: no sample while one waits (never a false 0), 0 when none does."""
    queue = make_queue(name="aged", mode=mode)
    release = asyncio.Event()
    started = asyncio.Event()

    @queue.task(name="blocker")
    async def blocker() -> None:
        started.set()
        await release.wait()

    @queue.task(name="later")
    async def later() -> None:
        pass

    worker = make_worker(queue, metrics_port=0, ops_host="127.0.0.1", concurrency=1)
    async with running(worker):
        metrics = worker.ops.metrics
        assert metrics is not None
        await blocker.enqueue()
        await asyncio.wait_for(started.wait(), 30)
        before = time.time()
        waiting = await later.enqueue()  # the one slot is taken: it waits in the stream

        async def sampled() -> Samples:
            await metrics.sample()  # what the worker's sample loop does every 5 s
            return await scrape(worker)

        if mode == "fast":
            samples = await sampled()
            assert value(samples, "blitzq_queue_depth", queue="aged", state="waiting") == 1
            assert value(samples, "blitzq_queue_oldest_age_seconds", queue="aged") is None
        else:
            samples = await eventually(
                sampled,
                lambda s: (value(s, "blitzq_queue_oldest_age_seconds", queue="aged") or 0) > 0,
            )
            age = value(samples, "blitzq_queue_oldest_age_seconds", queue="aged")
            assert age is not None
            assert age <= time.time() - before + 1.0  # the server's clock, same host
            assert value(samples, "blitzq_queue_depth", queue="aged", state="waiting") == 1
        # The priority levels the worker consumes, with nothing waiting: 0.
        assert value(samples, "blitzq_queue_oldest_age_seconds", queue="aged:high") == 0
        release.set()
        await waiting.result(timeout=30)
        samples = await sampled()
        assert value(samples, "blitzq_queue_oldest_age_seconds", queue="aged") == 0
    await queue.close()


class Refuse(Middleware):
    """Refuses the enqueues of one task name."""

    async def before_enqueue(self, message: Outgoing) -> None:
        if message.envelope.task == "refused":
            raise ValueError("not this one")


async def test_producer_enqueued_counter(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue(name="prod")
    registry = CollectorRegistry()
    collector = producer_collector(queue)
    assert producer_collector(queue) is collector  # one per Queue
    registry.register(collector)
    queue.add_middleware(Refuse())

    @queue.task(name="a")
    async def a(x: int) -> int:
        return x

    @queue.task(name="once", unique=True)
    async def once(x: int) -> int:
        return x

    @queue.task(name="refused")
    async def refused() -> None:
        pass

    await a.enqueue(1)
    await a.options(priority="high").enqueue(2)
    await a.enqueue_many([(3,), (4,), (5,)])
    await queue.send("elsewhere.task", queue="other")
    await queue.apply(group([a.s(6), a.s(7)]))  # two first steps
    await once.enqueue(1)
    await once.enqueue(1)  # a duplicate: not published, not counted
    with pytest.raises(EnqueueRefused):
        await refused.enqueue()

    samples = parse(generate_latest(registry).decode())
    counts = {
        (dict(labels)["queue"], dict(labels)["task"]): v
        for (name, labels), v in samples.items()
        if name == "blitzq_enqueued_total"
    }
    assert counts == {
        ("prod", "a"): 6,
        ("prod:high", "a"): 1,
        ("other", "elsewhere.task"): 1,
        ("prod", "once"): 1,
    }
    with pytest.raises(ConfigurationError):
        producer_collector("not a queue")  # type: ignore[arg-type]
    await queue.close()
