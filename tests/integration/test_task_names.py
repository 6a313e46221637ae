"""Task names follow one rule (``routing.check_task_name``: the rule of queue names and
namespaces), where they are given: ``@queue.task(name='')`` used to fall back silently to the
default name, and ``'{x}'`` or ``'a b\\nc'`` were registered; ``send`` by such a name is refused
the same way. Valid names (dotted paths, colons, dashes, a default ``<locals>`` name) keep
working end to end on a real Redis."""

from __future__ import annotations

import asyncio

import pytest

from blitzq import ConfigurationError, Queue, Worker

pytestmark = pytest.mark.timeout(60)

BAD = ["", "{x}", "a b\nc", "a\rb", "with space", "nul\0"]
GOOD = ["myapp.tasks.add", "billing:charge", "emails-send_v2", "a.b.<locals>.c"]


@pytest.mark.parametrize("name", BAD, ids=repr)
def test_registration_refuses_a_bad_name(name: str) -> None:
    queue = Queue(redis_url="memory://task-names")

    with pytest.raises(ConfigurationError, match=r"task name must be a non-empty string") as info:

        @queue.task(name=name)
        async def noop() -> None:
            pass

    assert repr(name) in str(info.value)
    assert queue.tasks == {}


@pytest.mark.parametrize("name", [*BAD, "bad name", 7], ids=repr)
async def test_send_refuses_a_bad_name(name: str, redis_url: str, namespace: str) -> None:
    queue = Queue(redis_url=redis_url, namespace=namespace)
    try:
        with pytest.raises(ConfigurationError, match=r"send: task name must be a non-empty"):
            await queue.send(name)
        with pytest.raises(ConfigurationError, match=r"task name must be a non-empty"):
            await queue.send_many([(name, (), None)])
    finally:
        await queue.close()


@pytest.mark.parametrize("name", GOOD)
async def test_valid_names_still_work(name: str, redis_url: str, namespace: str) -> None:
    queue = Queue(redis_url=redis_url, namespace=namespace)

    @queue.task(name=name)
    async def echo(x: int) -> int:
        return x

    worker = Worker(queue, concurrency=2)
    running = asyncio.create_task(worker.run())
    try:
        assert echo.name == name
        assert await (await queue.send(name, (3,))).result(timeout=30) == 3
    finally:
        worker.stop()
        await running
        await queue.close()
