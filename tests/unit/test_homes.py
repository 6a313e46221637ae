"""A task's home on the spread layout (``broker/redis/homes.py``), without a server: which ids
are homed, and that every name of a homed id's own keys is the one the Lua scripts build
with the queue's tag as their prefix (so Python and Lua agree on where a record lives)."""

from __future__ import annotations

import pytest

from blitzq.broker.redis.homes import HomedKeys, home_queue, homed_id
from blitzq.broker.redis.keys import Keys
from blitzq.broker.redis.spread import SpreadKeys

pytestmark = pytest.mark.timeout(10)


def test_a_generated_id_names_the_base_queue_of_its_physical_queue() -> None:
    task_id = homed_id("orders:high")
    random, dot, queue = task_id.partition(".")
    assert (len(random), dot, queue) == (32, ".", "orders")
    assert int(random, 16) >= 0
    assert home_queue(task_id) == "orders"
    assert homed_id("orders") != homed_id("orders")


@pytest.mark.parametrize(
    "task_id",
    ["order-17", "a" * 32, "A" * 32 + ".q", "g" * 32 + ".q", "a" * 32 + "@q", "a" * 31 + ".q"],
)
def test_other_ids_are_unhomed(task_id: str) -> None:
    assert home_queue(task_id) is None
    keys = HomedKeys("ns")
    assert keys.home(task_id) == "{ns}:"
    assert keys.record(task_id) == Keys("ns").record(task_id)


def test_a_homed_ids_own_keys_are_under_its_queues_tag_as_the_scripts_build_them() -> None:
    keys = HomedKeys("ns")
    task_id = homed_id("mail:low")
    home = keys.home(task_id)
    assert home == SpreadKeys("ns").queue_tag("mail") == keys.queue_home("mail:high")
    scripts = keys.home_keys(home)  # what complete.lua builds with that prefix
    assert scripts.prefix == home
    for name in ("record", "done_channel", "progress", "progress_channel", "waiter"):
        assert getattr(keys, name)(task_id) == getattr(scripts, name)(task_id), name
    assert keys.dead_letter(task_id) == Keys("ns").dead_letter(task_id)  # namespace-wide
    assert keys.unique_owner(task_id) == Keys("ns").unique_owner(task_id)
