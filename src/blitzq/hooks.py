"""Extension points that features plug into, so the core paths stay short.

- **Start checks** (``Task.checks``): coroutines a worker awaits before it runs a task (a lock,
  an age limit, …). One returns ``None`` to let the task start, or a
  :class:`~blitzq.broker.state.Completion` that ends this delivery instead (for example
  :meth:`~blitzq.worker.runner.Runner.reschedule`, which puts the task back on the schedule
  without spending an attempt or holding a slot).
- **Finishers** (``Task.finishers``): called with every completion of the task's deliveries
  before it is written; one may add atomic operations (``Completion.ops``) or change it, and
  is told whether the task has reached a final state.
- **Enqueue filters** (``Queue.enqueue_filters``): coroutines that see each batch of outgoing
  messages before it is published; one may raise to refuse the enqueue, or mark a message as a
  duplicate of an existing task (``Outgoing.existing_id``) so it is not published.
- **Enqueue observers** (``Queue.enqueue_observers``): called with what was published.

A task or queue without any of these pays nothing for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .broker import Completion
    from .queue import Queue
    from .serialization import Envelope
    from .task import Task
    from .worker.execution import Job
    from .worker.runner import Runner


@dataclass(slots=True)
class Outgoing:
    """One message about to be published.

    Attributes:
        envelope: the decoded message.
        data: its encoded bytes (re-encode with ``encode_envelope`` after changing
            ``envelope``).
        due: Unix time it becomes due by the producer's clock (an estimate for filters and
            observers), or ``None`` for now. What decides is the broker's clock: see
            ``delay``.
        task: the registered task, or ``None`` for ``queue.send`` of an unknown name.
        existing_id: set by a filter to the id of an existing task this one duplicates; the
            message is then not published and the caller's handle points at that task.
        delay: for a ``delay=``, its seconds, sent as such so that the broker adds them to
            its own clock; ``None`` for an absolute ``eta=`` (``due``), which the broker
            compares with its clock as given.
    """

    envelope: Envelope
    data: bytes
    due: float | None
    task: Task[Any, Any] | None
    existing_id: str | None = None
    delay: float | None = None


class StartCheck(Protocol):
    """A coroutine awaited before a task starts; see the module docstring."""

    async def __call__(self, runner: Runner, job: Job) -> Completion | None: ...


class Finisher(Protocol):
    """Called with each completion of a task; see the module docstring.

    Args:
        job: the delivery that ended.
        completion: what will be written.
        final: whether the task reached a final state (succeeded, failed, dead-lettered,
            cancelled) rather than a retry, a requeue or a reschedule.
        error: the exception of a failed attempt, else ``None``.
    """

    def __call__(
        self, job: Job, completion: Completion, final: bool, error: BaseException | None
    ) -> Completion: ...


class EnqueueFilter(Protocol):
    """A coroutine that sees each batch before it is published; see the module docstring."""

    async def __call__(self, queue: Queue, batch: list[Outgoing]) -> None: ...


class EnqueueObserver(Protocol):
    """Called with each batch that was published (duplicates left out)."""

    async def __call__(self, queue: Queue, batch: list[Outgoing]) -> None: ...
