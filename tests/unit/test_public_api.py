"""Snapshot of blitzq's public API: the net that keeps the issue-9 restructuring behaviour-free.

What is frozen (docs/architecture.md, "Tests"; plan for issue 9, section 4):

- the names of ``blitzq.__all__``;
- for Queue, Task, BoundTask, TaskHandle, WorkflowHandle and Worker: every public member with its
  kind (method, async method, async generator method, property, attribute) and, for callables,
  the parameter names, kinds (``/``, ``*``, ``*args``, ``**kwargs`` markers) and default values
  (annotations are left out: moving a type between modules is not an API change);
  ``__init__`` too for the two classes users construct (Queue, Worker);
- the instance attributes of a Queue and of a Task;
- the keyword options ``Queue.task`` and ``Task.options`` accept, with their defaults, and that
  each is still accepted when passed explicitly (so the check survives options moving behind a
  typed ``**options``);
- that every ``*_sync`` method has an async partner with the same parameters;
- that the import paths that docs, examples, bench and the plan name still import.

The snapshot lives beside this file in ``public_api_snapshot.json``. When the API changes ON
PURPOSE (a new option, a new exception in ``__all__`` ...), regenerate it with one command from
the repository root and commit the reviewed JSON diff with the change:

    PYTHONPATH=src python tests/unit/test_public_api.py --update

A mismatch fails with a diff naming each member and parameter that was added, removed or changed.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import blitzq
from blitzq.exceptions import ConfigurationError

SNAPSHOT_PATH = Path(__file__).with_name("public_api_snapshot.json")
UPDATE_COMMAND = "PYTHONPATH=src python tests/unit/test_public_api.py --update"

#: Classes whose public members are snapshotted.
CLASSES: dict[str, type[Any]] = {
    "Queue": blitzq.Queue,
    "Task": blitzq.Task,
    "BoundTask": blitzq.BoundTask,
    "TaskHandle": blitzq.TaskHandle,
    "WorkflowHandle": blitzq.WorkflowHandle,
    "Worker": blitzq.Worker,
}
#: Classes users construct themselves, so their ``__init__`` parameters are public too (the
#: others are made by the library: ``@queue.task``, ``Task.options``, ``enqueue``, ``apply``).
CONSTRUCTED = frozenset({"Queue", "Worker"})

#: ``from MODULE import NAME`` forms that must keep working. From the plan (section 4, "Also
#: unchanged") and from what docs/, examples/ and bench/ import; ``blitzq.cli:main`` is the
#: console script in pyproject.toml. Edit this list by hand, deliberately.
IMPORT_PATHS: tuple[str, ...] = (
    "blitzq.broker.base:Broker",
    "blitzq.broker.base:Completion",
    "blitzq.broker.base:Delivery",
    "blitzq.broker.base:DeadLetterFields",
    "blitzq.broker.base:Guarantee",
    "blitzq.broker.redis:ReliableRedisBroker",
    "blitzq.broker.redis:FastRedisBroker",
    "blitzq.broker.redis:embedded",
    "blitzq.broker.redis:keys",
    "blitzq.broker.redis.keys:GROUP",
    "blitzq.broker.redis.keys:Keys",
    "blitzq:middleware",
    "blitzq:signals",
    "blitzq.middleware:Middleware",
    "blitzq.supervisor:RestartBudget",
    "blitzq.worker:executors",
    "blitzq.scheduler:Scheduler",
    "blitzq.schedules:Cron",
    "blitzq.schedules:Every",
    "blitzq.limits:COMPLETION_BATCH_ITEMS",
    "blitzq.integrations.asgi:lifespan",
    "blitzq.integrations.asgi:BlitzQLifespan",
    "blitzq.integrations.django:enqueue_on_commit",
    "blitzq.integrations.django:BlitzqTaskBackend",
    "blitzq.integrations.django_tasks:BlitzqTaskBackend",
    "blitzq.integrations.flask:get_queue",
    "blitzq.integrations.flask:init_app",
    "blitzq.cli:main",
)


# ------------------------------------------------------------------- describing the live API
def _sample(x: int) -> int:
    """A plain function to register as a task (module level, so any executor accepts it)."""
    return x


def _memory_queue() -> blitzq.Queue:
    """A Queue that touches no server: ``memory://`` is resolved lazily, and nothing here
    enqueues."""
    return blitzq.Queue(redis_url="memory://public-api-snapshot", namespace="api")


def describe_parameters(fn: Callable[..., Any]) -> list[str]:
    """The parameters of ``fn`` as the signature text shows them, annotations removed, one
    string each: ``"timeout=None"``, ``"*args"``, ``"**kwargs"``, with the ``"/"`` and ``"*"``
    markers where the kinds change. So names, kinds and defaults (``repr``) are all visible.

    Raises:
        ValueError: a default whose ``repr`` holds a memory address (unstable between runs);
            give that default a stable ``__repr__``.
    """
    signature = inspect.signature(fn)
    bare = signature.replace(
        parameters=[
            p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()
        ],
        return_annotation=inspect.Signature.empty,
    )
    parts: list[str] = []
    kinds = [p.kind for p in bare.parameters.values()]
    for i, param in enumerate(bare.parameters.values()):
        # The "/" and "*" markers, as inspect.Signature.__str__ places them.
        if i > 0 and kinds[i - 1] == inspect.Parameter.POSITIONAL_ONLY != param.kind:
            parts.append("/")
        if param.kind == inspect.Parameter.KEYWORD_ONLY and (
            i == 0
            or kinds[i - 1]
            not in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.VAR_POSITIONAL)
        ):
            parts.append("*")
        text = str(param)
        if " at 0x" in text:
            raise ValueError(f"{fn.__qualname__}: default {text!r} has no stable repr")
        parts.append(text)
    if kinds and kinds[-1] == inspect.Parameter.POSITIONAL_ONLY:
        parts.append("/")
    assert f"({', '.join(parts)})" == str(bare), (parts, str(bare))  # same text as inspect's
    return parts


def describe_member(cls: type[Any], name: str) -> dict[str, Any]:
    """Kind (and parameters, for callables) of the public member ``name`` of ``cls``."""
    raw = inspect.getattr_static(cls, name)
    if isinstance(raw, property):
        return {"kind": "property"}
    if isinstance(raw, staticmethod | classmethod):
        kind = type(raw).__name__
        return {"kind": kind, "params": describe_parameters(getattr(cls, name))}
    if inspect.isfunction(raw):
        if inspect.isasyncgenfunction(raw):
            kind = "async generator method"
        elif inspect.iscoroutinefunction(raw):
            kind = "async method"
        else:
            kind = "method"
        return {"kind": kind, "params": describe_parameters(raw)}
    if inspect.isclass(raw):
        return {"kind": "class"}
    return {"kind": "attribute"}  # class-level values and __slots__ members


def public_members(cls: type[Any], with_init: bool) -> dict[str, dict[str, Any]]:
    """Every public member of ``cls`` (inherited ones included), described."""
    names = [n for n in dir(cls) if not n.startswith("_")]
    if with_init:
        names.append("__init__")
    return {name: describe_member(cls, name) for name in sorted(names)}


def instance_attributes(obj: object) -> list[str]:
    """Public names set on the instance itself (``vars``), sorted."""
    return sorted(n for n in vars(obj) if not n.startswith("_"))


def keyword_options(fn: Callable[..., Any]) -> dict[str, str]:
    """The keyword-only parameters of ``fn`` with the ``repr`` of their defaults.

    If the options ever move behind a typed ``**options``, read them from the new options type
    here so that the snapshot keeps the same shape.
    """
    return {
        p.name: repr(p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.kind == inspect.Parameter.KEYWORD_ONLY
    }


def current_api() -> dict[str, Any]:
    """The live public API in the snapshot's shape (plain JSON data)."""
    queue = _memory_queue()
    task = queue.task(_sample)
    return {
        "blitzq.__all__": sorted(blitzq.__all__),
        "classes": {
            name: public_members(cls, name in CONSTRUCTED) for name, cls in CLASSES.items()
        },
        "instance_attributes": {
            "Queue": instance_attributes(queue),
            "Task": instance_attributes(task),
        },
        "options": {
            "Queue.task": keyword_options(blitzq.Queue.task),
            "Task.options": keyword_options(blitzq.Task.options),
        },
    }


