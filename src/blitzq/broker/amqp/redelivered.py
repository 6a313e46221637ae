"""Redeliveries of messages whose completion the state store already committed.

The RabbitMQ pairing commits a completion in the state store, then acks the delivery (see
``broker.py``); the ack is queued on the connection without waiting (acks are batched, see
``deliveries.py``). A connection lost or a worker process killed between the commit and the
moment RabbitMQ read the ack leaves the delivery unacked, and RabbitMQ delivers it again --
with every other unacked delivery of that connection, e.g. the tasks a crash-looping poison
task was fetched with. Running those again would run a finished task twice.

So before a redelivered message (``deliveries`` > 1) runs, :func:`committed` reads the task
records of the batch's redeliveries in one state-store round trip, and the transport acks
without running each one whose attempt is already recorded as over: the record is final
(``succeeded``, ``failed``, ``dead_lettered``, ``cancelled``, ``expired``), or ``retrying``
with ``attempts`` at least the message's ``attempt`` (the retry is another message). A
message whose record says it is ``running`` or waiting (the worker died while it ran) runs
again, as at-least-once delivery promises.

A pack (several tasks in one AMQP message, ``packs.py``) delivered again is split by
:func:`split_pack` before anything of it runs: the same check drops its tasks already over,
the others are published again one message each, and the pack is acked.

A caller that reuses a task id after the task finished enqueues a new message whose record
starts over (``queued``), so its redeliveries run. If the records cannot be read (the state
store is unreachable), nothing is skipped: the messages run again (at-least-once).

**Fencing.** A worker stalled past the AMQP heartbeat (``SIGSTOP``, a blocked event loop)
loses its channel: RabbitMQ delivers its unacked messages to another consumer, which runs
them; the stalled worker, once it resumes, finishes the runs it had started. Its late
completions must write nothing (docs/guarantees.md, *Fencing*). So the read of the records
above is also a *take*: in the same atomic step (:meth:`RecordsState.take_redelivered`),
each redelivery is noted as the latest take of its message copy -- the task's id and the
digest of the message's body (:func:`copy_digest`, also the end of the delivery's
token, ``/<digest>``: a copy published again by a hand-back, a custody recovery or a pack's
split keeps its body, hence its name) -- and the completion script refuses as stale a
completion of that copy whose token is not the latest take. A completion committed before
the take is seen by the take's record read (the redelivery is acked without running), one
after it is refused: never both. Takes are kept :data:`TAKE_TTL` seconds.

**Attempts.** A quorum queue counts a return for every message a closed channel held,
those its worker never took (prefetched, waiting in its consumer's buffer) included: a
message that sat in the buffers of two stalled workers came back with three deliveries and
ran as attempt 3 of a task allowed 2. The takes count the redeliveries workers really took,
so a redelivery's ``deliveries`` is at most 1 (the first delivery, which may have run: no
take of it is noted) + its copy's takes, this one included; the first one is marked
``unsure`` (:attr:`Delivery.unsure`), and the worker does not count it as an attempt past
the task's last (a retry copy prefetched by a stalled worker, then run by another, is still
the last attempt, not one more).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from ...records import TaskRecord, TaskState
from ...serialization import decode_envelope
from ..state import StateStore
from ..transport import Delivery
from .channels import delivery_count, settle
from .deliveries import Received
from .packs import decode

logger = logging.getLogger("blitzq.broker.amqp")


#: Seconds a take of a redelivered message copy is kept (``{ns}:tk:<task_id>:<digest>``): a stalled
#: worker's completion arriving later than that after the take is no longer fenced.
TAKE_TTL = 86400


def copy_digest(body: bytes) -> bytes:
    """The name of a message copy by its body: 16 hex digits of its BLAKE2b digest."""
    return hashlib.blake2b(body, digest_size=8).hexdigest().encode()


def _attempt_over(record: bytes | None, attempt: int) -> bool:
    if record is None:
        return False
    try:
        stored = TaskRecord.from_bytes(record)
    except Exception:  # not a record we can read: let the message run
        return False
    if stored.state.is_final:
        return True
    return stored.state is TaskState.RETRYING and stored.attempts >= attempt


async def committed(store: StateStore, bodies: Sequence[bytes]) -> list[bool]:
    """Per message body: whether its task's record shows this attempt already over (see the
    module docstring). One ``get_records`` round trip for the whole batch; a body that does
    not decode, or a store that does not answer, counts as not over."""
    ids: list[str] = []
    attempts: list[int] = []
    readable: list[int] = []
    for index, body in enumerate(bodies):
        try:
            envelope = decode_envelope(body)
        except Exception:  # the worker dead-letters what does not decode
            continue
        ids.append(envelope.id)
        attempts.append(envelope.attempt)
        readable.append(index)
    out = [False] * len(bodies)
    if not ids:
        return out
    try:
        found = await store.records.get_records(ids)
    except Exception as exc:  # at-least-once: run them again
        logger.debug("could not read the records of redelivered messages: %s", exc)
        return out
    for index, record, attempt in zip(readable, found, attempts, strict=True):
        out[index] = _attempt_over(record, attempt)
    return out


async def skip_committed(
    store: StateStore,
    out: list[Delivery],
    ack: Callable[[str, Sequence[bytes]], Awaitable[None]],
) -> list[Delivery]:
    """Ack with ``ack(queue, tokens)``, without running them, the redeliveries among ``out``
    (``deliveries`` > 1) whose attempt ``store`` already recorded as over (:func:`committed`);
    return the others, in their order, each redelivery noted as its copy's latest take and
    its ``deliveries`` counting only the takes (see *Fencing* and *Attempts* above).

    Raises:
        BrokerError: an ack failed (RabbitMQ could not be reached).
    """
    again = [d for d in out if d.deliveries > 1]
    over, taken = await _take(store, again)
    done = [d for d, skip in zip(again, over, strict=True) if skip]
    if taken:
        # Count only the returns of copies a worker took, the first delivery unsure (see
        # *Attempts* above).
        counted = {id(d): min(d.deliveries, 1 + n) for d, n in zip(again, taken, strict=True)}
        out = [
            d._replace(deliveries=counted[id(d)], unsure=True) if id(d) in counted else d
            for d in out
        ]
    if not done:
        return out
    by_queue: dict[str, list[bytes]] = {}
    for d in done:
        if d.token is not None:
            by_queue.setdefault(d.queue, []).append(d.token)
    for queue, tokens in by_queue.items():
        await ack(queue, tokens)
    logger.info(
        "acked %d redelivered message(s) whose completion was already committed (not run again)",
        len(done),
    )
    skipped = {d.token for d in done}
    return [d for d in out if d.token not in skipped]


async def _take(store: StateStore, again: Sequence[Delivery]) -> tuple[list[bool], list[int]]:
    """Per redelivery of ``again``: whether its attempt is over (:func:`committed`), and the
    takes of its copy counted, this one included (:meth:`RecordsState.take_redelivered`);
    no counts (an empty list) when the store notes no takes or does not answer (nothing is
    fenced then: the redeliveries run, at-least-once)."""
    ids: list[str] = []
    attempts: list[int] = []
    readable: list[int] = []
    digests: list[str] = []
    owners: list[bytes] = []
    for index, d in enumerate(again):
        token = d.token
        if token is None or b"/" not in token:
            continue
        try:
            envelope = decode_envelope(d.payload)
        except Exception:  # the worker dead-letters what does not decode
            continue
        ids.append(envelope.id)
        attempts.append(envelope.attempt)
        readable.append(index)
        digests.append(token.rpartition(b"/")[2].decode())
        owners.append(token)
    over = [False] * len(again)
    if not ids:
        return over, []
    try:
        found, counts = await store.records.take_redelivered(ids, digests, owners, TAKE_TTL)
    except NotImplementedError:
        return await committed(store, [d.payload for d in again]), []
    except Exception as exc:  # at-least-once: run them again
        logger.debug("could not take redelivered messages: %s", exc)
        return over, []
    taken = [d.deliveries - 1 for d in again]  # not taken: its count stands
    for index, record, attempt, n in zip(readable, found, attempts, counts, strict=True):
        over[index] = _attempt_over(record, attempt)
        taken[index] = n
    return over, taken


async def split_pack(
    store: StateStore | None,
    queue: str,
    message: Received,
    publish: Callable[[str, Sequence[bytes], int], Awaitable[None]],
) -> bool:
    """Split a pack delivered again (``message``, from ``queue``): its tasks whose attempt
    ``store`` recorded as over (:func:`committed`; no store: none) are dropped, the others
    published again one message each with ``publish(queue, bodies, deliveries)`` -- marked
    as delivered once, so their next delivery counts as the second: a pack that went round
    many crashes unsplit (every slot busy, e.g. while a suspect ran alone) would otherwise
    hand each of its tasks the pack's count, making innocent tasks suspects that run alone
    (``worker/solo.py``), and a poison task among them is found by its own next crashes --,
    then the pack is acked. Returns ``False`` (nothing done) when ``message`` is not a well-formed
    pack delivered again: the caller delivers it as it is.

    Raises:
        BrokerError: a publish was not confirmed (the pack stays unacked: RabbitMQ delivers
            it again).
    """
    bodies = decode(message.body)
    deliveries = delivery_count(message.headers or {})
    if bodies is None or deliveries < 2:
        return False
    over = [False] * len(bodies)
    if store is not None:
        over = await committed(store, bodies)
    again = [body for body, done in zip(bodies, over, strict=True) if not done]
    await publish(queue, again, 1)
    await settle(message, True)
    logger.info(
        "a pack of %d task(s) of %s delivered again: %d committed already (not run again), "
        "%d published again one message each",
        len(bodies),
        queue,
        len(bodies) - len(again),
        len(again),
    )
    return True


__all__ = ["TAKE_TTL", "committed", "copy_digest", "skip_committed", "split_pack"]
