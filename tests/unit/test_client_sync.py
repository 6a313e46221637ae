"""``blocking()``: the helper that makes every ``*_sync`` twin from its async method.

No server: a plain class with a Portal stands in for a Queue (the twins' end-to-end behaviour
is covered by the integration tests of the sync API: tests/integration/test_queue_api.py).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import warnings
from collections.abc import Iterator

import pytest

from blitzq import Queue
from blitzq.client.sync import Portal, blocking


class Thing:
    """Has the ``_portal`` a twin runs on, and async methods of each parameter shape."""

    def __init__(self) -> None:
        self._portal = Portal(name="test-blocking")
        self.threads: list[str] = []

    async def add(self, a: int, /, b: int = 2, *rest: int, scale: int = 1, **extra: int) -> int:
        """Sum everything, times ``scale``."""
        self.threads.append(threading.current_thread().name)
        return (a + b + sum(rest) + sum(extra.values())) * scale

    add_sync = blocking(add)

    async def fail(self, message: str) -> None:
        raise ValueError(message)

    fail_sync = blocking(fail)


@pytest.fixture
def thing() -> Iterator[Thing]:
    obj = Thing()
    yield obj
    obj._portal.close()


def test_twin_is_a_plain_method_with_the_async_signature() -> None:
    twin = Thing.add_sync
    assert inspect.isfunction(twin)
    assert not inspect.iscoroutinefunction(twin)
    assert inspect.signature(twin) == inspect.signature(Thing.add)
    assert twin.__name__ == "add_sync"
    assert twin.__qualname__ == "Thing.add_sync"
    assert twin.__module__ == __name__
    assert ":meth:`add`" in (twin.__doc__ or "")


def test_twin_passes_every_argument_kind_and_runs_on_the_portal_loop(thing: Thing) -> None:
    assert thing.add_sync(1) == 3
    assert thing.add_sync(1, 10, 100, scale=2, x=1000) == 2 * 1111
    assert thing.threads == ["test-blocking", "test-blocking"]  # not the caller's thread


def test_twin_raises_what_the_async_method_raises(thing: Thing) -> None:
    with pytest.raises(ValueError, match="boom"):
        thing.fail_sync("boom")


async def test_twin_refuses_a_running_event_loop_and_closes_the_coroutine(thing: Thing) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would fail here
        with pytest.raises(RuntimeError, match="running event loop"):
            thing.add_sync(1)
    assert thing.threads == []  # the coroutine never started
    assert await asyncio.to_thread(thing.add_sync, 4) == 6  # from a thread it works


def test_the_public_twins_are_made_by_blocking() -> None:
    """Each twin made by the helper shows the helper's docstring; the ones kept by hand (see
    their comments) are listed here, so a new hand-written twin is a deliberate choice."""
    by_hand = {"close_sync", "get_results_sync"}
    made = {
        name
        for name in dir(Queue)
        if name.endswith("_sync")
        and "for code without an event loop: same arguments" in (getattr(Queue, name).__doc__ or "")
    }
    twins = {name for name in dir(Queue) if name.endswith("_sync")}
    assert twins - made == by_hand


_HELD_WAITER = """
import asyncio
from blitzq.client.sync import Portal

class Holder:
    pass

holder = Holder()
portal = Portal()

async def start() -> None:
    holder.event = asyncio.Event()  # reachable only through this module's globals

    async def waiter() -> None:
        try:
            await holder.event.wait()
        except asyncio.CancelledError:
            print("cancelled at exit")
            raise

    holder.task = asyncio.get_running_loop().create_task(waiter(), name="held-waiter")

portal.call(start())
print("done")
"""


@pytest.mark.timeout(60)
def test_a_task_left_waiting_on_a_portal_is_ended_at_exit_not_destroyed_pending() -> None:
    """A Portal's loop with a task waiting on something only the application's globals
    reach (a result listener of a Queue nobody closed): at exit its tasks are cancelled and
    the loop stopped, where the task was collected pending with the globals and Python
    printed "Task was destroyed but it is pending!" (tester finding)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _HELD_WAITER], capture_output=True, text=True, timeout=50
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["done", "cancelled", "at", "exit"]
    assert "destroyed" not in done.stderr, done.stderr
