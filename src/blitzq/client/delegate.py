"""How a :class:`~blitzq.Queue` offers its clients' methods as its own: :func:`delegate`.

``inspect = delegate("_results", Results.inspect)`` in the Queue's class body makes
``queue.inspect(task_id)`` call ``queue._results.inspect(task_id)``. The made member is a real
function of the same kind as the client's method (plain, ``async def`` or async generator),
with its name, docstring and (through ``__wrapped__``) signature, so ``help()``,
:func:`inspect.signature`, the type checker and :func:`~blitzq.client.sync.blocking` all see
the client's method.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

C = TypeVar("C")
P = ParamSpec("P")
T = TypeVar("T")


def delegate(
    client: str, method: Callable[Concatenate[C, P], T]
) -> Callable[Concatenate[Any, P], T]:
    """A method for the owner class that runs ``method`` on the owner's attribute ``client``.

    Args:
        client: name of the owner's instance attribute holding the client (``"_results"``).
        method: the client class's method (``Results.get_result``): a plain function, a
            coroutine function or an async generator function; the made method is the same
            kind.

    Returns:
        A function to assign in the owner's class body; it takes the owner as ``self`` and
        then ``method``'s own arguments.
    """
    call = cast("Callable[..., Any]", method)  # checked by the types of the signature above
    if inspect.isasyncgenfunction(method):

        async def delegated_iter(owner: Any, /, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            items: AsyncGenerator[Any, None] = call(getattr(owner, client), *args, **kwargs)
            try:
                async for item in items:
                    yield item
            finally:
                await items.aclose()

        made: Callable[..., Any] = delegated_iter
    elif inspect.iscoroutinefunction(method):

        async def delegated_async(owner: Any, /, *args: Any, **kwargs: Any) -> Any:
            return await call(getattr(owner, client), *args, **kwargs)

        made = delegated_async
    else:

        def delegated(owner: Any, /, *args: Any, **kwargs: Any) -> Any:
            return call(getattr(owner, client), *args, **kwargs)

        made = delegated
    functools.update_wrapper(made, method)  # name, docstring, __wrapped__ (the signature)
    return cast("Callable[Concatenate[Any, P], T]", made)


__all__ = ["delegate"]
