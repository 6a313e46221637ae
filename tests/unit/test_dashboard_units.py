"""The dashboard's pieces that need no server: rates from samples, page escaping, settings
checked at the edge, the loopback test of ``blitzq dashboard``."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("starlette", reason="the dashboard needs the 'dashboard' extra")

from blitzq import ConfigurationError, Queue
from blitzq._checks import is_loopback
from blitzq.dashboard import BasicAuth, create_app
from blitzq.dashboard.data import RETIRED, RateSampler
from blitzq.dashboard.pages import render

pytestmark = pytest.mark.timeout(10)


def test_rates_need_a_second_of_samples() -> None:
    sampler = RateSampler()
    first = sampler.add({"w1": (10, 1)}, {"q": 5}, now=100.0)
    assert first["completed_per_s"] is None
    assert sampler.add({"w1": (12, 1)}, {"q": 5}, now=100.5)["window"] is None
    rates = sampler.add({"w1": (30, 3)}, {"q": 1}, now=102.0)
    assert rates == {
        "window": 2.0,
        "completed": 20,
        "failed": 2,
        "completed_per_s": 10.0,
        "failed_per_s": 1.0,
        "depth_per_s": {"q": -2.0},
    }


def test_a_restarted_or_new_worker_counts_from_its_next_sample() -> None:
    sampler = RateSampler()
    sampler.add({"w1": (100, 0), "w2": (50, 0)}, {}, now=0.0)
    rates = sampler.add({"w1": (3, 0), "w2": (60, 0), "w3": (500, 0)}, {}, now=2.0)
    assert rates["completed_per_s"] == 5.0  # only w2: w1 restarted, w3 is new


def test_a_worker_started_after_the_oldest_sample_counts_all_it_did() -> None:
    """A recycled child may finish tasks before the first sample that shows it: they count,
    as long as it started after the oldest sample (its registration's started_at)."""
    sampler = RateSampler()
    sampler.add({"w1": (100, 0)}, {}, now=0.0)
    later = time.time() + 1.0
    rates = sampler.add({"w1": (110, 0), "w2": (40, 4)}, {}, now=2.0, started={"w2": later})
    assert (rates["completed"], rates["failed"]) == (50, 4)


def test_a_retired_workers_last_counts_add_up_with_what_was_seen() -> None:
    """A worker seen at 290 (1 failed) that exits at 300 (3 failed) hands (10, 2) to the
    retired counts: 300 and 3 in all."""
    sampler = RateSampler()
    sampler.add({"w1": (0, 0), RETIRED: (5, 0)}, {}, now=0.0)
    sampler.add({"w1": (290, 1), RETIRED: (5, 0)}, {}, now=1.0)
    rates = sampler.add({RETIRED: (15, 2)}, {}, now=2.0)
    assert (rates["completed"], rates["failed"]) == (300, 3)


def test_samples_older_than_the_window_are_dropped() -> None:
    sampler = RateSampler(window=10.0)
    for t in range(0, 40, 2):
        rates = sampler.add({"w": (t * 3, 0)}, {}, now=float(t))
    assert rates["completed_per_s"] == 3.0
    assert rates["window"] is not None
    assert rates["window"] <= 12.0


def test_a_sample_older_than_the_window_is_not_used() -> None:
    sampler = RateSampler(window=30.0)
    sampler.add({"w": (0, 0)}, {"q": 0}, now=1000.0)
    sparse = sampler.add({"w": (300, 0)}, {"q": 9}, now=1149.6)  # the previous one is stale
    assert sparse == {
        "window": None,
        "completed": None,
        "failed": None,
        "completed_per_s": None,
        "failed_per_s": None,
        "depth_per_s": {},
    }
    rates = sampler.add({"w": (310, 2)}, {"q": 7}, now=1151.6)
    assert rates == {
        "window": 2.0,
        "completed": 10,
        "failed": 2,
        "completed_per_s": 5.0,
        "failed_per_s": 1.0,
        "depth_per_s": {"q": -1.0},
    }
    exactly = sampler.add({"w": (400, 2)}, {"q": 7}, now=1179.6)  # 1149.6 is 30 s old: kept
    assert exactly["window"] == 30.0


def test_page_values_are_escaped() -> None:
    html = render(
        "tasks",
        root='/a"b',
        namespace="<ns>",
        refresh_ms=2000,
        task_id='"><script>alert(1)</script>',
    )
    assert "<script>alert" not in html
    assert 'value="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in html
    assert "&lt;ns&gt;" in html
    assert 'data-root="/a&quot;b"' in html


def test_settings_are_checked_at_the_edge() -> None:
    queue = Queue(redis_url="redis://127.0.0.1:1", namespace="unused")
    with pytest.raises(ConfigurationError):
        create_app(queue, refresh=0.0)
    with pytest.raises(ConfigurationError):
        create_app(queue, refresh=True)
    with pytest.raises(ConfigurationError):
        create_app(queue, basic_auth=("admin", ""))
    with pytest.raises(ConfigurationError):
        BasicAuth(create_app(queue), "", "secret")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.5", False),
        ("example.com", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
