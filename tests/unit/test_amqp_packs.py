"""Packs of the RabbitMQ transport (``broker/amqp/packs.py``): their format, their size, and
the ``?pack=`` option of the ``amqp_url`` (no server needed)."""

from __future__ import annotations

import pytest

from blitzq import ConfigurationError
from blitzq.broker.amqp.packs import (
    DEFAULT_MAX_PACK,
    MAGIC,
    PACK_BYTES,
    decode,
    encode,
    pack_size,
    packed,
)
from blitzq.broker.factory import amqp_pack, check_amqp_url, without_pack
from blitzq.exceptions import SerializationError
from blitzq.serialization import Envelope, decode_envelope, encode_envelope

pytestmark = pytest.mark.timeout(10)


def _message(i: int) -> bytes:
    return encode_envelope(Envelope(f"t{i}", "tests.noop", "q", [i]), 1 << 20)


def test_a_pack_decodes_to_its_messages_in_order() -> None:
    bodies = [_message(i) for i in range(5)] + [b""]
    assert decode(encode(bodies)) == bodies
    assert [decode(p) for p in packed(bodies, 4)] == [bodies[:4], bodies[4:]]


def test_large_messages_travel_in_smaller_packs() -> None:
    big = [bytes(PACK_BYTES // 2)] * 5 + [bytes(PACK_BYTES + 1)] + [b"x"] * 3
    packs = [decode(p) for p in packed(big, 32)]
    assert [len(p or []) for p in packs] == [2, 2, 1, 1, 3]
    assert [m for p in packs for m in p or []] == big


def test_a_damaged_pack_does_not_decode() -> None:
    body = encode([_message(1), _message(2)])
    assert decode(body[:-1]) is None  # cut short
    assert decode(MAGIC) is None  # no task
    assert decode(_message(1)) is None  # a plain message


def test_a_worker_that_does_not_know_packs_refuses_one_as_malformed() -> None:
    # What a worker of an older version does with a pack: not an envelope, dead-lettered.
    with pytest.raises(SerializationError, match="malformed"):
        decode_envelope(encode([_message(1)]))


def test_a_batch_still_yields_many_messages() -> None:
    assert pack_size(127, DEFAULT_MAX_PACK) == 1  # no packs under 128
    assert pack_size(128, DEFAULT_MAX_PACK) == 2
    assert pack_size(1000, DEFAULT_MAX_PACK) == 15
    assert pack_size(100_000, DEFAULT_MAX_PACK) == DEFAULT_MAX_PACK
    assert pack_size(100_000, 1) == 1


def test_the_pack_option_of_the_amqp_url() -> None:
    assert amqp_pack("amqp://guest:guest@h/vh") is None
    assert amqp_pack("amqp://guest:guest@h/vh?pack=1") == 1
    assert amqp_pack("amqp://u:p@h1,h2/vh?heartbeat=5&pack=64") == 64
    assert without_pack("amqp://h/vh?heartbeat=5&pack=64") == "amqp://h/vh?heartbeat=5"
    assert without_pack("amqp://h/vh?pack=64") == "amqp://h/vh"
    assert without_pack("amqp://h/vh") == "amqp://h/vh"


@pytest.mark.parametrize("value", ["0", "-1", "abc", "", "1001", "2.5"])
def test_a_bad_pack_option_is_a_configuration_error(value: str) -> None:
    url = f"amqp://user:secret@h/vh?pack={value}"
    with pytest.raises(ConfigurationError, match="pack=") as caught:
        check_amqp_url(url)
    assert "secret" not in str(caught.value)
