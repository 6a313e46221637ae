"""The structure's gate: module sizes, layering, completion-op names, the module map.

Reads the source as text and AST (stdlib ``ast``); imports nothing of blitzq but
:mod:`blitzq.broker` (for the contract's method names and the op registry), needs no server.

Each rule is one test that fails on any violation not listed in :data:`BROKEN_ON_MAIN`; each
entry there is a known violation on main, tested on its own and marked ``xfail`` with its
reason, so the rule stays whole and the entry turns into an XPASS once fixed (then delete it).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from blitzq.broker import Broker
from blitzq.broker.effects import COMPLETION_OPS
from tests.parsing import parse_source

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "blitzq"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

#: A review signal, not a wall: a module past it is split by concern (never by count, and
#: never by packing lines with ``# fmt: skip``).
MAX_LINES = 600

#: Modules still over MAX_LINES, with the most lines they may have until they are split by
#: concern. Delete an entry when its module is split.
OVER_MAX_LINES: dict[str, int] = {}

#: The re-export shims that keep users' old import paths working; nothing in src imports them.
SHIMS: dict[str, str] = {
    "blitzq.middleware": "blitzq.extensions.middleware",
    "blitzq.hooks": "blitzq.extensions.middleware",
    "blitzq.signals": "blitzq.extensions.signals",
    "blitzq.supervisor": "blitzq.worker",
    "blitzq.broker.base": "blitzq.broker",
    "blitzq._portal": "blitzq.client.sync",
    "blitzq.workflow.signature": "blitzq.workflow.canvas",
}

#: What the broker layer must not import: the layers above it.
ABOVE_BROKER = (
    "blitzq.client",
    "blitzq.worker",
    "blitzq.extensions",
    "blitzq.queue",
    "blitzq.task",
    "blitzq.scheduler",
)

#: Modules the docs' module map may not list yet, because another helper is adding them in
#: this round (path relative to src/blitzq). Delete an entry when its row lands.
NOT_IN_MAP_YET: set[str] = set()

#: Violations on main, each its own xfail test: (rule, violation) -> reason.
BROKEN_ON_MAIN: dict[tuple[str, str], str] = {}


# ------------------------------------------------------------------------------ reading src


def modules() -> list[Path]:
    """Every ``.py`` file under src/blitzq, sorted."""
    return sorted(PACKAGE.rglob("*.py"))


def relative(path: Path) -> str:
    """``path`` relative to src/blitzq, with ``/`` separators (``broker/redis/fast.py``)."""
    return path.relative_to(PACKAGE).as_posix()


def dotted(path: Path) -> str:
    """The module name of ``path`` (``blitzq.broker.redis``, ``blitzq.queue``)."""
    parts = ["blitzq", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@dataclass(frozen=True)
class Import:
    """One imported name: ``target`` is the module (``from m import n`` gives ``m`` and, when
    ``m.n`` is a module, also ``m.n``), ``line`` where, ``typing_only`` under TYPE_CHECKING."""

    target: str
    line: int
    typing_only: bool


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path) -> list[Import]:
    """Every import in ``path``, module level or inside functions, absolute names."""
    module = dotted(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.body:
                    visit_one(stmt, True)
                for stmt in child.orelse:
                    visit_one(stmt, typing_only)
            else:
                visit_one(child, typing_only)

    def visit_one(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(a.name, node.lineno, typing_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            found.append(Import(source, node.lineno, typing_only))
            found.extend(Import(f"{source}.{a.name}", node.lineno, typing_only) for a in node.names)
        else:
            visit(node, typing_only)

    visit(parse_source(path.read_text(encoding="utf-8")), False)
    return found


def module_imports(path: Path) -> dict[str, int]:
    """The modules of src/blitzq that ``path`` imports at module level (under ``if``, ``try``
    and ``if TYPE_CHECKING`` too, so type-only imports count), each with its first line.

    ``from package import module`` counts as an import of ``module`` alone; a name that is not
    a module counts as its module (``from blitzq.queue import Queue``: ``blitzq.queue``).
    Imports inside functions are left out: they run late, by design.
    """
    known = {dotted(p) for p in modules()}
    module = dotted(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: dict[str, int] = {}

    def add(target: str, line: int) -> None:
        while target not in known and "." in target:
            target = target.rpartition(".")[0]
        if target in known and target != module:
            found.setdefault(target, line)

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = parts[: len(parts) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                names = [f"{source}.{alias.name}" for alias in node.names]
                for target in names if all(n in known for n in names) else [source]:
                    add(target, node.lineno)
            elif isinstance(node, ast.If | ast.Try | ast.With):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(parse_source(path.read_text(encoding="utf-8")).body)
    return found


def import_cycles() -> list[list[str]]:
    """The circles of the module-level import graph of src/blitzq (type-only imports
    included): each strongly connected component of more than one module, sorted."""
    graph = {dotted(path): module_imports(path) for path in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(circles)


def under(name: str, prefix: str) -> bool:
    """Whether module ``name`` is ``prefix`` or inside it."""
    return name == prefix or name.startswith(prefix + ".")


def check(rule: str, violations: list[str]) -> None:
    """Fail on the violations of ``rule`` not known on main (:data:`BROKEN_ON_MAIN`)."""
    new = sorted({v for v in violations if (rule, v.split(" (")[0]) not in BROKEN_ON_MAIN})
    assert not new, f"{rule}: " + "; ".join(new)


def violations_of(rule: str) -> list[str]:
    """The violations of ``rule`` on the tree as it is (see the rule functions below)."""
    return RULES[rule]()


# ------------------------------------------------------------------------------- the rules


def _lines() -> list[str]:
    out = []
    for path in modules():
        name = relative(path)
        count = len(path.read_text(encoding="utf-8").splitlines())
        if count > OVER_MAX_LINES.get(name, MAX_LINES):
            out.append(f"{name} ({count} lines)")
    return out


def _edges(
    sources: str, forbidden: tuple[str, ...], *, runtime_only: bool = False
) -> Iterator[str]:
    """``importer -> target (line n)`` for every import from a module under ``sources`` of a
    module under one of ``forbidden`` (a shim counts as the module it re-exports)."""
    for path in modules():
        importer = dotted(path)
        if not under(importer, sources):
            continue
        for imp in imports(path):
            if runtime_only and imp.typing_only:
                continue
            target = next((s for s in SHIMS if under(imp.target, s)), imp.target)
            resolved = SHIMS.get(target, target)
            if any(under(t, f) for t in (target, resolved) for f in forbidden):
                shown = target if target in SHIMS else _module_of(imp.target)
                yield f"{importer} -> {shown} (line {imp.line})"


def _module_of(target: str) -> str:
    """``target`` cut to the module that exists (``blitzq.worker.execution.Job`` → its
    module)."""
    parts = target.split(".")
    while len(parts) > 1:
        base = PACKAGE.parent.joinpath(*parts)
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            break
        parts.pop()
    return ".".join(parts)


def _broker() -> list[str]:
    return sorted(set(_edges("blitzq.broker", ABOVE_BROKER)))


def _shims() -> list[str]:
    return sorted(set(_edges("blitzq", tuple(SHIMS))))


def _worker_shims() -> list[str]:
    return [v for v in _shims() if v.startswith("blitzq.worker")]


def _extensions() -> list[str]:
    # The runner was split into runner/admission/outcomes/execution/fetch: the extensions see
    # the worker only through WorkerContext and Job (extensions/middleware.py) and may name
    # worker types for type checking alone.
    return sorted(set(_edges("blitzq.extensions", ("blitzq.worker",), runtime_only=True)))


def _client() -> list[str]:
    return sorted(set(_edges("blitzq.client", ("blitzq.worker",))))


def _cycles() -> list[str]:
    out = []
    for circle in import_cycles():
        parts = [name.split(".") for name in circle]
        common = []
        for pieces in zip(*parts, strict=False):
            if len(set(pieces)) > 1:
                break
            common.append(pieces[0])
        area = ".".join(common) or "blitzq"
        out.append(f"{area} ({len(circle)} modules: {', '.join(circle)})")
    return out


def _contract_names() -> set[str]:
    # A method of the facade, or a callable attribute set at composition (``complete``: the
    # pairing's, typed ``CompleteFn``, see broker/pairing.py).
    return {
        name
        for cls in Broker.__mro__
        if cls.__module__.startswith("blitzq.broker")
        for name in (
            *vars(cls),
            *(
                name
                for name, kind in vars(cls).get("__annotations__", {}).items()
                if "Callable" in str(kind) or str(kind).endswith("Fn")
            ),
        )
        if not name.startswith("_")
    }


def _getattr() -> list[str]:
    names = _contract_names()
    out = []
    for path in modules():
        for node in ast.walk(parse_source(path.read_text(encoding="utf-8"))):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in {"getattr", "hasattr"}
                and len(node.args) >= 2
            ):
                continue
            name = node.args[1]
            literal = isinstance(name, ast.Constant) and name.value in names
            on_broker = not isinstance(name, ast.Constant) and "broker" in ast.unparse(node.args[0])
            if literal or on_broker:
                out.append(f"{relative(path)}:{node.lineno} {ast.unparse(node)}")
    return out


#: Op-name literals that mean something else, by file: (path, literal) -> what it is.
OTHER_MEANINGS: dict[tuple[str, str], str] = {
    ("__init__.py", "chord"): "the public function chord() in __all__",
    ("workflow/__init__.py", "chord"): "the public function chord() in __all__",
    ("broker/redis/records.py", "progress"): "watch_progress's event kind; progress.lua's name",
    ("client/reading.py", "progress"): "watch_progress's event kind",
    ("cli/inspect.py", "progress"): "the progress field of `blitzq inspect`'s JSON",
    ("dashboard/tasks.py", "progress"): "the progress field of the dashboard's task JSON",
    ("broker/redis/keys.py", "progress"): "the name of the progress key in keys.TABLE",
}


def _op_literals() -> list[str]:
    names = set(COMPLETION_OPS.values())
    out = []
    for path in modules():
        name = relative(path)
        if name == "broker/effects.py":
            continue
        tree = parse_source(path.read_text(encoding="utf-8"))
        scripts = {  # first argument of scripts.call("<script>", ...): a script's name
            id(node.args[0])
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "call"
            and node.args
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and node.value in names
                and id(node) not in scripts
                and (name, node.value) not in OTHER_MEANINGS
            ):
                out.append(f"{name}:{node.lineno} {node.value!r}")
    return out


def _runner_first() -> list[str]:
    """``worker/<module>.py:<function>`` for each module-level function under worker/ whose
    first parameter is annotated ``Runner``: a stage's code is a method of the object that
    owns the stage (``Admission``, ``Timeouts``, ``Ending``, ``Runner``...), not a free
    function taking the runner first."""
    out = []
    for path in modules():
        name = relative(path)
        if not name.startswith("worker/"):
            continue
        for node in parse_source(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.args.args:
                continue
            annotation = node.args.args[0].annotation
            if annotation is not None and ast.unparse(annotation).strip("'\"") == "Runner":
                out.append(f"{name}:{node.name}")
    return out


RULES = {
    "lines": _lines,
    "broker": _broker,
    "shims": _shims,
    "worker shims": _worker_shims,
    "extensions": _extensions,
    "client": _client,
    "cycles": _cycles,
    "getattr": _getattr,
    "op literals": _op_literals,
    "runner first": _runner_first,
}


# ------------------------------------------------------------------------------- the tests


def test_no_module_over_max_lines() -> None:
    """No module under src/blitzq is over MAX_LINES (600) lines (but those of OVER_MAX_LINES,
    capped): past it a module is split by the concerns it mixes."""
    check("lines", _lines())


def test_no_line_packing_to_stay_under_the_size() -> None:
    """No ``# fmt: skip`` in src/blitzq: a module is formatted as ruff formats it, and split by
    concern when it grows, never packed to look smaller. (One ``# fmt: off`` block is kept on
    purpose: broker/redis/keys.py's key table, aligned one key a line to be read as a table.)"""
    packed = [
        f"{relative(path)}:{number}"
        for path in modules()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "# fmt: skip" in line
    ]
    assert not packed, f"lines packed with # fmt: skip: {packed}"


def test_broker_imports_no_layer_above_it() -> None:
    """``blitzq.broker.*`` imports nothing from client, worker, extensions, queue, task or
    scheduler (directly or through a shim)."""
    check("broker", _broker())


def test_worker_imports_no_shim() -> None:
    """``blitzq.worker.*`` imports none of the re-export shims (middleware, signals,
    supervisor, broker.base, _portal)."""
    check("shims", _worker_shims())


def test_nothing_in_src_imports_a_shim() -> None:
    """The shims exist for users' old import paths: no module in src imports one."""
    check("shims", _shims())


def test_extensions_reach_the_worker_only_for_type_checking() -> None:
    """``blitzq.extensions.*`` imports ``blitzq.worker`` only under ``if TYPE_CHECKING``."""
    check("extensions", _extensions())


def test_client_does_not_import_the_worker() -> None:
    """``blitzq.client.*`` does not import ``blitzq.worker``."""
    check("client", _client())


def test_no_import_cycle() -> None:
    """The module-level import graph of src/blitzq has no circle, type-only imports
    (``if TYPE_CHECKING``) included: a layer names the one above it only through a protocol
    of its own or of a leaf module (:mod:`blitzq.seams`, :mod:`blitzq.client.context`)."""
    check("cycles", _cycles())


def test_import_cycles_sees_a_type_only_circle() -> None:
    """:func:`module_imports` counts an import under ``if TYPE_CHECKING`` and resolves
    ``from package import module`` to the module (the graph the cycle rule reads)."""
    queue = PACKAGE / "queue.py"
    assert "blitzq.registration" in module_imports(queue)
    assert "blitzq" not in module_imports(queue)  # ``from . import config``: config alone
    typed = module_imports(PACKAGE / "client" / "context.py")
    assert {"blitzq.task", "blitzq.handle", "blitzq.seams"} <= set(typed)


def test_no_getattr_for_a_contract_method() -> None:
    """No ``getattr``/``hasattr`` names a method of the broker contract (Transport,
    StateStore): a contract method is called, not probed; and none probes a broker by a
    computed name."""
    assert {"complete", "prune_consumers", "remember_queues"} <= _contract_names()
    check("getattr", _getattr())


def test_completion_op_names_only_in_the_registry() -> None:
    """No wire name of a completion effect (``COMPLETION_OPS``) is a string literal in src
    outside broker/effects.py (and the Lua): effects are typed values, encoded in one place."""
    check("op literals", _op_literals())


def test_no_worker_function_takes_the_runner_first() -> None:
    """No module-level function under worker/ takes the ``Runner`` as its first parameter: a
    stage of a delivery's run is a method of the object that owns it, so the path reads top to
    bottom (docs/architecture.md, "Life of a delivery")."""
    check("runner first", _runner_first())


@pytest.mark.parametrize(
    ("rule", "violation"),
    [
        pytest.param(rule, violation, marks=pytest.mark.xfail(reason=reason, strict=False))
        for (rule, violation), reason in BROKEN_ON_MAIN.items()
    ],
)
def test_broken_on_main(rule: str, violation: str) -> None:
    """One known violation of a rule: XFAIL while it stands, XPASS once fixed."""
    assert violation not in {v.split(" (")[0] for v in violations_of(rule)}


# --------------------------------------------------------------------------- the module map

_TOKEN = re.compile(r"`([^`\s]+)`")


def mapped_paths(text: str) -> set[str]:
    """The module paths (relative to src/blitzq) the Components table of ``text`` names.

    A path with a ``/`` counts as written (``client/publish.py``), as does a dotted name
    (``blitzq.middleware``: ``middleware.py``). A bare file name counts in the folder its row
    is about: in the first cell, the folder of the path just before it
    (``broker/redis/ephemeral.py``, ``server_proc.py``) or the top level (``cli/``,
    ``logconfig.py``); in the other cells, the folder the first cell starts with (``worker/``:
    ``fetch.py`` is ``worker/fetch.py``) or the top level. A folder counts for its
    ``__init__.py``.
    """
    found: set[str] = set()
    for row in text.splitlines():
        if not row.startswith("| `"):
            continue
        cells = row.split(" | ")
        first = _TOKEN.findall(cells[0])
        row_folder = first[0] if first[0].endswith("/") else ""
        folder = ""
        for cell, tokens in [(0, first), *((1, _TOKEN.findall(c)) for c in cells[1:])]:
            for token in tokens:
                if token.startswith("blitzq."):
                    found.update(_dotted_paths(token))
                elif token.endswith("/") and not token.startswith("lua"):
                    folder = ""
                    found.add(token + "__init__.py")
                elif token.endswith(".py") and "/" in token:
                    folder = token.rpartition("/")[0] + "/"
                    found.add(token)
                elif token.endswith(".py"):
                    found.add((folder if cell == 0 else row_folder) + token)
    return found


def _dotted_paths(name: str) -> set[str]:
    """The paths ``blitzq.a.b`` may be: ``a/b.py`` or ``a/b/__init__.py``."""
    base = "/".join(name.split(".")[1:])
    return {base + ".py", base + "/__init__.py"}


def test_module_map_names_every_module() -> None:
    """docs/architecture.md's Components table names every module under src/blitzq (but those
    of NOT_IN_MAP_YET, which other helpers are adding)."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    named = mapped_paths(text)
    missing = sorted(
        name
        for name in map(relative, modules())
        if name not in named and name not in NOT_IN_MAP_YET
    )
    assert not missing, f"not in docs/architecture.md's module map: {missing}"


# --------------------------------------------------------------------------- old import paths


def test_hooks_old_path_reexports_the_hook_types() -> None:
    """``blitzq.hooks`` (documented before issue 9) gives the types of
    :mod:`blitzq.extensions.middleware`."""
    import blitzq.extensions.middleware as middleware
    import blitzq.hooks as hooks

    for name in ("Outgoing", "StartCheck", "Finisher", "EnqueueFilter", "EnqueueObserver"):
        assert getattr(hooks, name) is getattr(middleware, name)


def test_removed_memory_broker_points_to_the_memory_url() -> None:
    """``blitzq.broker.memory`` is gone on purpose; its import says what replaces it."""
    with pytest.raises(ImportError, match=r"Queue\(redis_url='memory://name'\).*Valkey"):
        import blitzq.broker.memory  # noqa: F401
