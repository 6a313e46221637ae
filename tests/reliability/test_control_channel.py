"""The control channel: ``blitzq worker --group LABEL --max-processes N`` with setpoints
written by ``blitzq control scale --group`` or straight into Redis (as a controlling service
would), each accepted or rejected with its reason in the supervisor's published status.

Every supervisor is a real ``python -m blitzq worker …`` subprocess on the test Redis (the
application and fixtures of :mod:`tests.reliability.test_process_control`); waits are on
events (processes in ``/proc``, registrations, the published status), with deadlines.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from blitzq.cli import cli
from tests.polling import wait_until
from tests.reliability import test_process_control as pc
from tests.reliability.test_process_control import APP, control, workers_are
from tests.reliability.test_supervisor import Supervised

#: The fixtures of the process-control tests: ``start`` (a supervisor) and ``client``.
start = pc.start
client = pc.client

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
    pytest.mark.timeout(180),
]


def statuses(client: redis.Redis, namespace: str, group: str | None) -> list[dict[str, Any]]:
    """The published status of every supervisor of ``group``, read as a controller would."""
    raw = client.hgetall("{" + namespace + "}:supervisors")
    docs = [json.loads(v) for v in raw.values()]
    return [d for d in docs if d.get("group") == group]


def verdict(
    client: redis.Redis, namespace: str, group: str, fields: dict[str, str], processes: int
) -> dict[str, Any]:
    """Wait until the one supervisor of ``group`` published its verdict on the setpoint
    ``fields`` (as written) and runs ``processes`` worker processes; return its status."""

    def seen() -> dict[str, Any] | None:
        docs = statuses(client, namespace, group)
        if len(docs) != 1 or docs[0]["processes"] != processes:
            return None
        point = docs[0]["setpoint"] or {}
        shown = {k: str(v) if k != "at" else v for k, v in point.items()}
        wanted = {k: v if k != "at" else float(v) for k, v in fields.items()}
        return docs[0] if shown == wanted else None

    return wait_until(seen, 40, f"{group}: verdict on {fields}")  # type: ignore[no-any-return]


def test_groups_headroom_and_every_rejection_reason_in_the_status(
    start: Callable[..., Supervised], client: redis.Redis, namespace: str, redis_url: str
) -> None:
    fast = ("--workers", "1", "-c", "1", "--autoscale-interval", "0.2")
    one = start("--group", "one", "--max-processes", "3", *fast)
    two = start("--group", "two", "--max-processes", "2", *fast)
    workers_are(one, client, namespace, 1)
    workers_are(two, client, namespace, 1)

    # Group addressing: the setpoint of `one` moves `one` only.
    code, out = control(redis_url, namespace, "scale", "--group", "one", "--min", "2", "--max", "2")
    assert code == 0, out
    assert "group one" in out
    workers_are(one, client, namespace, 2)
    [doc] = wait_until(
        lambda: [d for d in statuses(client, namespace, "one") if d["processes"] == 2],
        20,
        "status of one with 2 processes",
    )
    assert (doc["setpoint_state"], doc["origin"], doc["min"], doc["max"]) == (
        "accepted",
        "setpoint",
        2,
        2,
    )
    assert doc["max_processes"] == 3
    assert doc["rejected"] is None
    [other] = statuses(client, namespace, "two")
    assert (other["processes"], other["setpoint_state"], other["origin"]) == (
        1,
        "none",
        "arguments",
    )
    assert len(two.workers()) == 1

    # Each rejection: the supervisor keeps its processes and says why.
    key = "{" + namespace + "}:scale:g:two"
    rejections = [
        ({"min": "2", "max": "1", "at": "1.5"}, "inverted: the minimum (2) is above the maximum"),
        ({"min": "0", "max": "2", "at": "2.5"}, "out of range: the minimum must be at least 1"),
        ({"min": "x", "max": "2", "at": "3.5"}, "unreadable: min 'x' is not a whole number"),
        ({"max": "2", "at": "4.5"}, "unreadable: no 'min' field"),
    ]
    for fields, reason in rejections:
        with client.pipeline() as pipe:
            pipe.delete(key).hset(key, mapping=fields).execute()
        doc = verdict(client, namespace, "two", fields, 1)
        assert doc["setpoint_state"] == "rejected", doc
        assert doc["rejected"].startswith(reason), doc
        assert (doc["origin"], doc["min"], doc["max"]) == ("arguments", 1, 1)
    client.set(key, "3,3")  # not a hash at all
    wait_until(
        lambda: any(
            "the key is a string" in (d["rejected"] or "")
            for d in statuses(client, namespace, "two")
        ),
        40,
        "a string setpoint rejected",
    )
    # Headroom: a setpoint the CLI accepts (within the hard cap) but above --max-processes 2.
    code, out = control(redis_url, namespace, "scale", "--group", "two", "--min", "3", "--max", "3")
    assert code == 0, out
    at = float(client.hget(key, "at") or 0)
    doc = verdict(client, namespace, "two", {"min": "3", "max": "3", "at": repr(at)}, 1)
    assert doc["rejected"] == (
        "out of range: the maximum (3) is above this supervisor's --max-processes 2"
    )
    code, out = control(redis_url, namespace, "--json", "status", "--group", "two")
    assert code == 0, out
    [shown] = json.loads(out)["supervisors"]
    assert shown["setpoint_state"] == "rejected"
    assert "--max-processes 2" in shown["rejected"]
    assert "rejected: " in control(redis_url, namespace, "status", "--group", "two")[1]
    assert "rejected: out of range" in two.log.read_text()  # logged once, as a WARNING

    # A valid setpoint is applied; `one` is untouched by all of it.
    code, out = control(redis_url, namespace, "scale", "--group", "two", "--min", "2", "--max", "2")
    assert code == 0, out
    workers_are(two, client, namespace, 2)
    assert len(one.workers()) == 2
    # Removed: back to the command line's count.
    assert control(redis_url, namespace, "scale", "--group", "two", "--reset")[0] == 0
    workers_are(two, client, namespace, 1)
    for sup in (one, two):
        sup.proc.send_signal(signal.SIGTERM)
        assert sup.proc.wait(30) == 0, sup.output()
    assert statuses(client, namespace, "one") == statuses(client, namespace, "two") == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--group", "g"], "--group applies to a supervisor that reads a setpoint"),
        (["--group", "a b", "--autoscale", "1,2"], "is not a group label"),
        (["--max-processes", "2", "--autoscale", "1,3"], "--max-processes 2 is below the"),
        (["--max-processes", "1", "--workers", "2"], "--max-processes 1 is below the --workers 2"),
        (["--max-processes", "65"], "--max-processes"),
    ],
)
def test_control_options_are_checked_before_anything_starts(
    redis_url: str, extra: list[str], message: str
) -> None:
    result = CliRunner().invoke(cli, ["--redis-url", redis_url, "worker", APP, *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output
