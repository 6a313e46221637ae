"""blitzq: an async-first distributed task queue on Redis / Valkey.

The public surface is what ``__all__`` lists; everything else may change between releases.
"""

from .context import TaskContext, current_task
from .exceptions import (
    BlitzQError,
    BrokerError,
    ConfigurationError,
    MessageTooLarge,
    ResultTimeout,
    Retry,
    SerializationError,
    TaskCancelled,
    TaskFailed,
    TaskTimeout,
    UnknownTask,
)
from .queue import Queue
from .ratelimit import RateLimit
from .records import DeadLetter, TaskRecord, TaskState
from .retries import RetryPolicy
from .scheduler import Scheduler
from .schedules import Cron, Every
from .task import BoundTask, Task, TaskHandle
from .worker import Worker

__version__ = "0.1.0"

__all__ = [
    "BlitzQError",
    "BoundTask",
    "BrokerError",
    "ConfigurationError",
    "Cron",
    "DeadLetter",
    "Every",
    "MessageTooLarge",
    "Queue",
    "RateLimit",
    "ResultTimeout",
    "Retry",
    "RetryPolicy",
    "Scheduler",
    "SerializationError",
    "Task",
    "TaskCancelled",
    "TaskContext",
    "TaskFailed",
    "TaskHandle",
    "TaskRecord",
    "TaskState",
    "TaskTimeout",
    "UnknownTask",
    "Worker",
    "__version__",
    "current_task",
]
