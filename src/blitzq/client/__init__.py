"""The client side of a Queue: what producers and result readers call.

So far it holds the sync API's engine (:mod:`blitzq.client.sync`: the :class:`Portal` and the
:func:`blocking` helper that makes every ``*_sync`` twin).
"""

from .sync import Portal, blocking

__all__ = ["Portal", "blocking"]
