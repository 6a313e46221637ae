"""Old import path of the extension hook types (``from blitzq.hooks import Outgoing`` keeps
working); they live in :mod:`blitzq.extensions.middleware`."""

from .extensions.middleware import (
    EnqueueFilter,
    EnqueueObserver,
    Finisher,
    Outgoing,
    StartCheck,
)

__all__ = ["EnqueueFilter", "EnqueueObserver", "Finisher", "Outgoing", "StartCheck"]
