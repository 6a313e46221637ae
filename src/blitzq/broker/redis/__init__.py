"""Redis / Valkey brokers: reliable (Streams) and fast (lists), plus the embedded server."""

from .common import RedisBroker
from .fast import FastRedisBroker
from .reliable import ReliableRedisBroker

__all__ = ["FastRedisBroker", "RedisBroker", "ReliableRedisBroker"]
