"""blitzq: an async-first distributed task queue on Redis / Valkey.

The public surface is what ``__all__`` lists; everything else may change between releases.
"""

from .context import TaskContext, current_task
from .dead_letters import DeadLetter
from .dependencies import Depends
from .exceptions import (
    BlitzQError,
    BrokerError,
    ConfigurationError,
    MessageTooLarge,
    NoRetry,
    ResultExpired,
    ResultNotStored,
    ResultTimeout,
    ResultTooLarge,
    Retry,
    SerializationError,
    SoftTimeoutError,
    TaskCancelled,
    TaskExpired,
    TaskFailed,
    TaskTimeout,
    UnknownTask,
)
from .extensions.middleware import EnqueueRefused, Middleware
from .extensions.signals import Signal, SignalEvent
from .progress import Progress
from .queue import Queue
from .ratelimit import RateLimit
from .records import TaskRecord, TaskState
from .retries import RetryPolicy
from .scheduler import Scheduler
from .schedules import Cron, Every
from .task import BoundTask, Task, TaskHandle
from .worker import Worker
from .workflow import (
    Signature,
    WorkflowExpired,
    WorkflowHandle,
    WorkflowNotFound,
    chain,
    chord,
    group,
)

__version__ = "0.1.0"

__all__ = [
    "BlitzQError",
    "BoundTask",
    "BrokerError",
    "ConfigurationError",
    "Cron",
    "DeadLetter",
    "Depends",
    "EnqueueRefused",
    "Every",
    "MessageTooLarge",
    "Middleware",
    "NoRetry",
    "Progress",
    "Queue",
    "RateLimit",
    "ResultExpired",
    "ResultNotStored",
    "ResultTimeout",
    "ResultTooLarge",
    "Retry",
    "RetryPolicy",
    "Scheduler",
    "SerializationError",
    "Signal",
    "SignalEvent",
    "Signature",
    "SoftTimeoutError",
    "Task",
    "TaskCancelled",
    "TaskContext",
    "TaskExpired",
    "TaskFailed",
    "TaskHandle",
    "TaskRecord",
    "TaskState",
    "TaskTimeout",
    "UnknownTask",
    "Worker",
    "WorkflowExpired",
    "WorkflowHandle",
    "WorkflowNotFound",
    "__version__",
    "chain",
    "chord",
    "current_task",
    "group",
]
