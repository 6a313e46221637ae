"""The worker process: lifecycle, fetch loops, executors, group commit, background loops and
the supervisor of worker processes."""

from .worker import Worker

__all__ = ["Worker"]
