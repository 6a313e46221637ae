"""Old import path of :mod:`blitzq.extensions.middleware` (``from blitzq.middleware import
Middleware`` keeps working)."""

from .extensions.middleware import *  # noqa: F403
from .extensions.middleware import __all__ as __all__
