"""The form of a generated task id (``routing.new_task_id``), without a server: 24 characters
of RFC 4648's lower-case base32 alphabet (120 random bits), a MessagePack fixstr, accepted by
every check an id meets (enqueue, the worker's decode, lookups) and never taken for the spread
layout's homed form, which keeps its 32 hex digits."""

from __future__ import annotations

import time

import msgspec
import pytest

from blitzq import Queue
from blitzq.broker.redis.homes import home_queue, homed_id
from blitzq.envelope_checks import envelope_fault
from blitzq.routing import (
    ID_ALPHABET,
    ID_BLOCK,
    ID_CHARS,
    ID_LENGTH,
    check_task_id,
    new_task_id,
    new_task_ids,
)
from blitzq.serialization import Envelope, decode_envelope, encode_envelope
from blitzq.task import CallOptions

pytestmark = pytest.mark.timeout(30)


def test_a_generated_id_is_24_characters_of_lower_case_base32() -> None:
    task_id = new_task_id()
    assert len(task_id) == ID_LENGTH == 24
    assert set(task_id) <= set("abcdefghijklmnopqrstuvwxyz234567") == set(ID_ALPHABET)
    assert task_id.isalnum()
    assert task_id.isascii()
    assert check_task_id("task id", task_id) == task_id
    assert home_queue(task_id) is None  # never the spread layout's homed form


def test_each_random_byte_maps_to_one_of_32_characters_8_times() -> None:
    """Uniform: every character of the alphabet comes from exactly 8 of the 256 byte values,
    so each character carries 5 random bits (120 for the id)."""
    counts = {c: ID_CHARS.count(c.encode()) for c in ID_ALPHABET}
    assert len(ID_CHARS) == 256
    assert set(counts.values()) == {8}


def test_generated_ids_do_not_repeat_and_use_the_whole_alphabet() -> None:
    ids = [new_task_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert set("".join(ids)) == set(ID_ALPHABET)
    assert {i[0] for i in ids} == set(ID_ALPHABET)  # a digit or a letter first, never "-"


@pytest.mark.parametrize("count", [0, 1, 2, 7, ID_BLOCK])
def test_a_batch_of_generated_ids_has_the_same_form(count: int) -> None:
    ids = new_task_ids(count)
    assert len(ids) == count
    assert all(len(i) == ID_LENGTH and set(i) <= set(ID_ALPHABET) for i in ids)
    assert len(set(ids)) == count


def test_batches_do_not_repeat_and_use_the_whole_alphabet() -> None:
    ids = [i for _ in range(20) for i in new_task_ids(ID_BLOCK)]
    assert len(set(ids)) == len(ids) == 20 * ID_BLOCK
    assert set("".join(ids)) == set(ID_ALPHABET)
    assert {i[0] for i in ids} == {i[-1] for i in ids} == set(ID_ALPHABET)


def test_a_generated_id_is_a_fixstr_9_bytes_shorter_than_32_hex_digits() -> None:
    assert msgspec.msgpack.encode(new_task_id())[0] == 0xA0 + 24  # fixstr: one header byte
    now = time.time()
    short = encode_envelope(
        Envelope(new_task_id(), "app.noop", "default", [], {}, 1, now, now), 1 << 20
    )
    hexed = encode_envelope(Envelope("f" * 32, "app.noop", "default", [], {}, 1, now, now), 1 << 20)
    assert len(hexed) - len(short) == 9
    assert decode_envelope(short).id == msgspec.msgpack.decode(short)[0]


def test_the_producer_generates_the_short_form_and_a_worker_accepts_it() -> None:
    """Without a running loop the producer has no broker to ask: the generated form (the
    single-server layout's). The envelope passes the worker's decode check untouched."""
    queue = Queue("ids", redis_url="redis://127.0.0.1:1/0")
    envelopes = [
        queue._producer.envelope("app.noop", "ids", (), {}, CallOptions(), time.time())
        for _ in range(100)
    ]
    ids = {env.id for env in envelopes}
    assert len(ids) == 100
    assert all(len(i) == 24 and set(i) <= set(ID_ALPHABET) for i in ids)
    for env in envelopes:
        data = encode_envelope(env, 1 << 20)
        assert decode_envelope(data) == env
        assert envelope_fault(decode_envelope(data), time.time()) is None


def test_a_chosen_id_and_the_homed_form_are_kept() -> None:
    queue = Queue("ids", redis_url="redis://127.0.0.1:1/0")
    chosen = queue._producer.envelope(
        "app.noop", "ids", (), {}, CallOptions(task_id="order-17"), time.time()
    )
    assert chosen.id == "order-17"
    homed = homed_id("ids:high")
    assert (len(homed), homed[32:], home_queue(homed)) == (36, ".ids", "ids")
