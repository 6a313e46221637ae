"""The client side of a Queue: what producers, result readers and operators call.

A :class:`~blitzq.Queue` holds the configuration and the task registry, and is made of these
clients, whose methods it offers as its own (:mod:`blitzq.client.delegate`):

- :mod:`blitzq.client.publish` (:class:`Producer`): envelopes, enqueue, ``send``;
- :mod:`blitzq.client.reading` (:class:`Results`): results, records, cancel, progress;
- :mod:`blitzq.client.admin` (:class:`Admin`): dead letters, purges, stats;
- :mod:`blitzq.client.workflows` (:class:`Workflows`): starting and finding workflows;
- :mod:`blitzq.client.sync`: the sync API's engine (the :class:`Portal` and the
  :func:`blocking` helper that makes every ``*_sync`` twin).
"""

from .sync import Portal, blocking

__all__ = ["Portal", "blocking"]
