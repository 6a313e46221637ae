"""The read-only preflight of ``blitzq check MODULE:ATTR``: can this application run here?

:func:`preflight` asks the broker (never writes: no key is created or changed) and returns one
:class:`Finding` per check, each ``ok``, ``warn`` (worth a look, not blocking) or ``fail``
(blocking: the application would lose work or not run):

* ``connectivity``: the server answers (when it does not, nothing else is checked).
* ``rabbitmq``: with ``amqp_url``, RabbitMQ accepts a connection (``fail`` with RabbitMQ's
  reason, e.g. a refused login, exit 1 like ``connectivity``; the queue counts, which need
  it, are then skipped).
* ``server``: name and version; ``fail`` below Redis :data:`MIN_REDIS` (the commands blitzq
  sends need it) and on a read-only replica.
* ``eviction``: ``fail`` when ``maxmemory-policy`` with a ``maxmemory`` set can evict
  blitzq's keys (:mod:`blitzq.broker.eviction`).
* ``memory``: ``fail`` when the server's memory use has reached its ``maxmemory``: under
  ``noeviction`` it refuses every write (``OOM``), so nothing can be enqueued or completed
  (exit 78, as a blocking finding; the server still answers, so ``connectivity`` is ``ok``).
  A check that the full server refuses is reported here too, never as ``connectivity``.
* ``persistence``: ``warn`` when neither AOF nor RDB snapshots are on (a restart of the
  server loses every queue) or the last snapshot failed.
* ``workers``: how many live workers are registered.
* ``queue <name>``: ``warn`` for a queue the namespace has used (or the application's) that
  no live worker consumes, with its waiting messages.
* ``periodic <name>``: each periodic entry (code-defined and run-time), ``warn`` when a run-time
  entry was never dispatched though an occurrence was due since it was added (an entry whose
  first run is still ahead is ``ok``: a scheduler counts it from when it first sees it), or
  when an occurrence due more than :data:`SCHEDULER_GRACE` seconds after its last run was
  not dispatched (no scheduler is dispatching it), or when a run-time entry names a task the
  application does not register.

The exit codes of the command follow SwarmQ's: 0 nothing blocking, 78 (``EX_CONFIG``) a
blocking finding, 1 the server unreachable.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .broker.eviction import eviction_risk
from .exceptions import (
    BlitzQError,
    BrokerError,
    BrokerRefusedSettings,
    ConfigurationError,
    SerializationError,
)
from .periodic import PeriodicTask
from .redaction import mask_url
from .routing import base_queue
from .routing import levels as routing_levels
from .runtime_schedules import RuntimeEntries, RuntimeSchedule
from .serialization import loads

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["EXIT_BLOCKING", "MIN_REDIS", "SCHEDULER_GRACE", "Finding", "exit_code", "preflight"]

#: Oldest Redis version blitzq runs on (XAUTOCLAIM, GETDEL, ZRANGE ... REV: Redis 6.2).
MIN_REDIS = (6, 2)
#: Seconds an occurrence may be overdue before ``check`` says no scheduler dispatches it.
SCHEDULER_GRACE = 60.0
#: Exit code of a blocking finding (``EX_CONFIG`` of sysexits.h, as SwarmQ uses).
EXIT_BLOCKING = 78

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's answer.

    Attributes:
        name: what was checked (``"eviction"``, ``"queue emails"``, ``"periodic nightly"``).
        status: ``"ok"``, ``"warn"`` (not blocking) or ``"fail"`` (blocking).
        detail: what was found, in a sentence.
        refused: the server answered but refused the URL's settings (credentials, database
            number, RabbitMQ virtual host): a blocking configuration problem (exit 78), not
            an unreachable server (exit 1).
    """

    name: str
    status: Status
    detail: str
    refused: bool = False

    def to_dict(self) -> dict[str, str]:
        """Plain-dict form (for ``--json`` output)."""
        return {"name": self.name, "status": self.status, "detail": self.detail}


def exit_code(findings: Sequence[Finding]) -> int:
    """1 when the server was unreachable, :data:`EXIT_BLOCKING` (78) when any finding
    fails (a server that refused the URL's settings among them), else 0."""
    if any(
        f.name in ("connectivity", "rabbitmq") and f.status == "fail" and not f.refused
        for f in findings
    ):
        return 1
    return EXIT_BLOCKING if any(f.status == "fail" for f in findings) else 0