def render(value: Any, indent: str = "") -> str:
    """JSON text of the snapshot: sorted keys, 2-space indent, and a list that fits on one
    line (a short parameter list) written on one line, so the file reads like signatures."""
    if isinstance(value, dict) and value:
        inner = indent + "  "
        items = [f"{inner}{json.dumps(key)}: {render(value[key], inner)}" for key in sorted(value)]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    if isinstance(value, list) and value:
        flat = json.dumps(value)
        if len(indent) + len(flat) <= 96 and all(not isinstance(v, dict | list) for v in value):
            return flat
        inner = indent + "  "
        return "[\n" + ",\n".join(inner + render(v, inner) for v in value) + f"\n{indent}]"
    return json.dumps(value)


def write_snapshot(path: Path = SNAPSHOT_PATH) -> None:
    """(Re)write the snapshot from the live API; run through ``--update`` (see the module
    docstring), then review ``git diff`` before committing it."""
    path.write_text(render(current_api()) + "\n")


def load_snapshot() -> dict[str, Any]:
    """The stored snapshot.

    Raises:
        pytest.fail: it is missing (regenerate it with the update command).
    """
    if not SNAPSHOT_PATH.exists():
        pytest.fail(f"{SNAPSHOT_PATH.name} is missing; create it with: {UPDATE_COMMAND}")
    data: dict[str, Any] = json.loads(SNAPSHOT_PATH.read_text())
    return data


