"""The benchmarks' defaults measure what they claim to.

``bench/idle_cost.py`` counts an idle worker's commands over a span; its periodic steps come
every ``IDLE_BLOCK`` (a cluster's safety look, 120 s) and ``PRUNE_EVERY`` (a stream's
pruning, 300 s) seconds, so a default span shorter than the longest (it was 60 s) can miss
them and read low.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from blitzq.broker.redis.doorbell import IDLE_BLOCK
from blitzq.worker.pruning import PRUNE_EVERY

BENCH = Path(__file__).resolve().parents[2] / "bench"

pytestmark = pytest.mark.timeout(30)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved, loaded = list(sys.path), set(sys.modules)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved  # the script puts bench/ first for its own imports
        for name in set(sys.modules) - loaded:  # bench/bench.py, bench/cluster.py: not ours
            if str(getattr(sys.modules[name], "__file__", "")).startswith(str(BENCH)):
                del sys.modules[name]
    return module


def test_idle_cost_measures_a_whole_period_of_every_periodic_step_by_default() -> None:
    idle_cost = _load("idle_cost")
    args = idle_cost.parser().parse_args([])
    assert args.seconds >= max(PRUNE_EVERY, IDLE_BLOCK)