async def preflight(queue: Queue) -> list[Finding]:
    """Run every check against ``queue``'s broker (read-only) and return the findings.

    Never raises for a server that cannot be reached: that is the ``connectivity`` finding
    (``fail``), and the only one; a server that answers but refuses the URL's settings
    (:class:`~blitzq.exceptions.BrokerRefusedSettings`) is that finding too, marked
    ``refused`` (exit 78, not 1), and so is RabbitMQ's on the ``rabbitmq`` line.
    """
    broker = queue.broker
    amqp = _amqp_url(queue)
    try:
        await (broker.state.ping() if amqp else broker.ping())  # RabbitMQ: its own line
        info = await broker.state.operations.server_info()
    except BrokerRefusedSettings as exc:
        return [Finding("connectivity", "fail", f"the server answers but refuses: {exc}", True)]
    except BrokerError as exc:
        return [Finding("connectivity", "fail", f"the server does not answer: {exc}")]
    findings = [Finding("connectivity", "ok", "the server answers")]
    rabbitmq = await _rabbitmq(queue, amqp) if amqp else None
    findings += [rabbitmq] if rabbitmq is not None else []
    findings += _server(info)
    try:
        findings.append(await _eviction(queue))
        full = await _memory(queue)
        findings += [full] if full is not None else []
        findings.append(_persistence(info))
        if rabbitmq is None or rabbitmq.status == "ok":
            findings += await _queues(queue)
        findings += await _periodic(queue)
    except BrokerError as exc:
        if not exc.out_of_memory:
            findings.append(Finding("connectivity", "fail", f"the server stopped answering: {exc}"))
        elif not any(f.name == "memory" and f.status == "fail" for f in findings):
            findings.append(Finding("memory", "fail", f"the server is out of memory: {exc}"))
    return findings


async def _memory(queue: Queue) -> Finding | None:
    found = await queue.broker.memory_use()
    if found is None:
        return None
    used, limit = found
    if not limit:
        return Finding("memory", "ok", f"{used} bytes used, no maxmemory")
    share = f"{used} of maxmemory {limit} bytes used ({100 * used / limit:.0f}%)"
    if used >= limit:
        return Finding(
            "memory",
            "fail",
            f"memory full: {share}; the server refuses writes (OOM): nothing can be "
            "enqueued or completed. Free memory (purge queues or dead letters, lower "
            "result_ttl) or raise maxmemory",
        )
    return Finding("memory", "ok", share)


def _amqp_url(queue: Queue) -> str | None:
    """The RabbitMQ URL of ``queue``'s broker (``None``: messages travel through Redis)."""
    url = getattr(getattr(queue.broker.transport, "link", None), "url", None)
    return url if isinstance(url, str) else None


async def _rabbitmq(queue: Queue, url: str) -> Finding:
    """Whether RabbitMQ at ``url`` accepts a connection and a channel."""
    try:
        await queue.broker.transport.ping()
    except BrokerRefusedSettings as exc:
        return Finding("rabbitmq", "fail", f"RabbitMQ answers but refuses: {exc}", True)
    except BrokerError as exc:
        return Finding(
            "rabbitmq", "fail", f"RabbitMQ does not answer: {exc}" if exc.transient else str(exc)
        )
    return Finding("rabbitmq", "ok", f"{mask_url(url)} answers")


def _server(info: dict[str, str]) -> list[Finding]:
    name, version = info.get("server", "redis"), info.get("version", "")
    parts = tuple(int(p) for p in version.split(".")[:2] if p.isdigit())
    out = []
    if name == "redis" and len(parts) == 2 and parts < MIN_REDIS:
        need = ".".join(map(str, MIN_REDIS))
        out.append(Finding("server", "fail", f"Redis {version}: blitzq needs Redis >= {need}"))
    else:
        out.append(Finding("server", "ok", f"{name} {version or '(version not told)'}"))
    role = info.get("role")
    if role in ("slave", "replica"):
        out.append(Finding("role", "fail", "a read-only replica: point blitzq at the primary"))
    elif role:
        out.append(Finding("role", "ok", f"{role}: it accepts writes"))
    else:
        out.append(Finding("role", "warn", "the server does not tell its role"))
    return out


async def _eviction(queue: Queue) -> Finding:
    found = await queue.broker.memory_policy()
    if found is None:
        return Finding("eviction", "warn", "the server does not tell its maxmemory-policy")
    policy, maxmemory = found
    risk = eviction_risk(policy, maxmemory)
    if risk is not None:
        return Finding(
            "eviction",
            "fail",
            f"maxmemory-policy {policy} with maxmemory {maxmemory} bytes can evict {risk}; "
            "set it to noeviction",
        )
    limit = f"maxmemory {maxmemory} bytes" if maxmemory else "no maxmemory"
    return Finding("eviction", "ok", f"maxmemory-policy {policy}, {limit}: nothing is evicted")


