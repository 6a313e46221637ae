"""The autoscaling supervisor's sampler: a thread that reads the broker once per interval.

The supervisor's loop is synchronous; the sampler runs its own event loop in a daemon thread
with a :class:`~blitzq.Queue` made from the URL, namespace and mode the supervisor read from
the application's Queue (``blitzq worker`` loads it for that alone, command-line options
winning: see :func:`blitzq.cli.process_control.autoscale_target`), and each interval

1. reads the setpoint of ``blitzq control scale`` of its ``group`` (raw fields,
   :meth:`~blitzq.broker.Broker.setpoint`) and accepts or rejects it
   (:func:`~blitzq.worker.autoscale.check_setpoint`; a rejection is logged once per setpoint);
2. reads the registrations of the supervisor's own worker processes (matched by host and
   pid): whether each runs a task, which queues they consume (unless ``-Q`` named them) and
   their mode (a Queue whose mode the application sets in code is followed);
3. reads the waiting messages and the enqueue time of the oldest waiting one on every level
   of those queues;
4. publishes the supervisor's status (``blitzq control status``) with a time to live of
   three intervals plus 5 s: its group, headroom, processes, the bounds in force and their
   origin (``setpoint`` or ``arguments``), and the setpoint read with its verdict
   (``accepted``, ``rejected`` with the reason, or ``none``), so a controlling service tells
   a rejected setpoint from one not yet read (the status' ``setpoint.at`` is older) from an
   unreachable supervisor (no status: it expired);
5. hands the :class:`~blitzq.worker.autoscale.Sample` to the supervisor and wakes its loop.

A broker that cannot be reached is logged (once per outage) and sampled again at the next
interval; the supervisor then keeps its processes as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..exceptions import BlitzQError, SerializationError
from ..queue import Queue
from ..routing import levels
from ..serialization import loads
from .autoscale import HARD_CAP, Sample, check_setpoint

logger = logging.getLogger("blitzq.supervisor")


class Sampler:
    """Sample the broker for the autoscaler in a thread; see the module docstring.

    Args:
        redis_url: the broker URL (``None``: the ``BLITZQ_REDIS_URL`` a Queue reads).
        namespace: the namespace (``None``: ``BLITZQ_NAMESPACE`` or ``blitzq``).
        mode: ``"reliable"`` or ``"fast"`` (``None``: ``BLITZQ_MODE`` or reliable); replaced
            by the mode the workers register.
        queues: the queues to watch (``None``: those the supervised workers consume).
        interval: seconds between two samples.
        processes: returns the supervised worker pids and their start times (monotonic s).
        status: returns the supervisor's own fields for its published status.
        wake: called (from the sampler's thread) after each sample.
        group: the ``--group`` whose setpoint is read (``None``: the namespace's).
        headroom: the most processes a setpoint may ask for (``--max-processes``).
    """

    def __init__(
        self,
        *,
        redis_url: str | None,
        namespace: str | None,
        mode: str | None,
        queues: Sequence[str] | None,
        interval: float,
        processes: Callable[[], Mapping[int, float]],
        status: Callable[[], Mapping[str, Any]],
        wake: Callable[[], None],
        group: str | None = None,
        headroom: int = HARD_CAP,
    ) -> None:
        self.redis_url = redis_url
        self.namespace = namespace
        self.mode = mode
        self.queues = list(queues) if queues else None
        self.interval = interval
        self._processes = processes
        self._status = status
        self._wake = wake
        self.group = group
        self.headroom = headroom
        #: the setpoint whose rejection was logged last (logged once per setpoint).
        self._rejected: dict[str, str] | None = None
        self.host = socket.gethostname()
        self.id = f"{self.host}:{os.getpid()}"
        #: The latest sample (``None`` until the first one succeeded).
        self.latest: Sample | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()

    def start(self) -> None:
        """Start the sampling thread."""
        self._thread = threading.Thread(target=self._main, name="blitzq-sampler", daemon=True)
        self._thread.start()
        self._started.wait(5.0)

    def stop(self) -> None:
        """Stop sampling, remove the published status (bounded: 5 s) and join the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(10.0)

    # ---------------------------------------------------------------- thread
    def _main(self) -> None:
        asyncio.run(self._run())

    def _queue(self) -> Queue:
        mode: Any = self.mode if self.mode in ("reliable", "fast") else None
        return Queue(redis_url=self.redis_url, namespace=self.namespace, mode=mode)

    async def _run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._started.set()
        queue = self._queue()
        failing = False
        try:
            while not self._stop.is_set():
                try:
                    sample, mode = await self._sample(queue)
                except BlitzQError as exc:
                    if not failing:
                        logger.warning("autoscale: could not sample the broker: %s", exc)
                    failing = True
                except Exception:  # a bug must not end the sampling for good
                    logger.exception("autoscale: sampling failed")
                    failing = True
                else:
                    if failing:
                        logger.info("autoscale: sampling the broker again")
                    failing = False
                    self.latest = sample
                    self._wake()
                    if mode is not None and mode != queue.mode:
                        await queue.close()
                        self.mode = mode
                        queue = self._queue()
                        continue
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.interval)
            with contextlib.suppress(BlitzQError, TimeoutError):
                await asyncio.wait_for(
                    queue.broker.state.operations.unpublish_supervisor(self.id), 5.0
                )
        finally:
            with contextlib.suppress(BlitzQError):
                await queue.close()

    async def _sample(self, queue: Queue) -> tuple[Sample, str | None]:
        broker = queue.broker
        fields = await broker.state.operations.setpoint(self.group)
        setpoint, reason = check_setpoint(fields, self.headroom)
        if reason is not None and fields != self._rejected:
            logger.warning("control: setpoint %s rejected: %s", fields, reason)
        self._rejected = fields if reason is not None else None
        pids = self._processes()
        busy: dict[int, bool] = {}
        names: set[str] = set(self.queues or ())
        mode: str | None = None
        for raw in (await broker.workers()).values():
            try:
                info = loads(raw)
            except SerializationError:
                continue
            if not isinstance(info, dict) or info.get("host") != self.host:
                continue
            pid = info.get("pid")
            if not isinstance(pid, int) or pid not in pids:
                continue
            busy[pid] = bool(info.get("running"))
            mode = info.get("mode") if isinstance(info.get("mode"), str) else mode
            if self.queues is None:
                names.update(q for q in info.get("queues") or () if isinstance(q, str))
        physical = [p for name in sorted(names) for p in levels(name)]
        waiting, oldest_age = 0, None
        if physical:
            stats = await broker.queue_stats(physical)
            waiting = sum(s.get("waiting", 0) for s in stats.values())
            oldest = await broker.oldest_waiting(physical) if waiting else {}
            if oldest:
                oldest_age = max(0.0, await broker.server_time() - min(oldest.values()))
        sample = Sample(waiting, oldest_age, busy, setpoint)
        own = self._status()
        status = {
            "id": self.id,
            "host": self.host,
            "pid": os.getpid(),
            **own,
            "group": self.group,
            "max_processes": self.headroom,
            **_verdict(fields, setpoint, reason, own.get("arguments")),
            "queues": sorted(names),
            "waiting": waiting,
            "oldest_age": oldest_age,
            "at": time.time(),
        }
        ttl = 3 * self.interval + 5.0
        await broker.state.operations.publish_supervisor(self.id, json.dumps(status).encode(), ttl)
        return sample, mode


def _verdict(
    raw: Mapping[str, str] | None,
    accepted: tuple[int, int] | None,
    reason: str | None,
    arguments: Sequence[int] | None,
) -> dict[str, Any]:
    """The status fields about the setpoint read: ``setpoint`` (its raw fields, ``at`` as a
    number when it is one), ``setpoint_state`` (``none`` / ``accepted`` / ``rejected``),
    ``rejected`` (the reason or ``None``) and, for an accepted one, the bounds it puts in
    force (``min``, ``max``, ``origin``); else the command line's ``arguments``."""
    point: dict[str, Any] | None = None
    if raw is not None:
        point = dict(raw)
        with contextlib.suppress(KeyError, ValueError):
            point["at"] = float(raw["at"])
    out: dict[str, Any] = {
        "setpoint": point,
        "setpoint_state": "none" if raw is None else "rejected" if reason else "accepted",
        "rejected": reason,
        "origin": "arguments",
    }
    if accepted is not None:
        out.update(min=accepted[0], max=accepted[1], origin="setpoint")
    elif arguments is not None:
        out.update(min=arguments[0], max=arguments[1])
    return out
