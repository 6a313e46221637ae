"""ASGI integration: open a Queue's connections when the app starts, close them when it stops.

FastAPI / Starlette take :func:`lifespan` directly::

    app = FastAPI(lifespan=lifespan(queue))

or inside the application's own lifespan::

    @contextlib.asynccontextmanager
    async def app_lifespan(app):
        async with lifespan(queue):
            yield

Any other ASGI app is wrapped in :class:`BlitzQLifespan`, which speaks the ASGI lifespan
protocol for it (and passes it on when the app speaks it too)::

    app = BlitzQLifespan(app, queue)

Start-up pings the broker on the server's event loop, so a wrong URL or an unreachable server
stops the app at start instead of failing its first request, and the connection pool is ready.
Shut-down closes that loop's connections and the sync API's background loop (used by
``enqueue_sync`` from threads, e.g. FastAPI's ``def`` endpoints). Nothing here imports a web
framework.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from types import TracebackType
from typing import Any

from ..queue import Queue

__all__ = ["BlitzQLifespan", "QueueLifespan", "close_queue", "lifespan", "warm_up"]

logger = logging.getLogger("blitzq.integrations")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_CLOSING_REPLIES = frozenset(
    {"lifespan.startup.failed", "lifespan.shutdown.complete", "lifespan.shutdown.failed"}
)


async def warm_up(queue: Queue) -> None:
    """Connect ``queue`` on the running event loop and check that the broker answers.

    Raises:
        BrokerError: the broker cannot be reached.
        ConfigurationError: the broker URL is invalid.
    """
    await queue.broker.ping()


async def close_queue(queue: Queue) -> None:
    """Close ``queue``'s connections of the running loop and stop its sync API's loop.

    The sync API's loop is stopped from a worker thread, so the event loop is not blocked.
    """
    try:
        await queue.close()
    finally:
        await asyncio.to_thread(queue.close_sync)


class QueueLifespan:
    """Async context manager that warms ``queue`` up on entry and closes it on exit.

    It is also a lifespan *function*: calling it with the app returns a fresh context manager,
    which is what ``FastAPI(lifespan=...)`` and ``Starlette(lifespan=...)`` expect. Entering
    it returns ``None`` (so Starlette adds no lifespan state).

    Args:
        queue: the application's Queue.
    """

    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def __call__(self, app: object) -> QueueLifespan:
        """Return a new context manager for one start-up / shut-down cycle of ``app``, and
        keep the queue on the app (``app.state.blitzq_queue``, where the app has a ``state``:
        FastAPI, Starlette) for :func:`blitzq.integrations.fastapi.get_queue`."""
        state = getattr(app, "state", None)
        if state is not None:
            state.blitzq_queue = self.queue
        return QueueLifespan(self.queue)

    async def __aenter__(self) -> None:
        """Warm the queue up (see :func:`warm_up`; raises its errors)."""
        await warm_up(self.queue)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the queue (see :func:`close_queue`); an exception from the body propagates."""
        await close_queue(self.queue)


def lifespan(queue: Queue) -> QueueLifespan:
    """The lifespan of an app that uses ``queue``: ``FastAPI(lifespan=lifespan(queue))``.

    Args:
        queue: the application's Queue.

    Returns:
        A :class:`QueueLifespan`, usable as ``async with lifespan(queue): ...`` too.
    """
    return QueueLifespan(queue)


class BlitzQLifespan:
    """ASGI middleware: run :func:`lifespan` around any ASGI app.

    HTTP and websocket scopes go straight to ``app``. For the lifespan scope the middleware
    warms the queue up before the app's own start-up and closes it after the app's shut-down;
    an app that does not speak the lifespan protocol (returns, or raises, on that scope) gets
    it answered by the middleware.

    Args:
        app: the ASGI application.
        queue: the application's Queue.
    """

    def __init__(self, app: ASGIApp, queue: Queue) -> None:
        self.app = app
        self.queue = queue

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point."""
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        startup = await receive()
        try:
            await warm_up(self.queue)
        except Exception as exc:
            await send({"type": "lifespan.startup.failed", "message": f"blitzq: {exc}"})
            return
        pending = [startup]
        replies: list[str] = []
        closed = False

        async def close_once() -> None:
            nonlocal closed
            if not closed:
                closed = True
                await close_queue(self.queue)

        async def app_receive() -> Message:
            return pending.pop() if pending else await receive()

        async def app_send(message: Message) -> None:
            replies.append(message["type"])
            if message["type"] in _CLOSING_REPLIES:
                await close_once()
            await send(message)

        try:
            await self.app(scope, app_receive, app_send)
        except Exception:
            if replies:
                await close_once()
                raise
            logger.debug("app does not support the lifespan protocol", exc_info=True)
        if replies:  # the app ran the protocol (or gave up on it after answering)
            await close_once()
            return
        await send({"type": "lifespan.startup.complete"})
        while (await receive())["type"] != "lifespan.shutdown":
            pass
        await close_once()
        await send({"type": "lifespan.shutdown.complete"})
