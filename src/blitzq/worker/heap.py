"""The garbage collector while workers run: what is alive when a worker starts fetching is
frozen out of the collector's passes (:func:`gc.freeze`), and thawed when the last such
worker stops.

A worker allocates several tracked objects per task (its job, context, completion, the
run's coroutine), so CPython's cyclic collector runs often, and each of its full passes
walks every tracked object of the process: the modules, the application and the client
libraries loaded at start (about 40,000 objects for a small app, some 25 ms per pass on the
2-core machine of ``bench/README.md``). Those live as long as the process; frozen, a pass
walks only what was made since. Nothing frozen is lost: reference counting still frees it,
and a reference cycle made before the start is collected once the worker has stopped. The
idea is the one the Python documentation gives for :func:`gc.freeze` before a fork, and
Instagram's account of its web servers' collector ("Dismissing Python Garbage Collection
at Instagram", 2017) measured; here it made the no-results drain of ``bench/`` about 1.15x
faster (paired runs, ``bench/README.md``). ``Worker(freeze_gc=False)`` leaves the collector
alone.
"""

from __future__ import annotations

import gc

#: Workers of this process that froze the heap and have not stopped yet.
_freezers = 0


def freeze() -> None:
    """Freeze every object the collector tracks now (:func:`gc.freeze`); pair with
    :func:`thaw`. Workers started later freeze what was made since."""
    global _freezers
    gc.freeze()
    _freezers += 1


def thaw() -> None:
    """End one :func:`freeze`; the last one returns every frozen object to the collector
    (:func:`gc.unfreeze`)."""
    global _freezers
    _freezers -= 1
    if _freezers <= 0:
        _freezers = 0
        gc.unfreeze()
