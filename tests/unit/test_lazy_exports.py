"""``import blitzq`` (and ``import blitzq.workflow``) is lazy: the public names load on first
use, and the three places that list them (the ``TYPE_CHECKING`` imports type checkers read,
:data:`blitzq.EXPORTS` the runtime reads, and ``__all__``) name the same things."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import blitzq
import blitzq.workflow
from tests.parsing import parse_source

pytestmark = pytest.mark.timeout(60)

INIT = Path(blitzq.__file__)


def type_checking_imports(init: Path = INIT) -> dict[str, str]:
    """Each name imported under ``if TYPE_CHECKING:`` in ``init`` (blitzq/__init__.py), by its
    module."""
    tree = parse_source(init.read_text())
    block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    )
    return {
        alias.name: "." * node.level + (node.module or "")
        for node in block.body
        if isinstance(node, ast.ImportFrom) and node.level
        for alias in node.names
    }


def test_the_three_lists_agree() -> None:
    runtime = {name: module for module, names in blitzq.EXPORTS.items() for name in names}
    assert type_checking_imports() == runtime
    assert sorted(blitzq.__all__) == sorted([*runtime, "__version__"])


@pytest.mark.parametrize("name", [n for n in blitzq.__all__ if n != "__version__"])
def test_every_public_name_resolves_to_its_definition(name: str) -> None:
    value = getattr(blitzq, name)
    module = type_checking_imports()[name]
    assert getattr(sys.modules["blitzq" + module], name) is value


def test_the_workflow_package_lists_agree() -> None:
    package = blitzq.workflow
    runtime = {name: module for module, names in package.EXPORTS.items() for name in names}
    assert type_checking_imports(Path(package.__file__)) == runtime
    assert sorted(package.__all__) == sorted(runtime)
    for name, module in runtime.items():
        assert getattr(sys.modules["blitzq.workflow" + module], name) is getattr(package, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        blitzq.Nope  # type: ignore[attr-defined]  # noqa: B018


def test_import_blitzq_loads_none_of_its_parts() -> None:
    """A fresh interpreter: ``import blitzq`` brings in no submodule but its lazy loader
    (``blitzq._lazy``), and no asyncio, redis or typing; ``from blitzq import Queue`` then
    does."""
    probe = (
        "import sys, blitzq\n"
        "heavy = ('asyncio', 'redis', 'typing', 'msgspec', 'croniter')\n"
        "print(sorted(m for m in sys.modules if m.startswith('blitzq.') or m in heavy))\n"
        "from blitzq import Queue\n"
        "print('blitzq.queue' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=50
    ).stdout.splitlines()
    assert out == ["['blitzq._lazy']", "True"]


def test_a_submodule_is_reachable_as_an_attribute() -> None:
    """``import blitzq; blitzq.testing.run_eagerly``-style access keeps working."""
    probe = "import blitzq\nprint(blitzq.testing.__name__, blitzq.worker.Worker.__name__)\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=50
    ).stdout.split()
    assert out == ["blitzq.testing", "Worker"]
