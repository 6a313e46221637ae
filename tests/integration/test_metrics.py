"""Prometheus metrics of a worker, scraped over HTTP as Prometheus does (real Redis, real
worker, prometheus-client's text parser): each outcome counted once with its labels, the
histograms and gauges, and one endpoint per process under ``--workers 2``."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blitzq import ConfigurationError, Queue, RetryPolicy, Worker
from blitzq.logcontext import dropped_records

from ..polling import wait_until
from ..ports import free_port
from .proc_tasks import eventually, make_worker, running

pytestmark = pytest.mark.timeout(90)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text page: ``(name, labels) -> value``."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


async def scrape(worker: Worker) -> Samples:
    """The worker's metrics page, parsed (empty until the worker serves it)."""
    address = worker.ops.metrics_address
    if address is None:
        return {}
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"http://127.0.0.1:{address[1]}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


async def test_each_outcome_is_counted_once_with_its_labels(
    make_queue: Callable[..., Queue], namespace: str
) -> None:
    queue = make_queue(name="m")
    fast = RetryPolicy(base=0.01, factor=1.0, jitter="none")
    tries: dict[str, int] = {}
    release = asyncio.Event()

    @queue.task(name="ok")
    async def ok() -> int:
        return 1

    @queue.task(name="flaky", retries=1, retry_policy=fast)
    async def flaky() -> str:
        tries["flaky"] = tries.get("flaky", 0) + 1
        if tries["flaky"] == 1:
            raise ValueError("first attempt fails")
        return "ok"

    @queue.task(name="doomed", retries=0)
    async def doomed() -> None:
        raise ValueError("always")

    @queue.task(name="quiet", retries=0, dead_letter=False)
    async def quiet() -> None:
        raise ValueError("fails, no dead letter")

    @queue.task(name="waits")
    async def waits() -> None:
        await release.wait()

    @queue.task(name="old", max_age=0.05)
    async def old() -> None:
        pass

    # unknown_task_grace=0: an unknown task is rejected at once, not deferred for a deploy.
    worker = make_worker(queue, metrics_port=0, ops_host="127.0.0.1", unknown_task_grace=0)
    async with running(worker):
        await ok.enqueue()
        await ok.enqueue()
        await flaky.enqueue()
        await doomed.enqueue()
        await quiet.enqueue()
        await old.options(delay=0.3).enqueue()  # promoted 0.3 s later: past its max_age
        await queue.send("no.such.task", queue="m")
        waiting = await waits.enqueue()
        await eventually(
            lambda: scrape(worker),
            lambda s: value(s, "blitzq_tasks_in_progress", queue="m") == 1,
        )
        assert await waiting.cancel()

        expected = {
            ("ok", "succeeded"): 2,
            ("flaky", "retried"): 1,
            ("flaky", "succeeded"): 1,
            ("doomed", "dead_lettered"): 1,
            ("quiet", "failed"): 1,
            ("waits", "cancelled"): 1,
            ("old", "expired"): 1,
            ("no.such.task", "rejected"): 1,
        }

        def counts(s: Samples) -> dict[tuple[str, str], float]:
            return {
                (dict(labels)["task"], dict(labels)["outcome"]): v
                for (name, labels), v in s.items()
                if name == "blitzq_tasks_total" and dict(labels)["queue"] == "m"
            }

        samples = await eventually(
            lambda: scrape(worker),
            lambda s: (
                counts(s) == expected
                and value(s, "blitzq_dead_letters", namespace=namespace) == 3
                and value(s, "blitzq_workers", namespace=namespace) == 1
                # sampled every few seconds: the sample after the last start
                and value(s, "blitzq_queue_depth", queue="m", state="waiting") == 0
            ),
        )
        # Histograms: one duration per run that started, one latency per start.
        started = 2 + 2 + 1 + 1 + 1  # ok, flaky (two attempts), doomed, quiet, waits
        assert value(samples, "blitzq_task_duration_seconds_count", queue="m", task="ok") == 2
        assert value(samples, "blitzq_task_duration_seconds_count", queue="m", task="flaky") == 2
        assert value(samples, "blitzq_task_queue_latency_seconds_count", queue="m") == started
        assert value(samples, "blitzq_tasks_in_progress", queue="m") == 0
        assert value(samples, "blitzq_queue_depth", queue="m:high", state="waiting") == 0
        assert value(samples, "blitzq_queue_depth", queue="*", state="scheduled") is not None
        assert value(samples, "blitzq_stale_completions_total") == 0
        assert value(samples, "blitzq_abandoned_threads_total") == 0
        assert value(samples, "blitzq_log_records_dropped_total") == dropped_records()

        # The namespace's runs as the registrations reported them (sampled): this worker's.
        def runs(s: Samples) -> tuple[float | None, ...]:
            return tuple(
                value(s, "blitzq_namespace_runs_total", namespace=namespace, outcome=outcome)
                for outcome in ("succeeded", "failed")
            )

        assert worker.processed == 3  # ok twice, flaky's second attempt
        await eventually(
            lambda: scrape(worker), lambda s: runs(s) == (worker.processed, worker.failed)
        )
        # A counter now (the sampled namespace count); the gauge of that name is gone.
        assert value(samples, "blitzq_namespace_stale_completions_total", namespace=namespace) == 0
        assert value(samples, "blitzq_namespace_stale_completions", namespace=namespace) is None
        # Each attempt that raised, by exception type (flaky's retry, doomed, quiet).
        failures = {
            (dict(labels)["task"], dict(labels)["exception"]): v
            for (name, labels), v in samples.items()
            if name == "blitzq_task_failures_total"
        }
        assert failures == {
            ("flaky", "ValueError"): 1,
            ("doomed", "ValueError"): 1,
            ("quiet", "ValueError"): 1,
        }
        # Never a task id in a label.
        assert not any(waiting.id in v for _, labels in samples for _, v in labels)
    await queue.close()