def _persistence(info: dict[str, str]) -> Finding:
    aof = info.get("aof_enabled") == "1"
    save = info.get("save")
    rdb = bool(save and save.strip())
    if info.get("rdb_last_bgsave_status", "ok") != "ok":
        return Finding("persistence", "warn", "the last RDB snapshot failed (see the server log)")
    if aof or rdb:
        kinds = [k for k, on in (("AOF", aof), (f"RDB (save {save})", rdb)) if on]
        return Finding("persistence", "ok", " and ".join(kinds))
    if save is None and not aof:
        return Finding("persistence", "warn", "AOF is off and the RDB rules are not readable")
    return Finding(
        "persistence", "warn", "neither AOF nor RDB snapshots: a server restart loses all work"
    )


async def _queues(queue: Queue) -> list[Finding]:
    broker = queue.broker
    workers = await broker.workers()
    consumed: set[str] = set()
    for raw in workers.values():
        try:
            doc: Any = loads(raw)
        except BlitzQError:
            continue
        if isinstance(doc, dict):
            consumed.update(str(q) for q in doc.get("queues") or [])
    names = {base_queue(q) for q in await broker.known_queues()} | {queue.name}
    names |= {t.queue for t in queue.tasks.values()}
    out = [Finding("workers", "ok" if workers else "warn", f"{len(workers)} live worker(s)")]
    levels = sorted({level for name in names for level in routing_levels(name)})
    for key, wrong in sorted((await broker.wrong_type_keys(levels)).items()):
        out.append(
            Finding(
                f"key {key}",
                "fail",
                f"{wrong}: every command on it fails (WRONGTYPE); delete "
                f"or rename it (redis-cli DEL {key}) if nothing else uses it",
            )
        )
    idle = sorted(names - consumed)
    stats = await broker.queue_stats(idle) if idle else {}
    for name in idle:
        waiting = stats.get(name, {}).get("waiting", 0)
        out.append(
            Finding(f"queue {name}", "warn", f"no live worker consumes it ({waiting} waiting)")
        )
    return out


async def _periodic(queue: Queue) -> list[Finding]:
    broker = queue.broker
    runtime = RuntimeEntries(queue)
    entries: list[PeriodicTask] = [
        *queue.periodic_tasks.values(),
        *(await runtime.refresh()).values(),
    ]
    out = []
    stored = await broker.state.operations.runtime_periodic()
    for name in sorted(stored.keys() - runtime.entries.keys() - queue.periodic_tasks.keys()):
        out.append(
            Finding(f"periodic {name}", "warn", "run-time entry this application cannot run")
        )
    if not entries:
        return out
    last = await broker.periodic_last([e.name for e in entries])
    now = await broker.server_time()
    added: dict[str, float] = {}
    for name in runtime.entries:
        with contextlib.suppress(SerializationError):
            added[name] = RuntimeSchedule.decode(name, stored[name]).added_at or 0.0
    for entry in sorted(entries, key=lambda e: e.name):
        out.append(_entry(entry, last.get(entry.name), now, added.get(entry.name)))
    return out


def _entry(
    entry: PeriodicTask, last: float | None, now: float, added_at: float | None = None
) -> Finding:
    """The finding of one entry. Never dispatched is a problem only when an occurrence was
    due since the entry is known to exist (``added_at``, a run-time entry's): a scheduler
    counts a new entry from when it first sees it, so an entry whose first run is still
    ahead has simply not had one yet."""
    name = f"periodic {entry.name}"
    schedule = entry.schedule
    try:
        upcoming = _iso(schedule.next_after(now))
        if last is None:
            since = added_at or now  # a code-defined entry: when it appeared is unknown
            missed = schedule.latest(since, now - SCHEDULER_GRACE, 1)
            if missed:
                return Finding(
                    name,
                    "warn",
                    f"never dispatched in this namespace though {_iso(missed[0])} "
                    "was due: is a scheduler running?",
                )
            return Finding(
                name,
                "ok",
                f"{schedule.describe()}: not dispatched yet, first run {upcoming} "
                "(a scheduler must be running then)",
            )
        missed = schedule.latest(last, now - SCHEDULER_GRACE, 1)
    except ConfigurationError as exc:  # a cron with no time left
        return Finding(name, "warn", str(exc))
    if missed:
        return Finding(
            name,
            "warn",
            f"last run {_iso(last)} but {_iso(missed[0])} was due: no scheduler is dispatching it",
        )
    return Finding(name, "ok", f"{schedule.describe()}: last run {_iso(last)}, next {upcoming}")


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).isoformat(timespec="seconds")
