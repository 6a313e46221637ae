"""Workflows: chains, groups and chords of task calls, advanced by the workers.

Build a workflow from signatures (``task.s(...)``, ``task.si(...)``, ``queue.sig(name, ...)``)
with :func:`chain` / ``|``, :func:`group` and :func:`chord`; start it with
``handle = await queue.apply(workflow)``; read its result with ``await handle.get()``. See
``docs/workflows.md`` and :mod:`blitzq.workflow.engine` for how it runs.
"""

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
