"""The worker process: fetch loops, executors, group commit and background loops."""

from .worker import Worker

__all__ = ["Worker"]
