"""Options of the CPU pool checked at the edge: sizes with units, the pool name, the tasks the
CPU pool cannot run (:mod:`blitzq.worker.cpu`)."""

from __future__ import annotations

import pytest

from blitzq import ConfigurationError, Depends, Queue, Worker
from blitzq._checks import byte_size

pytestmark = pytest.mark.timeout(30)


class Pool:
    """A resource type for a ``Depends()`` parameter."""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1024, 1024),
        ("512MiB", 512 * 1024**2),
        ("200MB", 200 * 1000**2),
        ("1G", 1024**3),
        ("1.5gib", int(1.5 * 1024**3)),
        ("64 k", 64 * 1024),
        ("100", 100),
    ],
)
def test_sizes_take_units(value: object, expected: int) -> None:
    assert byte_size("cpu_max_memory", value) == expected


@pytest.mark.parametrize("value", ["lots", "12XB", "", "nanMB", "infG", True, -5, 0, "0.1B"])
def test_bad_sizes_are_refused_naming_the_option(value: object) -> None:
    with pytest.raises(ConfigurationError, match="cpu_max_memory"):
        byte_size("cpu_max_memory", value)


def test_the_worker_checks_its_cpu_options() -> None:
    queue = Queue("cpuopts", redis_url="redis://127.0.0.1:6379/0")
    with pytest.raises(ConfigurationError, match="pool must be"):
        Worker(queue, pool="gpu")
    with pytest.raises(ConfigurationError, match="cpu_max_memory"):
        Worker(queue, cpu_max_memory="lots")
    with pytest.raises(ConfigurationError, match="cpu_processes"):
        Worker(queue, cpu_processes=0)
    worker = Worker(queue, pool="cpu", cpu_max_memory="256MiB", cpu_max_tasks=3)
    assert worker.cpu_max_memory == 256 * 1024**2


def test_a_cpu_task_takes_no_injected_parameter_and_no_soft_timeout() -> None:
    queue = Queue("cpuopts", redis_url="redis://127.0.0.1:6379/0")

    with pytest.raises(ConfigurationError, match="cpu task cannot take"):

        @queue.task(executor="cpu")
        def injected(db: Pool = Depends()) -> int:
            return 1

    with pytest.raises(ConfigurationError, match="soft_timeout is not supported for cpu"):

        @queue.task(executor="cpu", soft_timeout=1)
        def soft() -> None:
            pass
