"""The dashboard's actions: the state-changing API calls, each a POST whose JSON body must
confirm its target (``{"confirm": "<the id or name acted on>"}``; 400 otherwise), behind the
same guard as every other route of the app. A purge, pause or resume of a queue nothing has
used in the namespace and the application does not declare is refused (404, nothing changed;
:class:`~blitzq.UnknownQueue`) unless the body also says ``"force": true``.

Each reuses the client or broker call the CLI makes: cancel (``queue.cancel``), replay one
dead letter or all matching a filter (``queue.retry`` / ``queue.retry_dead_letters``, as
``blitzq dead-letter replay``), purge a queue (``queue.purge_queue`` over its levels, as
``blitzq queue purge``), pause / resume a queue (``broker.set_paused``, as ``blitzq queue
pause``), shut a worker down (``broker.request_shutdown``, as ``blitzq worker shutdown``)
or resize its pool (``broker.request_resize``: a push on the event channel), run a periodic
entry now (its task published once, with its arguments, to its queue) and pause / resume it
(``broker.state.browse.set_periodic_paused``: its occurrences are then claimed and skipped).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..client.admin import check_known_queue, is_live_worker
from ..exceptions import MessageTooLarge, SerializationError, UnknownQueue
from ..periodic import PeriodicTask
from ..routing import base_queue, check_name, check_queue_name, levels
from ..runtime_schedules import RuntimeEntries
from .http import ApiError, body, json_response, task_id, worker_id

if TYPE_CHECKING:
    from ..queue import Queue

__all__ = ["action_routes"]

#: Largest pool a resize may ask for.
MAX_CONCURRENCY = 100_000

Endpoint = Callable[[Request], Awaitable[Response]]


async def _confirmed(request: Request, target: str) -> dict[str, Any]:
    """The request's body, once its ``confirm`` names ``target``.

    Raises:
        ApiError: 400 without the confirmation (and the body's own refusals).
    """
    payload = await body(request)
    if payload.get("confirm") != target:
        raise ApiError(400, f'confirm the action with {{"confirm": "{target}"}}')
    return payload


def _physical(name: str) -> list[str]:
    check_name("queue name", name)
    return [name] if name.endswith((":high", ":low")) else levels(name)


def declared_queues(queue: Queue) -> set[str]:
    """The queues ``queue``'s application declares: its name, each registered task's queue and
    each periodic entry's (base names); known to the actions before their first task."""
    names = {queue.name}
    names.update(task.queue for task in queue.tasks.values())
    names.update(base_queue(entry.target_queue()) for entry in queue.periodic_tasks.values())
    return names


def action_routes(queue: Queue, runtime: RuntimeEntries) -> list[Route]:
    """The POST routes of the actions (module docstring), for ``queue``.

    Args:
        queue: the dashboard's Queue.
        runtime: the reader of the run-time periodic entries (``blitzq schedule add``).
    """

    async def cancel(request: Request) -> Response:
        ident = task_id(request.path_params["task_id"])
        await _confirmed(request, ident)
        return json_response({"id": ident, "cancelled": await queue.cancel(ident)})

    async def replay_matching(request: Request) -> Response:
        payload = await _confirmed(request, "all matching")

        def text(key: str) -> str | None:
            value = payload.get(key)
            return str(value) if value else None

        def age(key: str) -> float | None:
            value = payload.get(key)
            if value in (None, ""):
                return None
            try:
                return float(value)
            except (TypeError, ValueError):
                raise ApiError(400, f"{key} must be a number of seconds") from None

        outcomes = await queue.retry_dead_letters(
            task=text("task"),
            queue=text("queue"),
            reason=text("reason"),
            error_type=text("error_type"),
            older_than=age("older_than"),
            newer_than=age("newer_than"),
        )
        counts: dict[str, int] = {}
        for o in outcomes:
            counts[o.outcome] = counts.get(o.outcome, 0) + 1
        return json_response({"matched": len(outcomes), "outcomes": counts})

    async def known(name: str, payload: dict[str, Any]) -> None:
        """Refuse (404) a queue nothing has used, unless the body says ``"force": true``."""
        if payload.get("force") is True:
            return
        try:
            await check_known_queue(queue.broker, queue.namespace, name, declared_queues(queue))
        except UnknownQueue as exc:
            raise ApiError(404, str(exc)) from None

    async def purge_queue(request: Request) -> Response:
        name = request.path_params["name"]
        payload = await _confirmed(request, name)
        physical = _physical(name)
        await known(name, payload)
        return json_response(
            {"queue": name, "purged": sum([await queue.purge_queue(p) for p in physical])}
        )

    def pause_queue(paused: bool) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            name = check_queue_name("queue name", request.path_params["name"])
            await known(name, await _confirmed(request, name))
            changed = await queue.broker.set_paused(name, paused)
            return json_response({"queue": name, "paused": paused, "changed": changed})

        return endpoint

    async def entries() -> dict[str, PeriodicTask]:
        return {**await runtime.refresh(), **queue.periodic_tasks}

    async def entry(request: Request) -> PeriodicTask:
        name = request.path_params["name"]
        found = (await entries()).get(name)
        if found is None:
            raise ApiError(404, f"no periodic entry named {name!r}")
        return found

    async def run_periodic(request: Request) -> Response:
        item = await entry(request)
        await _confirmed(request, item.name)
        try:
            handle = await queue.send(
                item.task.name,
                list(item.args),
                dict(item.kwargs),
                queue=item.queue or item.task.queue,
                priority=item.priority or item.task.priority,
            )
        except (SerializationError, MessageTooLarge) as exc:
            raise ApiError(422, f"periodic entry {item.name} cannot be sent: {exc}") from None
        return json_response({"name": item.name, "id": handle.id, "queue": handle.queue})

    def pause_periodic(paused: bool) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            item = await entry(request)
            await _confirmed(request, item.name)
            changed = await queue.broker.state.browse.set_periodic_paused(item.name, paused)
            return json_response({"name": item.name, "paused": paused, "changed": changed})

        return endpoint

    async def live_worker(request: Request) -> str:
        ident = worker_id(request.path_params["worker_id"])
        if not await is_live_worker(queue.broker, ident):  # as `blitzq worker shutdown`
            raise ApiError(404, f"no live worker {ident}")
        return ident

    async def shutdown_worker(request: Request) -> Response:
        ident = await live_worker(request)
        await _confirmed(request, ident)
        await queue.broker.request_shutdown(ident)
        return json_response({"worker": ident, "asked": "shutdown"})

    async def resize_worker(request: Request) -> Response:
        ident = await live_worker(request)
        payload = await _confirmed(request, ident)
        size = payload.get("concurrency")
        if isinstance(size, bool) or not isinstance(size, int):
            raise ApiError(400, "concurrency must be an integer")
        if not 1 <= size <= MAX_CONCURRENCY:
            raise ApiError(400, f"concurrency must be in [1, {MAX_CONCURRENCY}]")
        await queue.broker.request_resize(ident, size)
        return json_response({"worker": ident, "asked": "resize", "concurrency": size})

    post = ["POST"]
    return [
        Route("/api/tasks/{task_id:path}/cancel", cancel, methods=post),
        Route("/api/dead-letters/replay", replay_matching, methods=post),
        Route("/api/queues/{name}/purge", purge_queue, methods=post),
        Route("/api/queues/{name}/pause", pause_queue(True), methods=post),
        Route("/api/queues/{name}/resume", pause_queue(False), methods=post),
        Route("/api/periodic/{name}/run", run_periodic, methods=post),
        Route("/api/periodic/{name}/pause", pause_periodic(True), methods=post),
        Route("/api/periodic/{name}/resume", pause_periodic(False), methods=post),
        Route("/api/workers/{worker_id:path}/shutdown", shutdown_worker, methods=post),
        Route("/api/workers/{worker_id:path}/resize", resize_worker, methods=post),
    ]
