"""Moved to :mod:`blitzq.client.sync`; this name stays importable."""

from .client.sync import Portal

__all__ = ["Portal"]
