"""Workflows: chains, groups and chords of task calls, advanced by the workers.

Build a workflow from signatures (``task.s(...)``, ``task.si(...)``, ``queue.sig(name, ...)``)
with :func:`chain` / ``|``, :func:`group` and :func:`chord`; start it with
``handle = await queue.apply(workflow)``; read its result with ``await handle.get()``. See
``docs/workflows.md`` and :mod:`blitzq.workflow.engine` for how it runs.

The names load on first use (PEP 562's module ``__getattr__``), as in :mod:`blitzq`: a worker
imports :mod:`.steps` (the finisher on every task) without the canvas, the handles and the
engine (issue 29: an idle worker's memory).
"""

from __future__ import annotations

from .._lazy import lazy_exports

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing
if TYPE_CHECKING:
    from .canvas import (
        Chain,
        Chord,
        Group,
        Node,
        Signature,
        WorkflowLimits,
        chain,
        chord,
        group,
        set_workflow_limits,
        workflow_limits,
    )
    from .handle import WorkflowExpired, WorkflowHandle, WorkflowNotFound

#: Each public name by the module that defines it (tests/unit/test_lazy_exports.py keeps this
#: and the ``TYPE_CHECKING`` imports above the same).
EXPORTS: dict[str, tuple[str, ...]] = {
    ".canvas": (
        "Chain",
        "Chord",
        "Group",
        "Node",
        "Signature",
        "WorkflowLimits",
        "chain",
        "chord",
        "group",
        "set_workflow_limits",
        "workflow_limits",
    ),
    ".handle": ("WorkflowExpired", "WorkflowHandle", "WorkflowNotFound"),
}
_MODULE_OF = {name: module for module, names in EXPORTS.items() for name in names}

__all__ = [
    "Chain",
    "Chord",
    "Group",
    "Node",
    "Signature",
    "WorkflowExpired",
    "WorkflowHandle",
    "WorkflowLimits",
    "WorkflowNotFound",
    "chain",
    "chord",
    "group",
    "set_workflow_limits",
    "workflow_limits",
]


# Hidden from type checkers, which would otherwise accept any name as blitzq.workflow.<name>.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF, globals(), __all__)
