"""Per-worker resources for tasks: ``@queue.lifespan`` and ``Depends()``.

A lifespan is an async generator function registered with ``@queue.lifespan``: each worker
runs it once when it starts (before fetching) up to its ``yield``, and finishes it once its
runs have ended at shutdown. What it yields -- a database pool, an HTTP client, an object
holding several -- is a *resource* of that worker. A task receives a resource through a
parameter marked with :func:`Depends`, by the parameter's type::

    @dataclass
    class AppState:
        db: Pool
        http: httpx.AsyncClient

    @queue.lifespan
    async def resources() -> AsyncIterator[AppState]:
        async with Pool(DSN) as db, httpx.AsyncClient() as http:
            yield AppState(db, http)

    @queue.task
    async def charge(order_id: str, state: AppState = Depends()) -> None:
        await state.db.execute(...)

``Annotated[AppState, Depends()]`` marks a parameter the same way. The producer never passes
it (a value given for it is refused at enqueue); the worker fills it with the resource whose
type is the annotation (the resource of exactly that type, else the first that is an
instance of it). Resources live in the worker's process, so a task of the ``process``
executor cannot take one (refused when the task is registered).

The convention follows FastAPI's ``Depends`` and the lifespans of ASGI apps; it is resolved
once per task at registration, so a task without such parameters costs nothing more.

An extension can fill parameters of its own the same way (:class:`Provided`,
:func:`provide`): :mod:`blitzq.integrations.dishka` fills ``FromDishka[T]`` parameters from
a Dishka container's request scope.
"""

from __future__ import annotations

import contextlib
import inspect
import typing
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol

from .exceptions import ConfigurationError

if TYPE_CHECKING:
    from .arguments import TypedCall
    from .context import TaskContext

#: A lifespan: an async generator function yielding one resource.
Lifespan = Callable[[], AsyncIterator[Any]]


class Dependency:
    """The marker :func:`Depends` returns (a default value or ``Annotated`` metadata)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Depends()"


def Depends() -> Any:
    """Mark a task parameter as filled by the worker with one of its resources (module
    docstring): ``state: AppState = Depends()`` or ``state: Annotated[AppState, Depends()]``.

    Returns a marker (typed ``Any`` so that it type-checks as any parameter's default).
    """
    return Dependency()


def injected_parameters(fn: Callable[..., Any]) -> dict[str, Any]:
    """The parameters of ``fn`` marked with :func:`Depends`, with their annotated types.

    Raises:
        ConfigurationError: a marked parameter has no usable annotation, or is positional-
            only or variadic.
    """
    signature = inspect.signature(fn)
    marked = {
        name
        for name, param in signature.parameters.items()
        if isinstance(param.default, Dependency)
        or any(isinstance(m, Dependency) for m in getattr(param.annotation, "__metadata__", ()))
        or (isinstance(param.annotation, str) and "Depends(" in param.annotation)
    }
    if not marked:
        return {}
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ConfigurationError(
            f"{fn.__qualname__}: the annotations of its Depends() parameters cannot be "
            f"resolved: {exc}"
        ) from exc
    out: dict[str, Any] = {}
    for name in marked:
        param = signature.parameters[name]
        if param.kind in (param.POSITIONAL_ONLY, param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"{fn.__qualname__}: Depends() parameter {name!r} must be passable by keyword"
            )
        hint = hints.get(name)
        if typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        if not isinstance(hint, type):
            raise ConfigurationError(
                f"{fn.__qualname__}: Depends() parameter {name!r} needs a class as its "
                f"annotation, got {hint!r}"
            )
        out[name] = hint
    return out


def refuse_given(
    task: str, injected: dict[str, Any], signature: inspect.Signature, args: Any, kwargs: Any
) -> None:
    """Refuse a call that passes a value for a ``Depends()`` parameter (the worker fills it).

    Raises:
        ConfigurationError: it does.
    """
    try:
        given = signature.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return  # a call that does not fit fails in the worker, as any other
    passed = sorted(set(given) & set(injected))
    if passed:
        raise ConfigurationError(
            f"task {task}: {', '.join(passed)} is filled by the worker (Depends() or an "
            "extension such as FromDishka); do not pass it"
        )


class Provided:
    """Where an extension's injected parameter gets its value at each run (the
    ``task.injected`` entry :func:`provide` sets, in place of a ``Depends()`` type).

    Subclass it and implement :meth:`value`.
    """

    __slots__ = ()

    def value(self, name: str, context: TaskContext | None) -> Any:
        """The value of parameter ``name`` for the run of ``context`` (called on the worker's
        event loop when the call is built, after the before-execute middleware ran;
        ``context`` is ``None`` only outside a worker run).

        Raises:
            ConfigurationError: no value for this run (the attempt fails without retries).
        """
        raise NotImplementedError


class Injectable(Protocol):
    """What :func:`provide` reads and sets of a task (a :class:`~blitzq.Task` is one)."""

    injected: dict[str, Any]
    arguments: TypedCall | None
    prepared_call: bool

    @property
    def name(self) -> str:
        """The task's name."""
        ...

    @property
    def executor(self) -> str:
        """``"async"``, ``"thread"``, ``"process"`` or ``"cpu"``."""
        ...

    @property
    def signature(self) -> inspect.Signature:
        """The function's signature."""
        ...

    @property
    def fn(self) -> Callable[..., Any]:
        """The task's function."""
        ...


