"""What a ``blitzq worker`` on a plain Redis URL does not import (issue 29: an idle worker's
memory): the parts for other URLs and layouts (Sentinel, a cluster's scripts and replicas, the
spread layout), the workflow engine, periodic entries and cron schedules, ``zoneinfo``, the
process pools, and the other commands' modules. Each loads on first use; the worker here has
started and run a task."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import blitzq
from blitzq import Queue
from tests.integration.test_cli import _blitzq_command, _read_line

pytestmark = pytest.mark.timeout(60)

APP = """
import sys
from blitzq import Queue

queue = Queue()

@queue.task(name="idle_app.modules")
async def modules() -> list[str]:
    return sorted(sys.modules)
"""

#: Loaded by none of the worker's own paths on a plain URL (a prefix covers its submodules).
NOT_LOADED = (
    "blitzq.broker.redis.sentinel",  # redis+sentinel:// only
    "blitzq.broker.redis.sentinel_discovery",
    "blitzq.broker.redis.spread",  # the spread layout (a cluster, ?layout=spread) only
    "blitzq.broker.redis.homes",
    "blitzq.broker.redis.handoff",
    "blitzq.broker.redis.cluster_scripts",  # a cluster client only
    "blitzq.broker.redis.cluster_replicas",
    "blitzq.broker.amqp",
    "blitzq.workflow.engine",  # the first workflow step to end, or to start
    "blitzq.workflow.canvas",
    "blitzq.workflow.handle",
    "blitzq.workflow.callback",
    "blitzq.periodic",  # the first periodic entry
    "blitzq.schedules",
    "croniter",  # the first Cron
    "dateutil",
    "zoneinfo",  # a Cron, a zoned datetime in a message
    "blitzq.worker.cpu_pool",  # the first CPU pool
    "multiprocessing",  # the first process pool
    "blitzq.dashboard",
    "rich",
    "blitzq.cli.inspect",
    "blitzq.cli.schedule",
)


def test_a_worker_on_a_plain_url_loads_no_optional_part(
    tmp_path: Path, redis_url: str, namespace: str, make_queue: Callable[..., Queue]
) -> None:
    (tmp_path / "idle_app.py").write_text(APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BLITZQ_")}
    # this checkout's blitzq, from the app's directory
    env["PYTHONPATH"] = os.pathsep.join([str(Path(blitzq.__file__).parents[1]), str(tmp_path)])
    proc = subprocess.Popen(
        [
            *_blitzq_command(),
            "worker",
            "idle_app:queue",
            "--redis-url",
            redis_url,
            "--namespace",
            namespace,
            "--no-supervise",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    producer = make_queue()
    try:
        line = _read_line(proc, timeout=30)
        assert line.startswith("blitzq worker "), line
        assert "mode=reliable" in line
        loaded = producer.send_sync("idle_app.modules").result_sync(timeout=30)
        assert "blitzq.worker.runner" in loaded  # the list is the worker's own
        unexpected = sorted(
            name
            for name in loaded
            if any(name == part or name.startswith(part + ".") for part in NOT_LOADED)
        )
        assert unexpected == []
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()
        producer.close_sync()