# ------------------------------------------------------------------------------ the diff
def _list_diff(where: str, old: list[Any], new: list[Any]) -> list[str]:
    lines: list[str] = []
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "delete":
            lines.append(f"{where}: removed {', '.join(map(str, old[a0:a1]))}")
        elif tag == "insert":
            lines.append(f"{where}: added {', '.join(map(str, new[b0:b1]))}")
        elif tag == "replace":
            lines.append(
                f"{where}: changed {', '.join(map(str, old[a0:a1]))}"
                f" -> {', '.join(map(str, new[b0:b1]))}"
            )
    return lines


def _describe(value: Any) -> str:
    if isinstance(value, dict) and "kind" in value:
        params = value.get("params")
        return str(value["kind"]) + (f" ({', '.join(params)})" if params is not None else "")
    return json.dumps(value)


def api_diff(old: Any, new: Any, where: str) -> list[str]:
    """Human-readable differences between the snapshot ``old`` and the live ``new``, one line
    each, naming the member or parameter (``Queue.get_result.params: removed timeout=None``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        lines: list[str] = []
        for key in sorted(old.keys() - new.keys()):
            lines.append(f"{where}.{key}: removed (was {_describe(old[key])})")
        for key in sorted(new.keys() - old.keys()):
            lines.append(f"{where}.{key}: added ({_describe(new[key])})")
        for key in sorted(old.keys() & new.keys()):
            lines.extend(api_diff(old[key], new[key], f"{where}.{key}"))
        return lines
    if isinstance(old, list) and isinstance(new, list):
        lines = _list_diff(where, old, new)
        if lines and where.endswith(".params"):
            lines.append(f"    was ({', '.join(old)})")
            lines.append(f"    now ({', '.join(new)})")
        return lines
    if old != new:
        return [f"{where}: changed {json.dumps(old)} -> {json.dumps(new)}"]
    return []


def assert_unchanged(section: str, old: Any, new: Any) -> None:
    """Fail with the diff when the live API differs from the snapshot."""
    lines = api_diff(old, new, section)
    if lines:
        pytest.fail(
            "The public API differs from tests/unit/public_api_snapshot.json"
            " (added/removed/changed: from the snapshot to the code as it is now):\n  "
            + "\n  ".join(lines)
            + "\n\nIf the restructuring changed this by accident, restore the API. If the change"
            f" is intended (a new option, exception, method ...), regenerate the snapshot:\n"
            f"    {UPDATE_COMMAND}\nthen review `git diff` of the JSON and commit it with the"
            " change.",
            pytrace=False,
        )


# ------------------------------------------------------------------------------- the tests
def test_all_names() -> None:
    section = "blitzq.__all__"
    assert_unchanged(section, load_snapshot()[section], current_api()[section])
    for name in blitzq.__all__:
        assert hasattr(blitzq, name), f"blitzq.__all__ lists {name!r}, which blitzq lacks"


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_class_members(name: str) -> None:
    snapshot = load_snapshot()["classes"]
    assert name in snapshot, f"no snapshot for {name}; run: {UPDATE_COMMAND}"
    assert_unchanged(name, snapshot[name], current_api()["classes"][name])


def test_instance_attributes() -> None:
    section = "instance_attributes"
    assert_unchanged(section, load_snapshot()[section], current_api()[section])


def test_option_names_and_defaults() -> None:
    assert_unchanged("options", load_snapshot()["options"], current_api()["options"])


def _literal(default_repr: str) -> Any:
    try:
        return ast.literal_eval(default_repr)
    except (ValueError, SyntaxError):
        pytest.fail(f"default {default_repr} is not a literal; give the option a literal default")


def test_queue_task_accepts_each_option() -> None:
    """Each snapshotted option of ``Queue.task`` is accepted when passed explicitly with its
    default, through ``Queue.task`` and through ``Queue.periodic``'s ``**task_options``."""
    queue = _memory_queue()
    for option, default in load_snapshot()["options"]["Queue.task"].items():
        task = queue.task(**{option: _literal(default)})(_sample)
        assert task.fn is _sample, option
        if option not in ("name", "queue"):  # periodic takes these two itself
            queue.periodic(3600, name=f"every-hour-{option}", **{option: _literal(default)})(
                _sample
            )
    with pytest.raises((TypeError, ConfigurationError)):
        queue.task(no_such_option=1)(_sample)  # type: ignore[call-overload]