def provide(task: Injectable, sources: dict[str, Provided]) -> None:
    """Have the worker fill ``task``'s parameters named in ``sources`` at each run (an
    extension's marker, such as Dishka's ``FromDishka``): like ``Depends()`` parameters they
    are refused at enqueue and left out of rich-argument conversion. Meant for
    :meth:`~blitzq.Middleware.setup_task`.

    Args:
        task: a registered task.
        sources: parameter name → its :class:`Provided` source.

    Raises:
        ConfigurationError: ``task`` is a ``process`` or ``cpu`` task (the values live in the
            worker's process), or a name is not a keyword-passable parameter of it.
    """
    if not sources:
        return
    if task.executor in ("process", "cpu"):
        raise ConfigurationError(
            f"task {task.name}: a {task.executor} task cannot take {', '.join(sorted(sources))} "
            "(filled by the worker in its own process); use an async or thread task"
        )
    params = task.signature.parameters
    for name in sources:
        param = params.get(name)
        if param is None or param.kind in (
            param.POSITIONAL_ONLY,
            param.VAR_POSITIONAL,
            param.VAR_KEYWORD,
        ):
            raise ConfigurationError(
                f"task {task.name}: injected parameter {name!r} must be passable by keyword"
            )
    from .arguments import TypedCall

    task.injected = {**task.injected, **sources}
    task.arguments = TypedCall.of(task.fn, skip=task.injected)
    task.prepared_call = True


class Resources:
    """The resources one worker opened from its Queue's lifespans (module docstring)."""

    def __init__(self) -> None:
        self._stack = contextlib.AsyncExitStack()
        self.values: list[Any] = []

    async def open(self, lifespans: list[Lifespan]) -> None:
        """Run each lifespan up to its ``yield``, in registration order.

        Raises:
            Whatever a lifespan raises (those already open are closed first).
        """
        try:
            for lifespan in lifespans:
                manager = contextlib.asynccontextmanager(lifespan)()
                self.values.append(await self._stack.enter_async_context(manager))
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Finish the lifespans, last opened first (an error in one is raised after all ran)."""
        self.values.clear()
        await self._stack.aclose()

    def resolve(
        self, injected: dict[str, Any], context: TaskContext | None = None
    ) -> dict[str, Any]:
        """Keyword arguments giving each injected parameter its resource (or, for an
        extension's parameter, the value its :class:`Provided` gives for the run of
        ``context``).

        Raises:
            ConfigurationError: no resource of a parameter's type (no lifespan yields one),
                or a :class:`Provided` has no value.
        """
        out = {}
        for name, kind in injected.items():
            if isinstance(kind, Provided):
                out[name] = kind.value(name, context)
                continue
            for value in self.values:
                if type(value) is kind:
                    break
            else:
                for value in self.values:
                    if isinstance(value, kind):
                        break
                else:
                    raise ConfigurationError(
                        f"no lifespan of this Queue yields a {kind.__qualname__} for the "
                        f"Depends() parameter {name!r} (@queue.lifespan)"
                    )
            out[name] = value
        return out


class Lifespans(list[Lifespan]):
    """A Queue's lifespans (``queue.lifespan``), in registration order; calling it registers
    one: ``@queue.lifespan`` over an async generator function (module docstring)."""

    def __call__(self, lifespan: Lifespan) -> Lifespan:
        """Register ``lifespan`` and return it unchanged.

        Raises:
            ConfigurationError: not an async generator function.
        """
        if not inspect.isasyncgenfunction(lifespan):
            raise ConfigurationError(
                f"a lifespan is an async generator function (async def with one yield), "
                f"got {lifespan!r}"
            )
        self.append(lifespan)
        return lifespan
