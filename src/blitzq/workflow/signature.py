"""Old import path of :class:`~blitzq.workflow.canvas.Signature` (it lives with the chains,
groups and chords it composes into, so the two import in one direction); kept for users'
imports.
"""

from .canvas import Signature

__all__ = ["Signature"]
