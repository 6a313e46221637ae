"""Removed: ``blitzq.broker.memory.MemoryBroker`` (a pure-Python stand-in for Redis).

Importing this module raises :class:`ImportError` that names the replacement:
``Queue(redis_url="memory://name")`` runs the same Redis brokers and Lua scripts as production
on a private, in-process Valkey server (see docs/architecture.md, ``broker/redis/ephemeral.py``).
"""

raise ImportError(
    "blitzq.broker.memory (MemoryBroker) was removed: use Queue(redis_url='memory://name'), "
    "which runs the same Redis code and Lua scripts on a private in-process Valkey server"
)
