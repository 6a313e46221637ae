"""A condition that lasts is logged once when it starts and once when it ends
(``blitzq/log_episodes.py``), not once per round or per handle."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TryAgainError

from blitzq import BrokerError
from blitzq.log_episodes import Episode

pytestmark = pytest.mark.timeout(10)

LOGGER = logging.getLogger("tests.episodes")


def _wrapped(cause: Exception) -> BrokerError:
    try:
        raise BrokerError(f"redis error: {cause}") from cause
    except BrokerError as exc:
        return exc


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.levelno > logging.DEBUG]


def test_a_failure_each_round_is_logged_once_and_its_end_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER.name)
    episode = Episode(LOGGER, "taking handed messages")
    error = _wrapped(TryAgainError("TRYAGAIN Multiple keys request during rehashing of slot"))
    for _ in range(50):  # fifty maintenance rounds while the slot migrates
        episode.failed(error)
    assert episode.count == 50
    episode.cleared()
    episode.cleared()  # further successes write nothing
    lines = _lines(caplog)
    assert len(lines) == 2, lines
    assert lines[0] == (logging.WARNING, f"taking handed messages: {error}")
    assert lines[1][0] == logging.INFO
    assert lines[1][1].startswith("taking handed messages: works again, after 50 failure(s)")
    assert episode.count == 0
    caplog.clear()
    episode.failed(error)  # a new episode is logged again
    assert _lines(caplog) == [(logging.WARNING, f"taking handed messages: {error}")]


def test_another_kind_of_failure_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER.name)
    episode = Episode(LOGGER, "promoter")
    moving = _wrapped(TryAgainError("TRYAGAIN"))
    lost = _wrapped(RedisConnectionError("Connection refused"))
    for error in (moving, moving, lost, lost, moving):
        episode.failed(error)
    assert [level for level, _ in _lines(caplog)] == [logging.WARNING] * 3
    assert episode.count == 1  # the last kind's count


def test_a_reported_cause_starts_at_the_level_given(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, LOGGER.name)
    episode = Episode(LOGGER, "maintenance")
    episode.failed(_wrapped(RedisConnectionError("gone")), logging.DEBUG)
    assert _lines(caplog) == []
    episode.cleared()
    assert [level for level, _ in _lines(caplog)] == [logging.INFO]


def test_a_lasting_condition_is_reminded_with_its_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER.name)
    episode = Episode(LOGGER, "maintenance", remind=0.0)  # every failure is due a reminder
    error = _wrapped(TryAgainError("TRYAGAIN"))
    for _ in range(3):
        episode.failed(error)
    lines = _lines(caplog)
    assert [m.split(",")[0] for _, m in lines[1:]] == ["maintenance: still failing"] * 2
    assert "3 times" in lines[-1][1]


def test_texts_are_one_kind_and_a_settle_time_keeps_the_episode(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Per-handle failures under load (each naming its channel) are one episode; a success
    between them does not end it before ``settle`` seconds without a failure."""
    caplog.set_level(logging.DEBUG, LOGGER.name)
    episode = Episode(LOGGER, "no confirmation of a subscription", settle=3600.0)
    for n in range(4000):
        episode.failed(f"{{ns}}:done:{n}")
        if n % 100 == 0:
            episode.cleared()  # some subscriptions confirmed in time meanwhile
    lines = _lines(caplog)
    assert lines == [(logging.WARNING, "no confirmation of a subscription: {ns}:done:0")]
    assert episode.count == 4000
    episode.settle = 0.0
    episode.cleared()
    assert _lines(caplog)[-1][1].startswith(
        "no confirmation of a subscription: works again, after 4000 failure(s)"
    )


def test_an_error_other_than_blitzqs_is_shown_with_its_type(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER.name)
    episode = Episode(LOGGER, "scheduler tick failed")
    episode.failed(KeyError("entry"))
    episode.failed(KeyError("entry"))
    assert _lines(caplog) == [(logging.WARNING, "scheduler tick failed: KeyError: 'entry'")]
