"""FastAPI: a dependency that gives endpoints the app's Queue.

``FastAPI(lifespan=lifespan(queue))`` (:mod:`blitzq.integrations.asgi`) keeps the Queue on
the app; an endpoint takes it as a parameter typed :data:`QueueDep`::

    from blitzq.integrations.asgi import lifespan
    from blitzq.integrations.fastapi import QueueDep

    app = FastAPI(lifespan=lifespan(queue))

    @app.post("/reports")
    async def create_report(month: str, queue: QueueDep) -> dict[str, str]:
        handle = await queue.send("reports.build", args=(month,))
        return {"task_id": handle.id}

Tests swap it with FastAPI's own mechanism: ``app.dependency_overrides[get_queue] = lambda:
test_queue``. Needs the ``fastapi`` extra.
"""

from __future__ import annotations

from typing import Annotated

try:
    from fastapi import Depends, Request
except ImportError as exc:  # the optional extra is not installed
    raise ImportError(
        "blitzq.integrations.fastapi needs FastAPI: pip install fastapi (or install blitzq "
        "from its checkout with the extra: pip install -e '.[fastapi]', uvicorn included)"
    ) from exc

from ..queue import Queue


def get_queue(request: Request) -> Queue:
    """The Queue the app's lifespan keeps (``app.state.blitzq_queue``).

    Raises:
        RuntimeError: the app was not made with ``lifespan(queue)`` (nor given a queue in
            ``app.state.blitzq_queue``).
    """
    queue = getattr(request.app.state, "blitzq_queue", None)
    if not isinstance(queue, Queue):
        raise RuntimeError(
            "no blitzq Queue on this app: make it with FastAPI(lifespan=lifespan(queue)) "
            "(blitzq.integrations.asgi) or set app.state.blitzq_queue"
        )
    return queue


#: An endpoint parameter typed ``QueueDep`` receives the app's Queue.
QueueDep = Annotated[Queue, Depends(get_queue)]

__all__ = ["QueueDep", "get_queue"]
