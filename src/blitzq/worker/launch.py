"""``blitzq worker … --workers N`` (or ``--autoscale``, ``--reload``): announce and run the
:class:`~blitzq.worker.supervisor.Supervisor` with what the command line asked for."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .autoscale import AutoscaleSettings
from .sampler import Sampler
from .supervisor import Supervisor

__all__ = ["supervise"]


def supervise(
    command: Sequence[str],
    workers: int,
    shutdown_timeout: float,
    json_output: bool = False,
    *,
    autoscale: AutoscaleSettings | None = None,
    redis_url: str | None = None,
    namespace: str | None = None,
    mode: str | None = None,
    queues: Sequence[str] | None = None,
    watch: Path | Sequence[Path] | None = None,
    max_restarts: int = 5,
    restart_window: float = 3600.0,
    heartbeat_timeout: float | None = 30.0,
) -> int:
    """Announce and run a :class:`Supervisor` of ``workers`` copies of ``command``.

    What ``blitzq worker … --workers N`` runs: one line on stdout (a JSON document with
    ``json_output``), then the supervision until a stop signal.

    Args:
        command: argv of one worker (see :func:`~blitzq.worker.processes.worker_command`).
        workers: number of worker processes (with ``autoscale``: its minimum).
        shutdown_timeout: seconds the workers get to stop gracefully.
        json_output: announce as ``{"event": "supervisor_started", …}``.
        autoscale: scale between its bounds, sampling the broker at ``redis_url``,
            ``namespace`` and ``mode`` (``None``: the environment's) on ``queues`` (``None``:
            those the workers consume).
        watch: reload the workers when a ``.py`` file under this directory (or these)
            changes.
        max_restarts, restart_window: crash restarts of one slot allowed within the rolling
            window (seconds) before the supervisor gives up on it; only deaths of workers
            that made no progress count (see :class:`~blitzq.worker.restarts.RestartBudget`).
        heartbeat_timeout: seconds without a heartbeat after which a worker is replaced
            (``None``: not watched).

    Returns:
        The exit code (see :meth:`Supervisor.run`).
    """
    if json_output:
        doc = {"event": "supervisor_started", "workers": workers, "pid": os.getpid()}
        if autoscale is not None:
            doc["autoscale"] = [autoscale.minimum, autoscale.maximum]
            doc["max_processes"] = autoscale.headroom
            doc["group"] = autoscale.group
        print(json.dumps(doc))
    else:
        scaling = ""
        if autoscale is not None:
            scaling = f" autoscale={autoscale.minimum},{autoscale.maximum}"
            scaling += f" max_processes={autoscale.headroom}"
            scaling += f" group={autoscale.group}" if autoscale.group is not None else ""
        print(f"blitzq supervisor pid={os.getpid()} workers={workers}{scaling}")
    sys.stdout.flush()
    sampler = None
    if autoscale is not None:
        sampler = functools.partial(
            Sampler,
            redis_url=redis_url,
            namespace=namespace,
            mode=mode,
            queues=queues,
            interval=autoscale.interval,
            group=autoscale.group,
            headroom=autoscale.headroom,
        )
    return Supervisor(
        command,
        workers,
        shutdown_timeout,
        max_restarts=max_restarts,
        restart_window=restart_window,
        heartbeat_timeout=heartbeat_timeout,
        autoscale=autoscale,
        sampler=sampler,
        watch=watch,
    ).run()