def test_task_options_accepts_each_option() -> None:
    """Each snapshotted option of ``Task.options`` is accepted by it and by
    ``BoundTask.options``; an unknown one is refused."""
    task = _memory_queue().task(_sample)
    options = load_snapshot()["options"]["Task.options"]
    for option, default in options.items():
        bound = task.options(**{option: _literal(default)})
        assert isinstance(bound, blitzq.BoundTask), option
        assert isinstance(bound.options(**{option: _literal(default)}), blitzq.BoundTask)
    with pytest.raises((TypeError, ConfigurationError)):
        task.options(no_such_option=1)  # type: ignore[call-arg]
    with pytest.raises((TypeError, ConfigurationError)):
        task.options().options(no_such_option=1)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_sync_twins_match_async(name: str) -> None:
    """Every ``x_sync`` is a plain method whose async partner ``x`` has the same parameters."""
    cls = CLASSES[name]
    members = public_members(cls, with_init=False)
    problems: list[str] = []
    for member, info in members.items():
        if not member.endswith("_sync"):
            continue
        partner = member.removesuffix("_sync")
        if partner not in members:
            problems.append(f"{name}.{member} has no async partner {partner}")
            continue
        if info["kind"] != "method":
            problems.append(f"{name}.{member} is a {info['kind']}, not a plain method")
        if members[partner]["kind"] != "async method":
            problems.append(f"{name}.{partner} is a {members[partner]['kind']}, not async")
        if info.get("params") != members[partner].get("params"):
            problems.append(
                f"{name}.{member}({', '.join(info.get('params', []))}) differs from "
                f"{name}.{partner}({', '.join(members[partner].get('params', []))})"
            )
    assert not problems, "\n".join(problems)


def test_queue_has_its_sync_twins() -> None:
    """The twins the snapshot lists are what users call; the count is a quick sanity check."""
    twins = [m for m in load_snapshot()["classes"]["Queue"] if m.endswith("_sync")]
    assert twins, "the snapshot lists no Queue *_sync twins"
    assert all(hasattr(blitzq.Queue, m) for m in twins)


@pytest.mark.parametrize("path", IMPORT_PATHS)
def test_import_path(path: str) -> None:
    """``from MODULE import NAME`` still works (NAME may be an attribute or a submodule)."""
    module_name, _, name = path.partition(":")
    module = importlib.import_module(module_name)
    if not hasattr(module, name):
        importlib.import_module(f"{module_name}.{name}")  # a submodule, as `from` would load it


def test_snapshot_file_is_canonical() -> None:
    """The JSON is exactly what the update command writes (see :func:`render`), so a
    regenerated snapshot shows only real changes in ``git diff``."""
    text = SNAPSHOT_PATH.read_text()
    if text != render(json.loads(text)) + "\n":
        pytest.fail(f"hand-edited snapshot; regenerate it with: {UPDATE_COMMAND}", pytrace=False)


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {UPDATE_COMMAND}")
    write_snapshot()
    print(f"wrote {SNAPSHOT_PATH}; review it with: git diff {SNAPSHOT_PATH.name}")
