"""Old import path of :mod:`blitzq.extensions.signals` (``from blitzq.signals import Signal``
keeps working)."""

from .extensions.signals import *  # noqa: F403
from .extensions.signals import __all__ as __all__
