"""Decorators applied to what is already a Task: ``@queue.periodic`` stacked on
``@queue.task``, and ``@queue.task`` twice, are refused with a message saying what to write."""

from __future__ import annotations

import pytest

from blitzq import ConfigurationError, Every, Queue


def test_periodic_on_a_task_says_use_periodic_alone_or_add_periodic() -> None:
    queue = Queue("q")
    with pytest.raises(ConfigurationError, match=r"instead of @queue\.task.*add_periodic"):

        @queue.periodic(Every(1))
        @queue.task
        def tick() -> None: ...

    assert queue.periodic_tasks == {}


def test_task_twice_is_refused() -> None:
    queue = Queue("q")
    with pytest.raises(ConfigurationError, match=r"already a task: apply @queue\.task once"):

        @queue.task(retries=2)
        @queue.task
        def twice() -> None: ...


def test_task_of_another_queue_is_refused_too() -> None:
    first, second = Queue("a"), Queue("b")

    @first.task
    def job() -> None: ...

    with pytest.raises(ConfigurationError, match="already a task"):
        second.task(job)


def test_periodic_alone_and_add_periodic_still_work() -> None:
    queue = Queue("q")

    @queue.periodic(Every(1))
    def tick() -> None: ...

    @queue.task
    def tock() -> None: ...

    entry = queue.add_periodic(tock, Every(2))
    assert tick.name in queue.tasks
    assert entry.task is tock
