"""Checks of DESIGN.md §5's invariants over what a chaos run observed.

The worker processes record every execution (``chaos_app``); the test records every fault it
injected (:class:`Fault`). From those and the task records this module decides:

- nothing lost: every task enqueued reached a final state, succeeded, and ran at least once;
- duplicates only for tasks in flight at a fault: a task that ran ``k > 1`` times has at least
  ``k - 1`` executions that overlap a fault hitting the process that ran them (give or take
  ``slack`` seconds, for a completion still being written or a reply held back by a
  partition);
- periodic occurrences exactly once: each occurrence claimed at most once, none missing
  between the first and the last, each one run;
- chord callbacks exactly once: each chord's callback ran (and, beyond faults, only once),
  with every member's result in order;
- no record left running: no task record of the namespace is in a non-final state;
- concurrency never above a worker's bound (invariant 5), from the execution intervals.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Execution:
    """One run of a task body, as its worker recorded it.

    Attributes:
        kind: ``work``, ``member``, ``join`` or ``tick``.
        item: the label, ``<chord>:<index>``, the chord id, or the occurrence (Unix seconds).
        task_id: the task id.
        pid: the worker process.
        start: Unix seconds when the body started.
        end: Unix seconds when it returned; ``None`` if it never did (killed, cut short).
    """

    kind: str
    item: str
    task_id: str
    pid: int
    start: float
    end: float | None


@dataclass(frozen=True)
class Fault:
    """One injected fault.

    Attributes:
        kind: e.g. ``latency``, ``cut``, ``half_open``, ``partition``, ``kill_worker``,
            ``kill_scheduler``, ``redis_restart``.
        pids: the processes it hit; ``None`` for all (a server restart).
        start: Unix seconds when it began.
        end: Unix seconds when it ended (equal to ``start`` for an instant fault).
    """

    kind: str
    pids: frozenset[int] | None
    start: float
    end: float

    def hits(self, execution: Execution, slack: float) -> bool:
        """Whether ``execution`` was in flight at this fault (within ``slack`` seconds)."""
        if self.pids is not None and execution.pid not in self.pids:
            return False
        end = math.inf if execution.end is None else execution.end
        return execution.start - slack <= self.end and end + slack >= self.start


def parse_executions(raw: Mapping[bytes, bytes]) -> list[Execution]:
    """Decode the ``{ns}:chaos:exec`` hash (see ``chaos_app``)."""
    found = []
    for name, value in raw.items():
        kind, item, task_id, pid, _n = name.decode().split("|")
        times = value.decode().split()
        end = float(times[1]) if len(times) > 1 else None
        found.append(Execution(kind, item, task_id, int(pid), float(times[0]), end))
    return found


@dataclass
class Figures:
    """What one chaos scenario did and found (printed at the end of the session); ``seed``
    is the session's ``BLITZQ_CHAOS_SEED``, which replays the scenario's random choices."""

    scenario: str
    seed: int
    tasks: int = 0
    chords: int = 0
    occurrences: int = 0
    executions: int = 0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    duplicates: int = 0
    """Extra executions (runs beyond the first) of all tasks."""
    duplicated_tasks: int = 0
    unexplained: list[str] = field(default_factory=list)
    """Tasks run more often than the faults they were in flight at explain."""
    seconds: float = 0.0
    peak_concurrency: int = 0
    """Most bodies one worker ran at once."""

    def line(self) -> str:
        """One line of figures."""
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        return (
            f"{self.scenario} (BLITZQ_CHAOS_SEED={self.seed}): {self.tasks} tasks, "
            f"{self.chords} chords, "
            f"{self.occurrences} periodic occurrences, {self.executions} executions; "
            f"faults: {faults} (total {sum(self.faults.values())}); duplicates "
            f"{self.duplicates} in {self.duplicated_tasks} tasks, "
            f"{len(self.unexplained)} unexplained; peak concurrency of a worker "
            f"{self.peak_concurrency}; {self.seconds:.0f} s"
        )


def summary_lines(recorded: Iterable[Mapping[str, Any]]) -> list[str]:
    """The session summary's lines: one per scenario, its first unexplained duplicates, and
    a total; from figures recorded as plain data (``dataclasses.asdict``, faults a dict).

    Args:
        recorded: the figures of each scenario run, in order; not empty.
    """
    scenarios = [Figures(**{**d, "faults": collections.Counter(d["faults"])}) for d in recorded]
    lines: list[str] = []
    for figures in scenarios:
        lines.append(figures.line())
        lines += [f"    unexplained duplicate: {u}" for u in figures.unexplained[:10]]
    total = Figures("total", scenarios[0].seed)
    for f in scenarios:
        total.tasks += f.tasks
        total.chords += f.chords
        total.occurrences += f.occurrences
        total.executions += f.executions
        total.faults.update(f.faults)
        total.duplicates += f.duplicates
        total.duplicated_tasks += f.duplicated_tasks
        total.unexplained += f.unexplained
        total.seconds += f.seconds
        total.peak_concurrency = max(total.peak_concurrency, f.peak_concurrency)
    lines.append(total.line())
    return lines


def check_duplicates(
    executions: Iterable[Execution], faults: list[Fault], slack: float, figures: Figures
) -> list[str]:
    """Count duplicates into ``figures``; return the tasks whose duplicates no fault explains.

    A task run ``k > 1`` times is explained when at least ``k - 1`` of its executions were in
    flight at some fault that hit their process.
    """
    by_task: dict[tuple[str, str], list[Execution]] = collections.defaultdict(list)
    for e in executions:
        by_task[(e.kind, e.item)].append(e)
    unexplained = []
    for (kind, item), runs in sorted(by_task.items()):
        if len(runs) < 2:
            continue
        figures.duplicates += len(runs) - 1
        figures.duplicated_tasks += 1
        hit = sum(1 for e in runs if any(f.hits(e, slack) for f in faults))
        if hit < len(runs) - 1:
            detail = "; ".join(
                f"pid {e.pid} {e.start:.3f}-{'killed' if e.end is None else f'{e.end:.3f}'}"
                for e in sorted(runs, key=lambda e: e.start)
            )
            unexplained.append(f"{kind} {item}: {len(runs)} runs ({detail})")
    figures.unexplained = unexplained
    return unexplained


def check_periodic(
    claims: Mapping[bytes, bytes], executions: Iterable[Execution], every: int
) -> tuple[int, list[str]]:
    """Periodic exactly-once: return ``(occurrences, problems)``.

    Args:
        claims: the ``{ns}:chaos:claims`` hash (field ``<occurrence>|<pid>|<n>``).
        executions: every execution (the ``tick`` ones are used).
        every: the schedule's interval in seconds.
    """
    claimed: collections.Counter[int] = collections.Counter(
        int(name.decode().split("|")[0]) for name in claims
    )
    ran = {int(e.item) for e in executions if e.kind == "tick"}
    problems = [f"occurrence {occ} claimed {n} times" for occ, n in claimed.items() if n > 1]
    seen = set(claimed) | ran
    if not seen:
        return 0, ["no periodic occurrence was dispatched"]
    expected = set(range(min(seen), max(seen) + 1, every))
    problems += [f"occurrence {occ} never dispatched" for occ in sorted(expected - seen)]
    problems += [f"occurrence {occ} claimed but never ran" for occ in sorted(set(claimed) - ran)]
    return len(seen), problems


def check_concurrency(
    executions: Iterable[Execution], faults: list[Fault], limits: Mapping[int, int]
) -> tuple[int, list[str]]:
    """Invariant 5 per worker: at no moment did a process run more bodies than its limit.

    An execution that never returned ends when a kill fault hit its process (or, with none,
    never: a body still "running" counts until the end).

    Args:
        executions: every execution.
        faults: the injected faults (kills end unfinished executions).
        limits: pid -> configured concurrency of that worker.

    Returns:
        ``(highest concurrency seen in any process, problems)``.
    """
    killed: dict[int, float] = {}
    for f in faults:
        if f.kind.startswith("kill") and f.pids is not None:
            for pid in f.pids:
                killed[pid] = f.start
    events: dict[int, list[tuple[float, int]]] = collections.defaultdict(list)
    for e in executions:
        end = e.end if e.end is not None else killed.get(e.pid, math.inf)
        events[e.pid] += [(e.start, 1), (end, -1)]
    highest, problems = 0, []
    for pid, points in sorted(events.items()):
        running = peak = 0
        for _, step in sorted(points):  # at equal times an end (-1) sorts before a start
            running += step
            peak = max(peak, running)
        highest = max(highest, peak)
        limit = limits.get(pid)
        if limit is not None and peak > limit:
            problems.append(f"pid {pid} ran {peak} bodies at once (concurrency {limit})")
    return highest, problems
