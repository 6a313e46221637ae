"""Every Redis key name blitzq uses, made in one place: :data:`TABLE`.

All keys of a namespace start with ``{ns}:``, whose braces are a Redis Cluster hash tag, so
every Lua script touches one cluster slot (the spread layout's queue keys, under a tag per
queue, are made by ``spread.SpreadKeys``, and a homed task's own keys, under its queue's tag,
by ``homes.HomedKeys``). :class:`Keys` builds the names on the Python side;
the Lua scripts write ``KEY.record(prefix, id)``, which ``scripts.py`` expands from the same
table to what ``Keys(ns).record(id)`` makes, so a suffix is written once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

#: The consumer group every reliable-mode stream uses.
GROUP = "blitzq"
#: The single stream field holding the message; ``d`` counts redeliveries after recovery.
MESSAGE_FIELD = b"m"


@dataclass(frozen=True, slots=True)
class Key:
    """One key (or pub/sub channel) of a namespace: ``{ns}:`` followed by :attr:`pattern`.

    Attributes:
        pattern: the name after ``{ns}:``; a ``<part>`` is filled in by the caller, e.g.
            ``"t:<task_id>"`` or ``"wf:<workflow_id>:j:<join_id>"``; none for a fixed key.
        type: the Redis type (``stream``, ``list``, ``string``, ``hash``, ``zset``, ``set``)
            or ``channel`` for a pub/sub channel.
        holds: what it holds, with its units.
    """

    pattern: str
    type: str
    holds: str

    @property
    def parts(self) -> list[str]:
        """Names of the ``<part>`` placeholders, in order (empty for a fixed key)."""
        return re.findall(r"<(\w+)>", self.pattern)

    @property
    def literals(self) -> list[str]:
        """The literal text around the placeholders: one more item than :attr:`parts`."""
        return re.split(r"<\w+>", self.pattern)


# fmt: off
#: Every key of a namespace by name (the :class:`Keys` member and the Lua ``KEY.<name>`` call).
TABLE: Final[dict[str, Key]] = {
    "stream": Key("s:<queue>", "stream",
        "reliable-mode messages of a physical queue, group `blitzq`: `m` message, `d` deliveries"),
    "list": Key("l:<queue>", "list",
        "fast-mode messages of one physical queue"),
    "handed": Key("handed:<queue>:<consumer>", "set",
        "entry ids of a queue's stream handed to worker <consumer>, which knows their task"),
    "outbox": Key("outbox:<queue>", "list",
        "messages the state store wrote for a queue of a foreign transport, awaiting a relay"),
    "idle": Key("idle:<queue>", "string",
        "Redis Cluster: an idle worker watches this base queue (its enqueues announce "
        "themselves) for 240 s; in the queue's slot on the spread layout"),
    "outboxes": Key("outboxes", "set",
        "queues whose outbox may hold messages (a queue leaves once its outbox is empty)"),
    "relay": Key("relay:<relay_id>", "list",
        "a relay's taken batch: the queue, then its messages, until published and released"),
    "relays": Key("relays", "zset",
        "relay ids scored by lease expiry (Unix seconds, server clock) while they hold a batch"),
    "handoffs": Key("handoff:lapsed", "list",
        "spread layout: lapsed relays' batches (MessagePack: queue, header, messages)"),
    "handoff_seq": Key("handoff:seq", "string",
        "spread layout: the last batch id a relay was given (INCR)"),
    "record": Key("t:<task_id>", "string",
        "a task's record (MessagePack map); expires after result_ttl"),
    "solo": Key("solo:<task_id>", "string",
        "runs of a redelivered task started alone in its worker process (INCR before each); "
        "the worker dead-letters the task past its budget; expires after result_ttl"),
    "taken": Key("tk:<task_id>:<digest>", "hash",
        "RabbitMQ: the latest take of a redelivered message copy (<digest>: of its body): `o` "
        "the taking delivery's token, `n` the takes counted; a completion of another "
        "delivery of the copy is stale (complete.lua); expires after 1 day"),
    "takes": Key("tks", "zset",
        "RabbitMQ: task ids with a `tk:<task_id>:<digest>` scored by its expiry (Unix "
        "seconds); complete.lua looks up the takes of these ids only; pruned at each take"),
    "owner": Key("tn:<task_id>", "string",
        "an explicit id's owner: the mark (`Envelope.nonce`) of its newest enqueue; a record "
        "of a run of another enqueue of the id is not stored; expires with the record"),
    "done_channel": Key("done:<task_id>", "channel",
        "published when the record is written: the record itself (small) or `1`"),
    "waiter": Key("w:<task_id>", "string",
        "spread layout: a process waits on the homed task's record (`1`, PX the wait): its "
        "completion publishes `done:<task_id>` only then"),
    "applied_guard": Key("cg:<guard>", "hash",
        "unfenced completions (fast mode) of one first-try batch applied: `a` all of them, "
        "else a field per index; a retry of one applies nothing (complete.lua); deleted by "
        "the worker's next batch, else expires after 1 day"),
    "dead_letter": Key("d:<task_id>", "hash",
        "a dead letter: message, reason, error, task, queue, failed_at, kind; dead_letter_ttl"),
    "unique": Key("u:<key>", "string",
        "unique-task key `<task>:<key>`: id of the task holding it; TTL in ms"),
    "unique_owner": Key("ub:<task_id>", "string",
        "the unique key a task holds (so a cancel can free it); same TTL"),
    "lock": Key("lk:<key>", "zset",
        "holders of a task lock scored by lease expiry (Unix seconds, server clock)"),
    "workflow": Key("wf:<workflow_id>", "hash",
        "a workflow: state, steps, created_at, result, error_type, error, step, finished_at"),
    "workflow_join": Key("wf:<workflow_id>:j:<join_id>", "hash",
        "a chord's member results by index, plus `f` (fired at, Unix seconds)"),
    "workflow_channel": Key("done:wf:<workflow_id>", "channel",
        "published (`1`) when a workflow reaches a final state"),
    "progress": Key("p:<task_id>", "hash",
        "a task's latest progress: `at` (Unix seconds) and `v` (encoded update)"),
    "progress_channel": Key("progress:<task_id>", "channel",
        "each progress update written for a task"),
    "rate_limit": Key("rl:<key>", "hash",
        "a token bucket (task name, rate_key or `queue:<q>`): `t` tokens, `ts` server time (s)"),
    "ended": Key("ended:<queue>", "zset",
        "the index of tasks that ended from a physical queue: a member `<n>:<token>` per write "
        "of n notes (at most 1,000), scored by the write's time (Unix microseconds, worker "
        "clock; recent.lua, complete.lua), and `#` scored minus the notes held; its oldest "
        "members go while the others hold recent_index notes; expires result_ttl after its "
        "last write"),
    "ended_notes": Key("endnotes:<queue>", "hash",
        "the notes of each member of `ended:<queue>`: `<state>\\n<task>\\n<task_id>` of each, "
        "oldest first, joined by `\\n`; a field goes with its member; expires with it"),
    "recent": Key("recent:<queue>", "zset",
        "the earlier layout of the index (a member per task, `<state>\\n<task>\\n<task_id>` "
        "scored by end time): no longer written, still listed until it expires (result_ttl)"),
    "series": Key("series:<slot>", "hash",
        "the workers' samples of one 10 s slot (Unix seconds // 10): `done`, `failed`, "
        "`w<i>` / `r<i>` wait / run latency histogram counts, `q:<queue>` depth; expires in 1 h"),
    "dead_letters": Key("dlq", "zset",
        "dead-lettered task ids scored by failure time (Unix seconds)"),
    "dead_letter_sizes": Key("dlq:size", "hash",
        "dead-lettered task id to its size in bytes (lua/dead_letters.lua)"),
    "dead_letter_bytes": Key("dlq:bytes", "string",
        "sum of dead_letter_sizes in bytes, held under dead_letter_max_bytes"),
    "schedule": Key("sched", "zset",
        "scheduled task ids scored by due time (Unix seconds, server clock)"),
    "schedule_data": Key("sched:m", "hash",
        "scheduled task id to `<kind><queue>\\n<message>`, kind `s` stream, `l` list, `o` outbox"),
    "periodic": Key("periodic", "hash",
        "periodic task name to its last dispatched occurrence (Unix seconds)"),
    "periodic_runtime": Key("periodic:rt", "hash",
        "run-time periodic entry name (`blitzq schedule add`) to its definition (MessagePack)"),
    "periodic_paused": Key("periodic:paused", "set",
        "periodic entry names paused (the dashboard): their occurrences are claimed, not run"),
    "revoked": Key("revoked", "zset",
        "cancelled task ids scored by when the mark expires (Unix seconds)"),
    "events": Key("events", "channel",
        "`r:<id>` a task was cancelled, `s:<due>` a message was scheduled, `h:<worker>` one "
        "was handed to a worker, `p:<queue>` / `u:<queue>` a queue was paused / resumed, "
        "`x:<worker>` a worker is asked to shut down, `c:<n>:<worker>` to run n tasks at once, "
        "`q:<queue>` a watched queue got a message (Redis Cluster)"),
    "paused": Key("paused", "set",
        "queues paused by `blitzq queue pause`: no worker fetches from them until resumed"),
    "stats": Key("stats", "hash",
        "namespace-wide counters: `stale_completions` (completions fenced off), "
        "`dead_letters_skipped` (dead letters not written: the task's record was final), "
        "`counters_reset` (corrupted counters recomputed by the scripts), `processed` / "
        "`failed` (runs that succeeded / failed, all workers: added with their completions "
        "by complete.lua, a stale one not counted; runs without a completion write, such as "
        "fast mode without results, by the workers' registrations)"),
    "queues": Key("queues", "set",
        "queue names producers and workers have used (a live worker's, again at each of "
        "its registrations)"),
    "workers": Key("workers", "hash",
        "worker id to registration info (MessagePack); liveness in workers:exp"),
    "worker_sizes": Key("workers:size", "hash",
        "worker id to the concurrency it was asked to run (dashboard resize): taken by the "
        "worker at its next maintenance round if it missed the push; dropped by a worker "
        "starting under that id"),
    "worker_beats": Key("workers:exp", "zset",
        "worker ids scored by registration expiry (Unix seconds)"),
    "worker_timeouts": Key("workers:vt", "zset",
        "worker key scored by its visibility timeout (seconds): a live worker's leases are "
        "recovered only once idle that long, whatever the recoverer's own timeout"),
    "worker_counts": Key("workers:counts", "hash",
        "worker key to `<processed> <failed>`: its counts that reached `stats` so far "
        "through its registrations (its runs no completion write counted)"),
    "scale": Key("scale", "hash",
        "autoscale setpoint of the namespace's supervisors: `min`, `max` processes, `at` (s)"),
    "scale_group": Key("scale:g:<group>", "hash",
        "autoscale setpoint of the supervisors of `--group <group>`: `min`, `max`, `at` (s)"),
    "supervisors": Key("supervisors", "hash",
        "supervisor id to its status (JSON: group, processes, bounds, setpoint verdict); "
        "see supervisors:exp"),
    "supervisor_beats": Key("supervisors:exp", "zset",
        "supervisor ids scored by status expiry (Unix seconds)"),
    "custody": Key("ac:<queue>", "hash",
        "RabbitMQ deliveries held for long tasks: custody id to `<deliveries>\\n<message>`"),
    "custody_leases": Key("acl:<queue>", "zset",
        "custody ids scored by lease expiry (Unix seconds, server clock)"),
    "custody_queues": Key("acq", "set",
        "RabbitMQ transport: queues that have had deliveries in custody (recovery looks there)"),
}
# fmt: on


#: Each key's literal text around its parts, e.g. ``["wf:", ":j:", ""]`` (built once).
_TEXT: Final[dict[str, list[str]]] = {name: key.literals for name, key in TABLE.items()}
_S, _L, _T = _TEXT["stream"][0], _TEXT["list"][0], _TEXT["record"][0]


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names of one namespace (each method is the :data:`TABLE` entry of its name).

    Args:
        namespace: the application namespace (any non-empty string without ``{`` or ``}``).
    """

    namespace: str

    @property
    def prefix(self) -> str:
        """``{ns}:`` — the start of every key; the scripts' ``prefix`` argument."""
        return "{" + self.namespace + "}:"

    def _one(self, name: str, part: str) -> str:
        """``{ns}:`` + the key ``name`` with its one part filled in."""
        before, after = _TEXT[name]
        return self.prefix + before + part + after

    def _fixed(self, name: str) -> str:
        """The fixed key ``name`` (one without parts)."""
        return self.prefix + _TEXT[name][0]

    def stream(self, queue: str) -> str:
        """Reliable-mode stream of a queue."""
        return self.prefix + _S + queue

    def list(self, queue: str) -> str:
        """Fast-mode list of a queue."""
        return self.prefix + _L + queue

    def handed(self, queue: str, consumer: str) -> str:
        """Entry ids of ``queue``'s stream handed to ``consumer`` (``hand_over.lua``)."""
        before, middle, after = _TEXT["handed"]
        return self.prefix + before + queue + middle + consumer + after

    def outbox(self, queue: str) -> str:
        """Outbox of a queue: what the state store wrote for a foreign transport's queue."""
        return self._one("outbox", queue)

    def idle(self, queue: str) -> str:
        """Watch mark of a base queue on a Redis Cluster: an idle worker waits for its
        arrivals to be announced (``doorbell.py``)."""
        return self._one("idle", queue)

    @property
    def outboxes(self) -> str:
        """Set of the queues whose outbox may hold messages."""
        return self._fixed("outboxes")

    def relay(self, relay_id: str) -> str:
        """A relay's taken batch (the queue, then its messages) until it is released."""
        return self._one("relay", relay_id)

    @property
    def relays(self) -> str:
        """Sorted set of relay ids scored by lease expiry (Unix seconds, server clock)."""
        return self._fixed("relays")

    @property
    def handoffs(self) -> str:
        """Spread layout: lapsed relays' batches awaiting another relay, whole (``spread.py``)."""
        return self._fixed("handoffs")

    @property
    def handoff_seq(self) -> str:
        """Spread layout: counter of the batch ids relays are given (``handoff.py``)."""
        return self._fixed("handoff_seq")

    def record(self, task_id: str) -> str:
        """A task's record."""
        return self.prefix + _T + task_id

    def solo(self, task_id: str) -> str:
        """The count of a redelivered task's runs started alone in a worker process."""
        return self._one("solo", task_id)

    def taken(self, task_id: str, digest: str) -> str:
        """RabbitMQ: the latest take of a redelivered message copy of ``task_id`` (``digest``:
        of its body)."""
        before, middle, after = _TEXT["taken"]
        return self.prefix + before + task_id + middle + digest + after

    @property
    def takes(self) -> str:
        """RabbitMQ: the task ids with a :meth:`taken` key, scored by its expiry."""
        return self._fixed("takes")

    def owner(self, task_id: str) -> str:
        """The mark of the newest enqueue under an explicit id (``Envelope.nonce``)."""
        return self._one("owner", task_id)

    def done_channel(self, task_id: str) -> str:
        """Pub/sub channel announcing that a task's record was written."""
        return self._one("done_channel", task_id)

    def waiter(self, task_id: str) -> str:
        """Spread layout: present while a process waits on a homed task's record."""
        return self._one("waiter", task_id)

    def applied_guard(self, guard: str) -> str:
        """Marks the unfenced completions of a batch (by its guard) applied: a retry applies
        nothing."""
        return self._one("applied_guard", guard)

    def dead_letter(self, task_id: str) -> str:
        """Hash holding one dead letter's fields."""
        return self._one("dead_letter", task_id)

    def unique(self, key: str) -> str:
        """Unique-task key ``<task>:<key>``: the id of the task holding it, with a TTL."""
        return self._one("unique", key)

    def unique_owner(self, task_id: str) -> str:
        """The unique key a task holds (written by ``unique_enqueue.lua``, ``unique_claim.lua``
        and ``replay.lua``)."""
        return self._one("unique_owner", task_id)

    def lock(self, key: str) -> str:
        """Sorted set of a task lock's holders scored by lease expiry (Unix seconds)."""
        return self._one("lock", key)

    def workflow(self, workflow_id: str) -> str:
        """Hash of a workflow's state (state, result, error, steps); see ``blitzq.workflow``."""
        return self._one("workflow", workflow_id)

    def workflow_join(self, workflow_id: str, join_id: str) -> str:
        """Hash of a chord's member results by index, plus its ``f`` (fired) flag."""
        first, middle, last = _TEXT["workflow_join"]
        return self.prefix + first + workflow_id + middle + join_id + last

    def workflow_channel(self, workflow_id: str) -> str:
        """Pub/sub channel announcing that a workflow reached a final state."""
        return self._one("workflow_channel", workflow_id)

    def progress(self, task_id: str) -> str:
        """Hash of a task's latest progress: ``at`` (Unix time) and ``v`` (encoded update)."""
        return self._one("progress", task_id)

    def progress_channel(self, task_id: str) -> str:
        """Pub/sub channel carrying each progress update written for a task."""
        return self._one("progress_channel", task_id)

    def rate_limit(self, key: str) -> str:
        """Token bucket of a rate limit (a task name, a shared ``rate_key``, ``queue:<q>``)."""
        return self._one("rate_limit", key)

    def ended(self, queue: str) -> str:
        """Sorted set of the writes of the tasks that ended from physical ``queue`` (the
        dashboard's list: :mod:`.browse`)."""
        return self._one("ended", queue)

    def ended_notes(self, queue: str) -> str:
        """Hash of the notes of each member of :meth:`ended` (written beside it)."""
        return self._one("ended_notes", queue)

    def recent(self, queue: str) -> str:
        """The index of ended tasks of physical ``queue`` in its earlier layout (a member per
        task): read while it lives, never written (:mod:`.browse`)."""
        return self._one("recent", queue)

    def series(self, slot: int) -> str:
        """Hash of the workers' samples of one time slot (``worker/series.py``)."""
        return self._one("series", str(slot))

    @property
    def dead_letters(self) -> str:
        """Sorted set of dead-lettered task ids scored by failure time."""
        return self._fixed("dead_letters")

    @property
    def dead_letter_sizes(self) -> str:
        """Hash of dead-lettered task id to its size in bytes (``lua/dead_letters.lua``)."""
        return self._fixed("dead_letter_sizes")

    @property
    def dead_letter_bytes(self) -> str:
        """Sum of :attr:`dead_letter_sizes`, held under ``dead_letter_max_bytes``."""
        return self._fixed("dead_letter_bytes")

    @property
    def schedule(self) -> str:
        """Sorted set of scheduled task ids scored by due time."""
        return self._fixed("schedule")

    @property
    def schedule_data(self) -> str:
        """Hash of scheduled task id to ``<kind><queue>\\n<message>``."""
        return self._fixed("schedule_data")

    @property
    def periodic(self) -> str:
        """Hash of periodic task name to its last dispatched occurrence (Unix seconds)."""
        return self._fixed("periodic")

    @property
    def periodic_runtime(self) -> str:
        """Hash of run-time periodic entry name to its definition (``blitzq schedule``)."""
        return self._fixed("periodic_runtime")

    @property
    def periodic_paused(self) -> str:
        """Set of paused periodic entry names (claimed without being dispatched)."""
        return self._fixed("periodic_paused")

    @property
    def revoked(self) -> str:
        """Sorted set of cancelled task ids scored by when the mark expires."""
        return self._fixed("revoked")

    @property
    def events(self) -> str:
        """Pub/sub channel: ``r:<id>`` a task was cancelled, ``s:<eta>`` one was scheduled,
        ``h:<worker>`` handed, ``p:``/``u:<queue>`` paused/resumed, ``x:<worker>`` shut down,
        ``q:<queue>`` a watched queue got a message (a cluster's idle workers: doorbell.py)."""
        return self._fixed("events")

    @property
    def paused(self) -> str:
        """Set of paused queue names (``blitzq queue pause``)."""
        return self._fixed("paused")

    @property
    def stats(self) -> str:
        """Hash of namespace-wide counters (``stale_completions``: completions fenced off;
        ``dead_letters_skipped``: dead letters not written over a final record;
        ``processed`` / ``failed``: runs of every worker, added by their registrations)."""
        return self._fixed("stats")

    @property
    def queues(self) -> str:
        """Set of known queue names."""
        return self._fixed("queues")

    @property
    def workers(self) -> str:
        """Hash of worker id to registration info; liveness in :attr:`worker_beats`."""
        return self._fixed("workers")

    @property
    def worker_sizes(self) -> str:
        """Hash of worker id to the concurrency asked of it (``request_resize``)."""
        return self._fixed("worker_sizes")

    @property
    def worker_beats(self) -> str:
        """Sorted set of worker id scored by registration expiry (Unix seconds)."""
        return self._fixed("worker_beats")

    @property
    def worker_timeouts(self) -> str:
        """Sorted set of worker key scored by its visibility timeout (seconds): how long
        recovery leaves that worker's leases alone while it is registered
        (``lua/worker_timeouts.lua``)."""
        return self._fixed("worker_timeouts")

    @property
    def worker_counts(self) -> str:
        """Hash of worker key to ``"<processed> <failed>"``: the counts its registrations
        added to :attr:`stats` so far (``lua/register.lua``)."""
        return self._fixed("worker_counts")

    @property
    def scale(self) -> str:
        """Hash of the autoscale setpoint: ``min``, ``max`` processes, ``at`` (Unix seconds)."""
        return self._fixed("scale")

    def scale_group(self, group: str) -> str:
        """Hash of the setpoint of the supervisors started with ``--group group``."""
        return self._one("scale_group", group)

    @property
    def supervisors(self) -> str:
        """Hash of supervisor id to its status; liveness in :attr:`supervisor_beats`."""
        return self._fixed("supervisors")

    @property
    def supervisor_beats(self) -> str:
        """Sorted set of supervisor id scored by status expiry (Unix seconds)."""
        return self._fixed("supervisor_beats")

    def custody(self, queue: str) -> str:
        """Hash of RabbitMQ deliveries of ``queue`` in the state store's custody (long tasks:
        ``broker/amqp/custody.py``)."""
        return self._one("custody", queue)

    def custody_leases(self, queue: str) -> str:
        """Sorted set of the custody ids of ``queue`` scored by lease expiry."""
        return self._one("custody_leases", queue)

    @property
    def custody_queues(self) -> str:
        """Set of the queues that have had RabbitMQ deliveries in custody."""
        return self._fixed("custody_queues")


def glob_escape(text: str) -> str:
    """``text`` with Redis glob specials (``* ? [ ] \\``) escaped, to match it literally (a
    ``PSUBSCRIBE`` or ``SCAN MATCH`` pattern over names that start with ``text``)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
