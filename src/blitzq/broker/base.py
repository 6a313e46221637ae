"""Import path kept for compatibility: the broker contract now lives in two seams.

See :mod:`blitzq.broker` (the :class:`Broker` facade), :mod:`blitzq.broker.transport` and
:mod:`blitzq.broker.state`, and :mod:`blitzq.broker.effects` for completion effects.
"""

from __future__ import annotations

from . import Broker
from .state import Completion, DeadLetterFields, Scheduled
from .transport import Delivery, Guarantee

__all__ = ["Broker", "Completion", "DeadLetterFields", "Delivery", "Guarantee", "Scheduled"]
