"""What the flusher writes instead of a completion the broker refused (too big for the
server, or an effect it rejects): a small completion with a ``failed`` record that names the
refusal, so the task ends and its waiter learns why, and never blocks the other completions
of its batch (``Flusher._isolate``, ``Flusher._refused``)."""

from __future__ import annotations

from .. import records
from ..broker import Completion
from ..broker.effects import Op, op_size
from ..exceptions import BrokerError, describe_error
from ..limits import clip_text

__all__ = ["SMALL_OP", "replacement_of", "small"]

#: Ops of a refused completion up to this many bytes are kept in its replacement (unique-key
#: and lock releases, small workflow steps); bigger ones (a huge result) are dropped.
SMALL_OP = 64 * 1024


def replacement_of(completion: Completion, size: int, error: BrokerError) -> Completion:
    """The small completion written instead of ``completion``, which the broker refused
    (``size`` bytes; ``error``: the refusal): a ``failed`` record that names the refusal,
    the original's ops of up to :data:`SMALL_OP` bytes and its guard (see
    ``Flusher._refused``)."""
    error_type, message = describe_error(error)
    record = records.refused(
        completion.task_id,
        completion.queue,
        completion.record,
        error_type,
        clip_text(f"the broker refused this task's completion ({size} bytes): {message}"),
    )
    ops = tuple(op for op in completion.ops if small(op))
    counted = completion.counted  # the metrics count what is written instead: a failure
    return Completion(
        completion.queue,
        completion.token,
        completion.task_id,
        record,
        completion.record_ttl or 86400,
        ops=ops,
        counted=(counted[0], "failed") if counted is not None else None,
        # The original's guard: when an earlier try of the original was applied after all
        # (it timed out, then the server read it), the replacement applies nothing.
        guard=completion.guard,
        nonce=completion.nonce,
        tally=2 if completion.tally else 0,  # counted as what is written: a failure
    )


def small(op: Op) -> bool:
    """Whether ``op`` is kept in a replacement (see :data:`SMALL_OP`); a value that is no
    completion effect is kept too, so the broker refuses it as before."""
    try:
        return op_size(op) <= SMALL_OP
    except BrokerError:
        return True
