"""Every Redis key name blitzq uses, made in one place.

All keys of a namespace share the hash tag ``{ns}`` so every Lua script touches one cluster
slot. Scripts receive :attr:`Keys.prefix` and derive the per-queue and per-task names from it
with the same suffixes defined here (``s:``, ``l:``, ``t:``, ``d:``, ``done:``).
"""

from __future__ import annotations

from dataclasses import dataclass

#: The consumer group every reliable-mode stream uses.
GROUP = "blitzq"
#: The single stream field holding the message; ``d`` counts redeliveries after recovery.
MESSAGE_FIELD = b"m"


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names of one namespace.

    Args:
        namespace: the application namespace (any non-empty string without ``{`` or ``}``).
    """

    namespace: str

    @property
    def prefix(self) -> str:
        """``{ns}:`` — the start of every key."""
        return "{" + self.namespace + "}:"

    def stream(self, queue: str) -> str:
        """Reliable-mode stream of a queue."""
        return f"{self.prefix}s:{queue}"

    def list(self, queue: str) -> str:
        """Fast-mode list of a queue."""
        return f"{self.prefix}l:{queue}"

    def record(self, task_id: str) -> str:
        """A task's record."""
        return f"{self.prefix}t:{task_id}"

    def done_channel(self, task_id: str) -> str:
        """Pub/sub channel announcing that a task's record was written."""
        return f"{self.prefix}done:{task_id}"

    def dead_letter(self, task_id: str) -> str:
        """Hash holding one dead letter's fields."""
        return f"{self.prefix}d:{task_id}"

    def unique(self, key: str) -> str:
        """Unique-task key ``<task>:<key>``: the id of the task holding it, with a TTL."""
        return f"{self.prefix}u:{key}"

    def lock(self, key: str) -> str:
        """Sorted set of a task lock's holders scored by lease expiry (Unix seconds)."""
        return f"{self.prefix}lk:{key}"

    def workflow(self, workflow_id: str) -> str:
        """Hash of a workflow's state (state, result, error, steps); see ``blitzq.workflow``."""
        return f"{self.prefix}wf:{workflow_id}"

    def workflow_join(self, workflow_id: str, join_id: str) -> str:
        """Hash of a chord's member results by index, plus its ``f`` (fired) flag."""
        return f"{self.prefix}wf:{workflow_id}:j:{join_id}"

    def workflow_channel(self, workflow_id: str) -> str:
        """Pub/sub channel announcing that a workflow reached a final state."""
        return f"{self.prefix}done:wf:{workflow_id}"

    def progress(self, task_id: str) -> str:
        """Hash of a task's latest progress: ``at`` (Unix time) and ``v`` (encoded update)."""
        return f"{self.prefix}p:{task_id}"

    def progress_channel(self, task_id: str) -> str:
        """Pub/sub channel carrying each progress update written for a task."""
        return f"{self.prefix}progress:{task_id}"

    def rate_limit(self, key: str) -> str:
        """Token bucket of a rate limit (a task name, a shared ``rate_key``, ``queue:<q>``)."""
        return f"{self.prefix}rl:{key}"

    @property
    def dead_letters(self) -> str:
        """Sorted set of dead-lettered task ids scored by failure time."""
        return f"{self.prefix}dlq"

    @property
    def dead_letter_sizes(self) -> str:
        """Hash of dead-lettered task id to its size in bytes (``lua/dead_letters.lua``)."""
        return f"{self.prefix}dlq:size"

    @property
    def dead_letter_bytes(self) -> str:
        """Sum of :attr:`dead_letter_sizes`, held under ``dead_letter_max_bytes``."""
        return f"{self.prefix}dlq:bytes"

    @property
    def schedule(self) -> str:
        """Sorted set of scheduled task ids scored by due time."""
        return f"{self.prefix}sched"

    @property
    def schedule_data(self) -> str:
        """Hash of scheduled task id to ``<kind><queue>\\n<message>``."""
        return f"{self.prefix}sched:m"

    @property
    def periodic(self) -> str:
        """Hash of periodic task name to its last dispatched occurrence (Unix seconds)."""
        return f"{self.prefix}periodic"

    @property
    def revoked(self) -> str:
        """Sorted set of cancelled task ids scored by when the mark expires."""
        return f"{self.prefix}revoked"

    @property
    def events(self) -> str:
        """Pub/sub channel: ``r:<id>`` a task was cancelled, ``s:<eta>`` one was scheduled."""
        return f"{self.prefix}events"

    @property
    def stats(self) -> str:
        """Hash of namespace-wide counters (``stale_completions``: completions fenced off)."""
        return f"{self.prefix}stats"

    @property
    def queues(self) -> str:
        """Set of known queue names."""
        return f"{self.prefix}queues"

    @property
    def workers(self) -> str:
        """Hash of worker id to registration info; liveness in :attr:`worker_beats`."""
        return f"{self.prefix}workers"

    @property
    def worker_beats(self) -> str:
        """Sorted set of worker id scored by registration expiry (Unix seconds)."""
        return f"{self.prefix}workers:exp"
