"""The dashboard's pages show task-supplied text with bidi overrides and control characters
escaped (``visible()`` in ``static/app.js``): an error message holding U+202E cannot reverse
what the dead-letter table or a traceback shows. Run with Node.js when it is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

APP_JS = Path(__file__).resolve().parents[2] / "src" / "blitzq" / "dashboard" / "static" / "app.js"


def run_visible(texts: list[str]) -> list[str]:
    """``visible(text)`` of each text, evaluated by node from app.js's own two lines."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed")
    source = APP_JS.read_text(encoding="utf-8")
    hidden = re.search(r"^\s*const HIDDEN = .*;$", source, re.M)
    visible = re.search(r"^\s*const visible = \(text\) =>\n.*;$", source, re.M)
    assert hidden, "app.js no longer defines HIDDEN as expected"
    assert visible, "app.js no longer defines visible() as expected"
    script = f"{hidden.group(0)}\n{visible.group(0)}\n"
    script += f"console.log(JSON.stringify({json.dumps(texts)}.map(visible)));"
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_bidi_overrides_and_controls_are_shown_escaped() -> None:
    shown = run_visible(
        ["evil \u202e lun", "nul \x00 bell \x07", "isolate \u2066x\u2069", "mark \u200f", "\x9b"]
    )
    assert shown == [
        "evil \\u202e lun",
        "nul \\u0000 bell \\u0007",
        "isolate \\u2066x\\u2069",
        "mark \\u200f",
        "\\u009b",
    ]


def test_ordinary_text_is_unchanged() -> None:
    texts = ["Traceback (most recent call last):\n  line 1\tx", "naïve 東京 ✓ emoji 🎉", "a→b"]
    assert run_visible(texts) == texts
