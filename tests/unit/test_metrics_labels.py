"""The label and attribute values of issue 27 point 4 that are pure functions: an exception's
qualified name (the ``exception`` label, ``error.type``) and a broker URL's ``server.*``."""

from __future__ import annotations

import pytest

from blitzq.exceptions import TaskTimeout
from blitzq.integrations.opentelemetry_spans import _server
from blitzq.worker.tally import exception_name


class Outer:
    class Inner(Exception):
        pass


def test_exception_name_is_qualified_except_for_builtins() -> None:
    assert exception_name(ValueError) == "ValueError"
    assert exception_name(TaskTimeout) == "blitzq.exceptions.TaskTimeout"
    assert exception_name(Outer.Inner) == f"{__name__}.Outer.Inner"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://10.0.0.5:6380/0", {"server.address": "10.0.0.5", "server.port": 6380}),
        (
            "redis://:secret@cache.internal/2",
            {"server.address": "cache.internal", "server.port": 6379},
        ),
        ("rediss://cache.internal", {"server.address": "cache.internal", "server.port": 6379}),
        ("redis+cluster://node1:7000", {"server.address": "node1", "server.port": 7000}),
        ("redis+sentinel://sentinel1/mymaster", {"server.address": "sentinel1"}),
        ("amqp://guest:guest@rabbit:5673/", {"server.address": "rabbit", "server.port": 5673}),
        ("amqps://rabbit/", {"server.address": "rabbit", "server.port": 5671}),
        ("unix:///run/redis.sock?db=1", {"server.address": "/run/redis.sock"}),
        ("memory://", {}),
        ("memory://jobs", {}),
    ],
)
def test_server_attributes_of_a_broker_url(url: str, expected: dict[str, object]) -> None:
    assert _server(url) == expected
