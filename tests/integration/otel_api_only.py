"""The program of the API-only tracing test: tasks traced with nothing but ``opentelemetry-api``.

``python -m tests.integration.otel_api_only`` with ``BLITZQ_REDIS_URL`` and ``BLITZQ_NAMESPACE``
set. Before anything imports OpenTelemetry, an import hook makes ``opentelemetry.sdk`` (and
every module under it) unimportable, as in an environment where only the API is installed; no
tracer provider is configured, so the API's no-op tracer is the one used. The program
instruments a Queue, runs a success, a failure that is retried once, a dead-lettered failure,
a task enqueued from inside a task and a workflow (a chord, then a step) through a burst
worker, checks their results and that the SDK was never imported, and prints
``API-ONLY OK``. A log record at ERROR or above (a
tracing hook that raised, say) makes it exit 1, but the worker's record of the one task that
fails for good (``apionly.doomed``, logger ``blitzq.worker.outcomes``), which must be there.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import logging
import sys
from typing import Any


class _NoSDK(importlib.abc.MetaPathFinder):
    """Refuses ``opentelemetry.sdk`` as if it were not installed."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "opentelemetry.sdk" or name.startswith("opentelemetry.sdk."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return


sys.meta_path.insert(0, _NoSDK())


class _Errors(logging.Handler):
    """Keeps every record at ERROR or above."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def main() -> int:
    from opentelemetry import trace

    from blitzq import Queue, RetryPolicy, TaskFailed, Worker
    from blitzq.integrations.opentelemetry import BlitzqInstrumentor
    from blitzq.workflow import chord

    errors = _Errors()
    logging.getLogger().addHandler(errors)
    queue = Queue(name="apionly")
    BlitzqInstrumentor().instrument(queue=queue)  # the global provider: the API's no-op one
    tries = {"n": 0}

    @queue.task(name="apionly.add")
    async def add(a: int, b: int) -> int:
        return a + b

    @queue.task(name="apionly.total")
    async def total(values: list[int]) -> int:
        return sum(values)

    @queue.task(name="apionly.flaky", retries=1, retry_policy=RetryPolicy(base=0.01, jitter="none"))
    async def flaky() -> str:
        tries["n"] += 1
        if tries["n"] == 1:
            raise ValueError("first attempt fails")
        return "second"

    @queue.task(name="apionly.doomed", retries=0)
    def doomed() -> None:
        raise RuntimeError("always")

    @queue.task(name="apionly.parent")
    async def parent() -> str:
        child = await add.enqueue(20, 22)
        return child.id

    handles = [await add.enqueue(2, 3), await flaky.enqueue(), await doomed.enqueue()]
    spawned = await parent.enqueue()
    flow = await queue.apply(chord([add.s(1, 2), add.s(3, 4)], total.s()) | add.s(1100))
    await Worker(queue, burst=True, block_timeout=0.2).run()
    assert await flow.get(timeout=10) == 1110
    assert await handles[0].result(timeout=10) == 5
    assert await handles[1].result(timeout=10) == "second"
    failure: TaskFailed | None = None
    try:
        await handles[2].result(timeout=10)
    except TaskFailed as exc:
        failure = exc
    assert failure is not None, "apionly.doomed did not fail"
    assert "always" in str(failure)
    child_id = await spawned.result(timeout=10)
    assert await queue.get_result(child_id, timeout=10) == 42
    await queue.close()
    assert not any(name.startswith("opentelemetry.sdk") for name in sys.modules)
    assert type(trace.get_tracer("blitzq")).__name__ in ("ProxyTracer", "NoOpTracer")
    failures = [r for r in errors.records if r.name == "blitzq.worker.outcomes"]
    assert [vars(r)["task"] for r in failures] == ["apionly.doomed"], failures
    unexpected = [r for r in errors.records if r not in failures]
    for record in unexpected:
        print("ERROR RECORD:", record.getMessage(), file=sys.stderr)
    if unexpected:
        return 1
    print("API-ONLY OK")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
