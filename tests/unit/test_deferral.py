"""Deferral of a start check that meets an outage (blitzq.worker.deferral): the delays, what
counts as an outage, the options' checks (Worker and CLI), and the envelope's count."""

from __future__ import annotations

import random

import msgspec
import pytest
import redis.exceptions
from click.testing import CliRunner

from blitzq import BrokerError, ConfigurationError, Queue, Worker
from blitzq.broker.redis.client import broker_error
from blitzq.cli import cli
from blitzq.cli._worker_options import deferral_argv
from blitzq.serialization import Envelope, decode_envelope, encode_envelope
from blitzq.worker.deferral import JITTER, OutageBackoff, is_outage

pytestmark = pytest.mark.timeout(20)


class FixedDraw(random.Random):
    """A random source whose ``uniform(a, b)`` always returns ``a`` (``low``) or ``b``."""

    def __init__(self, high: bool) -> None:
        super().__init__(0)
        self.high = high

    def uniform(self, a: float, b: float) -> float:
        return b if self.high else a


def test_delays_double_from_the_base_up_to_the_maximum() -> None:
    backoff = OutageBackoff(1.0, 60.0)
    low, high = FixedDraw(False), FixedDraw(True)
    assert [backoff.delay(n, low) for n in range(1, 9)] == [
        0.8,
        1.6,
        3.2,
        6.4,
        12.8,
        25.6,
        48.0,
        48.0,
    ]
    assert [backoff.delay(n, high) for n in range(1, 9)] == [
        1.2,
        2.4,
        4.8,
        9.6,
        19.2,
        38.4,
        60.0,
        60.0,
    ]
    assert backoff.delay(10_000, high) == 60.0  # no overflow, the maximum applies
    rng = random.Random(7)
    for n in range(1, 12):
        nominal = min(60.0, 2.0 ** (n - 1))
        assert nominal * (1 - JITTER) <= backoff.delay(n, rng) <= min(60.0, nominal * 1.2)


def test_defaults_are_one_second_to_a_minute_and_a_ten_second_check() -> None:
    assert OutageBackoff() == OutageBackoff(1.0, 60.0, 10.0)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((0, 60, 10), "defer_base_delay"),
        ((1, float("nan"), 10), "defer_max_delay"),
        ((1, 60, -1), "start_check_timeout"),
        ((True, 60, 10), "defer_base_delay"),
        ((5, 1, 10), "defer_max_delay (1 s) must be >= defer_base_delay (5 s)"),
        ((1, 60, float("inf")), "start_check_timeout"),
    ],
)
def test_bad_settings_are_configuration_errors(
    args: tuple[float, float, float], named: str
) -> None:
    with pytest.raises(ConfigurationError, match=named.replace("(", r"\(").replace(")", r"\)")):
        OutageBackoff.checked(*args)
    base, ceiling, timeout = args
    with pytest.raises(ConfigurationError):
        Worker(
            Queue(redis_url="redis://127.0.0.1:1/0"),
            defer_base_delay=base,
            defer_max_delay=ceiling,
            start_check_timeout=timeout,
        )


def test_worker_takes_the_settings() -> None:
    worker = Worker(
        Queue(redis_url="redis://127.0.0.1:1/0"),
        defer_base_delay=0.5,
        defer_max_delay=5,
        start_check_timeout=2,
    )
    assert worker.outage_backoff == OutageBackoff(0.5, 5.0, 2.0)


@pytest.mark.parametrize(
    ("exc", "outage"),
    [
        (broker_error(redis.exceptions.ConnectionError("refused")), True),
        (broker_error(redis.exceptions.TimeoutError("read")), True),
        (broker_error(ConnectionRefusedError(111, "refused")), True),
        (broker_error(redis.exceptions.ResponseError("WRONGTYPE Operation")), False),
        (broker_error(redis.exceptions.NoPermissionError("NOPERM")), False),
        (BrokerError("gone", transient=True), True),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (ValueError("a bug in a check"), False),
        (KeyError("x"), False),
    ],
)
def test_what_counts_as_an_outage(exc: BaseException, outage: bool) -> None:
    assert is_outage(exc) is outage


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--defer-base-delay", "0"], "--defer-base-delay"),
        (["--defer-max-delay", "nan"], "--defer-max-delay"),
        (["--start-check-timeout", "-1"], "--start-check-timeout"),
        (["--defer-base-delay", "5", "--defer-max-delay", "1"], "defer_max_delay"),
    ],
)
def test_cli_refuses_bad_deferral_options_with_exit_2(args: list[str], option: str) -> None:
    # No server listens on port 1: the options are refused before anything connects.
    result = CliRunner().invoke(
        cli, ["--redis-url", "redis://127.0.0.1:1/0", "worker", "no.such:queue", *args]
    )
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert "Traceback" not in result.output


def test_the_count_travels_in_the_envelope_and_costs_nothing_when_unset() -> None:
    plain = Envelope("id1", "t", "q", [1], {}, 1, 1.0, 1.0)
    data = encode_envelope(plain, 1 << 20)
    deferred = Envelope("id1", "t", "q", [1], {}, 1, 1.0, 1.0, deferrals=3)
    again = decode_envelope(encode_envelope(deferred, 1 << 20))
    assert again.deferrals == 3
    assert again.attempt == 1
    assert decode_envelope(data).deferrals is None
    assert len(msgspec.msgpack.decode(data)) == 7  # no trailing field, no enqueued_at
    assert len(msgspec.msgpack.decode(encode_envelope(deferred, 1 << 20))) == 16


def test_cli_options_from_the_environment_and_to_supervised_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def parsed(*args: str) -> dict[str, object]:
        root = cli.make_context("blitzq", ["worker", *args])
        sub = cli.commands["worker"].make_context("worker", list(args), parent=root)
        return dict(sub.params)

    defaults = parsed("app:queue")
    assert (
        defaults["defer_base_delay"],
        defaults["defer_max_delay"],
        defaults["start_check_timeout"],
    ) == (1.0, 60.0, 10.0)
    monkeypatch.setenv("BLITZQ_WORKER_DEFER_MAX_DELAY", "30")  # click's automatic variable
    assert parsed("app:queue")["defer_max_delay"] == 30.0
    # What a supervisor passes to each worker process parses back to the same values.
    again = parsed("app:queue", *deferral_argv(0.25, 7.5, 2.0))
    assert (
        again["defer_base_delay"],
        again["defer_max_delay"],
        again["start_check_timeout"],
    ) == (0.25, 7.5, 2.0)


def test_a_supervisor_passes_the_deferral_options_to_its_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from blitzq.worker import launch

    seen: list[list[str]] = []

    def supervise(argv: list[str], *args: object, **kwargs: object) -> int:
        seen.append(list(argv))
        return 0

    monkeypatch.setattr(launch, "supervise", supervise)
    options = ["--defer-base-delay", "0.25", "--defer-max-delay", "7.5"]
    # The supervisor checks, without importing it, that the app's top-level module exists.
    app = "tests.app:queue"
    result = CliRunner().invoke(
        cli,
        ["--redis-url", "redis://127.0.0.1:1/0", "worker", app, "--workers", "2", *options],
    )
    assert result.exit_code == 0, result.output
    (argv,) = seen
    given = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--defer")}
    assert given == {"--defer-base-delay": "0.25", "--defer-max-delay": "7.5"}
    assert argv[argv.index("--start-check-timeout") + 1] == "10.0"
