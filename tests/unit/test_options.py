"""Per-task options: declared by middleware, checked once, unknown ones rejected in one place."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from blitzq import ConfigurationError, Middleware, Queue
from blitzq.extensions import builtin_middleware
from blitzq.options import CORE_OPTIONS, Option, TaskOptions, build_options, positive_seconds


class SlowAfter(Middleware):
    """A middleware declaring one option, as docs/architecture.md's example does."""

    task_options: ClassVar[dict[str, Option]] = {"slow_after": Option(None, positive_seconds)}

    def __init__(self) -> None:
        self.seen: list[tuple[str, Any]] = []

    def setup_task(self, task: Any, options: TaskOptions) -> None:
        self.seen.append((task.name, options.get("slow_after")))


def test_declared_option_is_checked_and_defaulted() -> None:
    middleware = (*builtin_middleware(), SlowAfter())
    options = build_options("t", {"slow_after": 2, "retries": 1}, middleware)
    assert options.get("slow_after") == 2.0
    assert options.slow_after == 2.0  # attribute access for declared options
    assert options.retries == 1
    assert options.get("max_age") is None
    assert options.get("unique") is False
    assert build_options("t", {}, middleware).get("slow_after") is None
    with pytest.raises(ConfigurationError, match="task t: slow_after must be > 0"):
        build_options("t", {"slow_after": -1}, middleware)


def test_unknown_option_is_rejected_in_one_place() -> None:
    with pytest.raises(ConfigurationError, match=r"task t: unknown options \['slow_after'\]"):
        build_options("t", {"slow_after": 2}, builtin_middleware())


def test_an_option_declared_twice_or_shadowing_a_core_one_is_an_error() -> None:
    with pytest.raises(ConfigurationError, match="declared twice"):
        build_options("t", {}, (SlowAfter(), SlowAfter()))

    class Shadow(Middleware):
        task_options: ClassVar[dict[str, Option]] = {"retries": Option(3)}

    assert "retries" in CORE_OPTIONS
    with pytest.raises(ConfigurationError, match="declared twice"):
        build_options("t", {}, (Shadow(),))


def test_queue_task_builds_the_options_once() -> None:
    queue = Queue(redis_url="memory://test-options", namespace="opts")

    @queue.task(name="o.t", max_age=5, lock="k:{x}", lock_limit=2, unique=True)
    def t(x: int) -> int:
        return x

    controls = t.controls
    assert isinstance(controls, TaskOptions)
    assert controls.get("max_age") == 5.0
    assert controls.max_age == 5.0
    assert controls.get("lock_limit") == 2
    assert controls.get("unique_until") == "completion"
    assert len(t.checks) == 2  # expiry, then the lock
    with pytest.raises(ConfigurationError, match=r"task o\.bad: lock_limit must be an int >= 1"):
        queue.task(name="o.bad", lock="k", lock_limit=0)(lambda: None)


def test_queue_task_takes_the_options_of_registered_middleware() -> None:
    """An option a middleware declares is a keyword of ``@queue.task`` once the middleware is
    registered (nothing else names it), checked by that middleware's check."""
    queue = Queue(redis_url="memory://test-options", namespace="opts")
    with pytest.raises(
        ConfigurationError, match=r"task o\.early: unknown options \['slow_after'\]"
    ):
        queue.task(name="o.early", slow_after=2)(lambda: None)
    slow = SlowAfter()
    queue.add_middleware(slow)

    @queue.task(name="o.slow", slow_after=2)
    def t() -> None: ...

    assert t.controls.get("slow_after") == 2.0
    assert queue.task(name="o.default")(lambda: None).controls.get("slow_after") is None
    mine = [seen for seen in slow.seen if seen[0].startswith("o.")]  # not workflow's own
    assert mine == [("o.slow", 2.0), ("o.default", None)]  # setup_task for each task
    with pytest.raises(ConfigurationError, match=r"task o\.neg: slow_after must be > 0"):
        queue.task(name="o.neg", slow_after=-1)(lambda: None)
    with pytest.raises(ConfigurationError, match=r"unknown options \['slow_aftr'\]"):
        queue.task(name="o.typo", slow_aftr=2)(lambda: None)
    every = queue.periodic(60, name="o.periodic", slow_after=3)(lambda: None)
    assert every.controls.get("slow_after") == 3.0


def test_middleware_added_after_a_task_gives_it_the_defaults() -> None:
    """A middleware added later is plugged into the tasks registered before it (defaults and
    ``setup_task``); a second declaration of one option is refused and registers nothing."""
    queue = Queue(redis_url="memory://test-options", namespace="opts")
    early = queue.task(name="o.before")(lambda: None)
    slow = SlowAfter()
    queue.add_middleware(slow)
    assert early.controls.get("slow_after") is None
    assert early.controls.get("max_age") is None  # the task's other options are kept
    assert ("o.before", None) in slow.seen
    with pytest.raises(ConfigurationError, match="declared twice"):
        queue.add_middleware(SlowAfter())
    assert queue.middleware == (slow,)
