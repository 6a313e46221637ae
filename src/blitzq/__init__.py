"""blitzq: an async-first distributed task queue on Redis / Valkey.

The public surface is what ``__all__`` lists; everything else may change between releases.
The names load on first use (PEP 562's module ``__getattr__``), so ``import blitzq`` costs
next to nothing and a program pays only for the parts it touches.
"""

from __future__ import annotations

from ._lazy import lazy_exports

#: ``typing.TYPE_CHECKING`` without importing typing (14 ms); type checkers read it as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from .context import TaskContext, current_task
    from .dead_letters import DeadLetter
    from .dependencies import Depends
    from .exceptions import (
        BlitzQError,
        BrokerError,
        ConfigurationError,
        MessageTooLarge,
        NoRetry,
        OutcomeUnknown,
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
        UnknownQueue,
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

#: Each public name by the module that defines it (tests/unit/test_lazy_exports.py keeps this
#: and the ``TYPE_CHECKING`` imports above the same).
EXPORTS: dict[str, tuple[str, ...]] = {
    ".context": ("TaskContext", "current_task"),
    ".dead_letters": ("DeadLetter",),
    ".dependencies": ("Depends",),
    ".exceptions": (
        "BlitzQError",
        "BrokerError",
        "ConfigurationError",
        "MessageTooLarge",
        "NoRetry",
        "OutcomeUnknown",
        "ResultExpired",
        "ResultNotStored",
        "ResultTimeout",
        "ResultTooLarge",
        "Retry",
        "SerializationError",
        "SoftTimeoutError",
        "TaskCancelled",
        "TaskExpired",
        "TaskFailed",
        "TaskTimeout",
        "UnknownQueue",
        "UnknownTask",
    ),
    ".extensions.middleware": ("EnqueueRefused", "Middleware"),
    ".extensions.signals": ("Signal", "SignalEvent"),
    ".progress": ("Progress",),
    ".queue": ("Queue",),
    ".ratelimit": ("RateLimit",),
    ".records": ("TaskRecord", "TaskState"),
    ".retries": ("RetryPolicy",),
    ".scheduler": ("Scheduler",),
    ".schedules": ("Cron", "Every"),
    ".task": ("BoundTask", "Task", "TaskHandle"),
    ".worker": ("Worker",),
    ".workflow": (
        "Signature",
        "WorkflowExpired",
        "WorkflowHandle",
        "WorkflowNotFound",
        "chain",
        "chord",
        "group",
    ),
}
_MODULE_OF = {name: module for module, names in EXPORTS.items() for name in names}

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
    "OutcomeUnknown",
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
    "UnknownQueue",
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


# Hidden from type checkers, which would otherwise accept any name as blitzq.<name>.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF, globals(), __all__)
