"""The dashboard's pieces that need no server: rates from samples, page escaping, settings
checked at the edge, the loopback test of ``blitzq dashboard``."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="the dashboard needs the 'dashboard' extra")

from blitzq import ConfigurationError, Queue
from blitzq._checks import is_loopback
from blitzq.dashboard import BasicAuth, create_app
from blitzq.dashboard.data import RateSampler
from blitzq.dashboard.pages import render

pytestmark = pytest.mark.timeout(10)


def test_rates_need_a_second_of_samples() -> None:
    sampler = RateSampler()
    first = sampler.add((10, 1), {"q": 5}, now=100.0)
    assert first["completed_per_s"] is None
    assert sampler.add((12, 1), {"q": 5}, now=100.5)["window"] is None
    rates = sampler.add((30, 3), {"q": 1}, now=102.0)
    assert rates == {
        "window": 2.0,
        "completed": 20,
        "failed": 2,
        "completed_per_s": 10.0,
        "failed_per_s": 1.0,
        "depth_per_s": {"q": -2.0},
    }


def test_totals_that_went_down_count_from_their_new_value() -> None:
    """The namespace's counters deleted by hand between two samples: the later increments
    count, the drop does not make a negative rate."""
    sampler = RateSampler()
    sampler.add((100, 5), {}, now=0.0)
    sampler.add((110, 6), {}, now=1.0)
    rates = sampler.add((4, 1), {}, now=2.0)
    assert (rates["completed"], rates["failed"]) == (14, 2)


def test_samples_older_than_the_window_are_dropped() -> None:
    sampler = RateSampler(window=10.0)
    for t in range(0, 40, 2):
        rates = sampler.add((t * 3, 0), {}, now=float(t))
    assert rates["completed_per_s"] == 3.0
    assert rates["window"] is not None
    assert rates["window"] <= 12.0


def test_a_sample_older_than_the_window_is_not_used() -> None:
    sampler = RateSampler(window=30.0)
    sampler.add((0, 0), {"q": 0}, now=1000.0)
    sparse = sampler.add((300, 0), {"q": 9}, now=1149.6)  # the previous one is stale
    assert sparse == {
        "window": None,
        "completed": None,
        "failed": None,
        "completed_per_s": None,
        "failed_per_s": None,
        "depth_per_s": {},
    }
    rates = sampler.add((310, 2), {"q": 7}, now=1151.6)
    assert rates == {
        "window": 2.0,
        "completed": 10,
        "failed": 2,
        "completed_per_s": 5.0,
        "failed_per_s": 1.0,
        "depth_per_s": {"q": -1.0},
    }
    exactly = sampler.add((400, 2), {"q": 7}, now=1179.6)  # 1149.6 is 30 s old: kept
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


def test_the_queues_page_says_what_waiting_counts_when_not_tasks() -> None:
    """On RabbitMQ (``Broker.count_note``) the queues page says a ready pack counts once;
    on Redis (no note) it says nothing of it."""
    plain = render("queues", root="", namespace="ns", refresh_ms=2000)
    assert 'id="count-note"' not in plain
    noted = render("queues", root="", namespace="ns", refresh_ms=2000, note="a <pack> once")
    assert '<p class="hint" id="count-note">a &lt;pack&gt; once.</p>' in noted


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
