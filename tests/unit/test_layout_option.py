"""The ``layout`` option of a broker URL is taken out without changing the rest of the URL."""

from __future__ import annotations

import pytest

from blitzq.broker.redis.cluster import split_layout


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        # A Unix socket URL has no host: urlunsplit wrote it back as "unix:/path", which
        # redis-py refuses (the embedded server's URL with ?layout=spread failed so).
        ("unix:///tmp/x.sock?layout=spread", ("unix:///tmp/x.sock", "spread")),
        ("unix:///tmp/x.sock?db=2&layout=slot", ("unix:///tmp/x.sock?db=2", "slot")),
        ("redis://h:1/0?layout=slot&timeout=3", ("redis://h:1/0?timeout=3", "slot")),
        ("redis://h:1/0?timeout=3", ("redis://h:1/0?timeout=3", None)),
        ("redis://h:1/0?playout=x", ("redis://h:1/0?playout=x", None)),
    ],
)
def test_split_layout_keeps_the_rest_of_the_url(url: str, expected: tuple[str, str | None]) -> None:
    assert split_layout(url) == expected


def test_an_unknown_layout_is_refused() -> None:
    with pytest.raises(ValueError, match="layout='diagonal' must be one of"):
        split_layout("redis://h:1/0?layout=diagonal")
