"""Brokers: the only layer that talks to Redis (or keeps messages in memory)."""

from .base import Broker, Completion, Delivery, Guarantee

__all__ = ["Broker", "Completion", "Delivery", "Guarantee"]
