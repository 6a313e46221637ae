"""A priority level's name (``default:high``, ``default:low``) is not a queue a worker can be
given: ``blitzq worker -Q default:high`` used to become a worker of all of ``default``.
It is refused by the rule enqueue applies (``routing.check_queue_name``): exit 2 on the
command line (with and without the supervisor), ``ConfigurationError`` from ``Worker``, the
message naming the base queue to give."""

from __future__ import annotations

import pytest

from blitzq import ConfigurationError, Queue, Worker

from .test_exit_codes import APP, blitzq

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("level", ["default:high", "default:low"])
@pytest.mark.parametrize("supervised", [True, False], ids=["supervised", "no-supervise"])
def test_the_cli_refuses_a_level_name(level: str, supervised: bool, redis_url: str) -> None:
    extra = [] if supervised else ["--no-supervise"]
    code, out = blitzq("worker", APP, "-Q", f"emails,{level}", "--redis-url", redis_url, *extra)
    assert code == 2, out
    assert f"--queues: queue name '{level}' ends in" in out
    assert "use the base queue name 'default'" in out


@pytest.mark.parametrize("level", ["default:high", "default:low"])
async def test_worker_and_enqueue_refuse_a_level_name_alike(level: str, redis_url: str) -> None:
    queue = Queue(redis_url=redis_url, namespace="worker-queue-levels")

    @queue.task
    async def noop() -> None:
        pass

    try:
        with pytest.raises(ConfigurationError, match="use the base queue name 'default'"):
            Worker(queue, queues=[level])
        with pytest.raises(ConfigurationError, match="use the base queue name 'default'"):
            await noop.options(queue=level).enqueue()
        assert Worker(queue, queues=["default"]).physical_queues == [
            "default:high",
            "default",
            "default:low",
        ]
    finally:
        await queue.close()