async def test_task_names_past_the_cap_share_one_label(
    make_queue: Callable[..., Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    from blitzq.worker import tally

    monkeypatch.setattr(tally, "MAX_TASK_NAMES", 2)
    queue = make_queue(name="cap")
    names = [f"t{n}" for n in range(4)]
    for name in names:
        queue.task(name=name)(_noop)
    worker = make_worker(queue, metrics_port=0, ops_host="127.0.0.1")
    async with running(worker):
        for name in names:
            await queue.send(name, queue="cap")

        def tasks(s: Samples) -> dict[str, float]:
            return {
                dict(labels)["task"]: v
                for (name, labels), v in s.items()
                if name == "blitzq_tasks_total"
            }

        seen = await eventually(lambda: scrape(worker), lambda s: sum(tasks(s).values()) == 4)
    assert tasks(seen) == {"t0": 1, "t1": 1, "_other": 2}
    await queue.close()


async def _noop() -> None:
    pass


async def test_bad_ports_are_refused(make_queue: Callable[..., Queue]) -> None:
    queue = make_queue()
    for bad in (-1, 70000, True, "9100"):
        with pytest.raises(ConfigurationError, match="metrics_port"):
            Worker(queue, metrics_port=bad)
    with pytest.raises(ConfigurationError, match="ops_host"):
        Worker(queue, health_port=0, ops_host="")
    with socket.socket() as taken:  # a port in use: a clear error when the worker starts
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        worker = make_worker(queue, metrics_port=taken.getsockname()[1], ops_host="127.0.0.1")
        with pytest.raises(ConfigurationError, match="cannot serve metrics"):
            await asyncio.wait_for(worker.run(), 30)
    await queue.close()


# --------------------------------------------------------------------- supervisor
APP = """
import blitzq

queue = blitzq.Queue()


@queue.task(name="sup.echo")
async def echo(n):
    return n
"""


def _two_free_ports() -> int:
    """A base port whose next port is free too, from this test process's block below the
    kernel's ephemeral range (``tests/ports.py``: a port drawn from that range may be taken
    by any client connection's local end before the workers bind it)."""
    for _ in range(50):
        base = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base
    raise AssertionError("no two adjacent free ports")


def _scrape_sync(port: int) -> Samples | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except httpx.HTTPError:
        return None
    return parse(response.text) if response.status_code == 200 else None


def test_supervised_workers_each_serve_base_port_plus_slot(
    tmp_path: Path, redis_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    (tmp_path / "sup_app.py").write_text(APP)
    base = _two_free_ports()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    argv = (
        f"{sys.executable} -m blitzq --redis-url {redis_url} --namespace {namespace} worker "
        f"sup_app:queue --workers 2 -c 4 --metrics-port {base} --ops-host 127.0.0.1 "
        "--shutdown-timeout 5"
    )
    log = tmp_path / "workers.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv.split(), cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=out
        )
    producer = make_queue()
    try:
        try:
            wait_until(lambda: _scrape_sync(base) and _scrape_sync(base + 1), 60, "endpoints")
        except AssertionError as exc:  # say why: the workers' log
            raise AssertionError(f"{exc}; the workers' log:\n{log.read_text()[-3000:]}") from None
        handles = [producer.send_sync("sup.echo", [n]) for n in range(20)]
        assert [h.result_sync(timeout=30) for h in handles] == list(range(20))

        def total() -> float:
            pages = [_scrape_sync(base), _scrape_sync(base + 1)]
            return sum(
                value(page, "blitzq_tasks_total", queue="default", task="sup.echo",
                      outcome="succeeded") or 0
                for page in pages if page is not None
            )  # fmt: skip

        wait_until(lambda: total() == 20, 30, "20 successes over the two endpoints")
        pages = [_scrape_sync(base), _scrape_sync(base + 1)]
        assert all(p is not None and value(p, "blitzq_workers", namespace=namespace) for p in pages)
        # Each worker process reports its own process_* (the supervisor's are on no page).
        assert all(p is not None and value(p, "process_resident_memory_bytes") for p in pages)
        assert all(p is not None and value(p, "process_start_time_seconds") for p in pages)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        producer.close_sync()
