"""blitzq: an async-first distributed task queue on Redis / Valkey.

The public surface is what ``__all__`` lists; everything else may change between releases.
"""

from .exceptions import (
    BlitzQError,
    BrokerError,
    ConfigurationError,
    MessageTooLarge,
    ResultTimeout,
    Retry,
    SerializationError,
    TaskFailed,
    TaskTimeout,
    UnknownTask,
)
from .queue import Queue
from .records import DeadLetter, TaskRecord, TaskState
from .retries import RetryPolicy
from .task import BoundTask, Task, TaskHandle
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "BlitzQError",
    "BoundTask",
    "BrokerError",
    "ConfigurationError",
    "DeadLetter",
    "MessageTooLarge",
    "Queue",
    "ResultTimeout",
    "Retry",
    "RetryPolicy",
    "SerializationError",
    "Task",
    "TaskFailed",
    "TaskHandle",
    "TaskRecord",
    "TaskState",
    "TaskTimeout",
    "UnknownTask",
    "Worker",
    "__version__",
]
