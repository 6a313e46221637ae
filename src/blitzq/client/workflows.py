"""Workflows from a :class:`~blitzq.Queue`: steps by task name, starting a workflow, and
re-attaching to one (the engine itself is :mod:`blitzq.workflow`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..extensions.registry import Extensions
    from ..workflow.canvas import Node, Signature
    from ..workflow.handle import WorkflowHandle
    from .context import QueueContext


class Workflows:
    """Starts and finds the workflows of one Queue.

    Args:
        queue: the Queue whose tasks the workflows run.
        extensions: its middleware registry (the apply hooks run around a start).
        known_queues: the physical queues its producer registered with the broker (shared
            with it, so a start registers each new one once).
    """

    def __init__(self, queue: QueueContext, extensions: Extensions, known_queues: set[str]) -> None:
        self.queue = queue
        self.extensions = extensions
        self.known_queues = known_queues

    def sig(self, name: str, /, *args: Any, **kwargs: Any) -> Signature:
        """A workflow step calling the task registered as ``name`` (it need not be imported
        here); see :mod:`blitzq.workflow`.

        Raises:
            SerializationError: an argument is not plain data.
        """
        from ..workflow.canvas import Signature

        return Signature(name, args, kwargs)

    async def apply(self, workflow: Node) -> WorkflowHandle:
        """Start a workflow (a chain, group, chord or signature); returns at once.

        Its state and first steps are written in one atomic round-trip (steps past the
        first 1000 in further calls); workers advance it.

        Raises:
            ConfigurationError: not a workflow.
            SerializationError, MessageTooLarge: a step's message cannot be built.
            BrokerError: the broker could not be reached.
        """
        from ..workflow.engine import apply_workflow

        return await apply_workflow(self.queue, workflow, self.extensions, self.known_queues)

    def workflow(self, workflow_id: str) -> WorkflowHandle:
        """A handle to the workflow ``workflow_id`` (re-attach from any process).

        Raises:
            SerializationError, ConfigurationError: ``workflow_id`` is not valid Unicode
                text, or not a ``str`` (see :func:`~blitzq.serialization.lookup_key`).
        """
        from ..serialization import lookup_key
        from ..workflow.handle import WorkflowHandle

        return WorkflowHandle(self.queue, lookup_key("workflow id", workflow_id))


__all__ = ["Workflows"]
