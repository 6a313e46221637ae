"""The RabbitMQ transport's own frame handling gives exactly what pamqp gives: the content
headers and body frames a publish batch writes (``batches._Frames``) are pamqp's bytes, and
the frames the bulk reader hands to aiormq (``frames.BulkFrameReceiver``) -- decoded by
pamqp, made from a kept ``basic.deliver`` decoding, or a body frame's payload -- equal
pamqp's decoding of the same bytes, cut out of one stream whatever the read sizes."""

from __future__ import annotations

import asyncio
import collections
import os

import pamqp.frame
import pytest
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from blitzq.broker.amqp.batches import _Frames, next_message_id
from blitzq.broker.amqp.frames import BulkFrameReceiver

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("headers", [None, {"x-blitzq-deliveries": 3}])
def test_publish_frames_are_pamqps(headers: dict[str, int] | None) -> None:
    ids = [next_message_id() for _ in range(5)]
    bodies = [os.urandom(n) for n in (10, 0, 300, 70_000, 5)]
    frames = _Frames(7, headers, ids[0], bodies[0])
    assert frames.exact  # the template path, not the fallback
    for message_id, body in zip(ids, bodies, strict=True):
        properties = spec.Basic.Properties(delivery_mode=2, headers=headers, message_id=message_id)
        assert frames.header(message_id, len(body)) == pamqp.frame.marshal(
            ContentHeader(0, len(body), properties), 7
        )
        assert frames.body(body) == pamqp.frame.marshal(ContentBody(body), 7)


class _Stream:
    """A stand-in for the connection's ``asyncio.StreamReader``: ``data`` in reads of at
    most ``step`` bytes, then the end."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data = data
        self.step = step

    def at_eof(self) -> bool:
        return not self.data

    async def read(self, n: int) -> bytes:
        chunk, self.data = self.data[: min(n, self.step)], self.data[min(n, self.step) :]
        return chunk


def _receiver(data: bytes, step: int) -> BulkFrameReceiver:
    receiver = BulkFrameReceiver.__new__(BulkFrameReceiver)
    receiver.reader = _Stream(data, step)  # type: ignore[assignment]
    receiver._ready = collections.deque()
    receiver._data = b""
    receiver._known = {}
    return receiver


@pytest.mark.parametrize("step", [1, 7, 100, 1 << 20])
def test_bulk_reader_gives_pamqps_frames(step: int) -> None:
    frames = []
    for tag, redelivered in [(1, False), (2, True), (2**40, False), (3, False)]:
        body = os.urandom(50 + tag % 7)
        frames += [
            pamqp.frame.marshal(spec.Basic.Deliver("ctag1.ab", tag, redelivered, "", "ns.q"), 2),
            pamqp.frame.marshal(
                ContentHeader(0, len(body), spec.Basic.Properties(message_id=f"m{tag}")), 2
            ),
            pamqp.frame.marshal(ContentBody(body), 2),
        ]
    frames.append(pamqp.frame.marshal(spec.Basic.Ack(9, multiple=True), 3))
    receiver = _receiver(b"".join(frames), step)

    async def read_all() -> None:
        for raw in frames:
            got = await receiver.get_frame()
            want = pamqp.frame.unmarshal(raw)
            assert got[:2] == want[:2]
            assert type(got[2]) is type(want[2])
            for name in ("consumer_tag", "delivery_tag", "redelivered", "exchange", "value"):
                assert getattr(got[2], name, None) == getattr(want[2], name, None)
        with pytest.raises(StopAsyncIteration):
            await receiver.get_frame()

    asyncio.run(read_all())
    assert len(receiver._known) == 1  # one consumer's deliveries: one kept shape
