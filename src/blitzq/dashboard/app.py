"""The dashboard's ASGI application (Starlette): the pages, their static files and the JSON API.

:func:`create_app` builds it for one :class:`~blitzq.Queue`. Mount it in a host application
(``app.mount("/blitzq", create_app(queue))``), which then guards it as it guards its other
routes, or run it alone with ``blitzq dashboard``; ``basic_auth=`` makes it ask for HTTP basic
credentials itself (what the command does when ``BLITZQ_DASHBOARD_USER`` / ``_PASSWORD`` are
set).

The pages are HTML shells rendered here (:mod:`.pages`); their tables are filled and kept
current by ``static/app.js``, which polls the JSON API and writes user data only as text
nodes. Every response says ``nosniff``; the pages allow scripts and styles from this app
only (Content-Security-Policy ``script-src 'self'``). State-changing calls are POSTs that must
carry ``Content-Type: application/json``, which a cross-site form cannot send.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator
from importlib import resources
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .._checks import flag, is_loopback, seconds
from ..exceptions import BlitzQError, BrokerError, ConfigurationError, SerializationError
from ..integrations.asgi import close_queue, warm_up
from ..redaction import redact
from ..runtime_schedules import RuntimeEntries
from . import charts, data, http, listing, pages, tasks
from .actions import action_routes
from .http import MAX_ID, MAX_LIMIT, ApiError, json_response

if TYPE_CHECKING:
    from ..queue import Queue

__all__ = ["BasicAuth", "create_app"]

logger = logging.getLogger(__name__)

_STATIC = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'self'"
)


class BasicAuth:
    """ASGI middleware asking for HTTP basic credentials (RFC 7617) before ``app``.

    Both the user and the password are compared in constant time (``hmac.compare_digest``).

    Args:
        app: the application to guard.
        user: the user name expected.
        password: the password expected.
        realm: the realm named in the ``WWW-Authenticate`` challenge.

    Raises:
        ConfigurationError: an empty user or password.
    """

    def __init__(self, app: ASGIApp, user: str, password: str, realm: str = "blitzq") -> None:
        if not user or not password:
            raise ConfigurationError("dashboard basic auth needs a user and a password")
        self.app = app
        self._expected = (user.encode(), password.encode())
        self._realm = realm

    def _allowed(self, header: bytes | None) -> bool:
        if header is None or header[:6].lower() != b"basic ":
            return False
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        user, sep, password = decoded.partition(b":")
        ok_user = hmac.compare_digest(user, self._expected[0])
        ok_password = hmac.compare_digest(password, self._expected[1])
        return bool(sep) and ok_user and ok_password

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass authorized HTTP requests on; answer others 401 with a challenge."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope.get("headers") or []).get(b"authorization")
        if self._allowed(header):
            await self.app(scope, receive, send)
            return
        response = Response(
            "authentication required\n",
            401,
            headers={"WWW-Authenticate": f'Basic realm="{self._realm}", charset="UTF-8"'},
            media_type="text/plain",
        )
        await response(scope, receive, send)


class _Headers:
    """ASGI middleware adding ``X-Content-Type-Options``, ``Referrer-Policy`` and (on HTML)
    the Content-Security-Policy to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                headers += [
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                ]
                if any(k == b"content-type" and v.startswith(b"text/html") for k, v in headers):
                    headers.append((b"content-security-policy", _CSP.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, sending)


class _LoopbackOnly:
    """ASGI middleware refusing (421) HTTP requests whose ``Host`` is not a loopback name:
    a page of another site that rebinds its DNS name to 127.0.0.1 (DNS rebinding) sends its
    own name as ``Host``, so it cannot reach an unguarded dashboard on this machine."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            name = host.rpartition(":")[0] if host.rpartition(":")[2].isdigit() else host
            if not is_loopback(name):
                response = Response(
                    "this dashboard answers loopback names only (127.0.0.1, localhost)\n",
                    421,
                    media_type="text/plain",
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    queue: Queue,
    *,
    basic_auth: tuple[str, str] | None = None,
    refresh: float = 2.0,
    loopback_only: bool = False,
) -> ASGIApp:
    """The dashboard of ``queue`` as an ASGI application.

    Mount it in a host app (Starlette/FastAPI: ``app.mount("/blitzq", create_app(queue))``)
    or serve it alone (``uvicorn``, ``blitzq dashboard``). Run alone, its lifespan connects
    ``queue`` at start (a broker that does not answer is logged, not fatal: the API answers
    503 until it does) and closes its connections at shutdown; mounted, the queue connects
    on first use. It asks for no credentials unless ``basic_auth`` is given: guard it as the
    host app guards its admin routes.

    Args:
        queue: the application's Queue (its namespace, mode and periodic entries are shown).
        basic_auth: ``(user, password)`` to require HTTP basic auth, or ``None``.
        refresh: seconds between two live updates of a page (0.2 to 3600).
        loopback_only: answer only requests whose ``Host`` is a loopback name (127.0.0.1,
            ``[::1]``, localhost; others get 421), against DNS rebinding; what ``blitzq
            dashboard`` sets when it runs without credentials.

    Raises:
        ConfigurationError: ``refresh`` out of range, or an empty user or password.
    """
    refresh = seconds("refresh", refresh, minimum=0.2, strict=False, maximum=3600.0)
    sampler = data.RateSampler()
    runtime = RuntimeEntries(queue)

    def page(name: str) -> Any:
        async def endpoint(request: Request) -> Response:
            task_id = request.path_params.get("task_id") or request.query_params.get("id", "")
            html = pages.render(
                name,
                root=request.scope.get("root_path", "").rstrip("/"),
                namespace=queue.namespace,
                refresh_ms=int(refresh * 1000),
                task_id=task_id[:MAX_ID],
                queue=request.path_params.get("name", "")[:MAX_ID],
                note=queue.broker.count_note or "",
            )
            return Response(
                html, media_type="text/html; charset=utf-8", headers={"Cache-Control": "no-store"}
            )

        return endpoint

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return Response("not found\n", 404, media_type="text/plain")
        body = resources.files(__package__).joinpath("static", name).read_bytes()
        return Response(body, media_type=_STATIC[name], headers={"Cache-Control": "no-cache"})

    async def api_queues(request: Request) -> Response:
        return json_response(await data.queues_doc(queue, sampler))

    async def api_task_list(request: Request) -> Response:
        p = request.query_params
        query = listing.TaskQuery(
            state=p.get("state") or "recent",
            queue=p.get("queue") or None,
            task=p.get("task") or None,
            text=(p.get("q") or "").strip() or None,
            since=http.number(request, "since"),
            until=http.number(request, "until"),
            limit=http.integer(request, "limit", 50, 1, MAX_LIMIT),
            cursor=p.get("cursor") or None,
        )
        return json_response(await listing.list_tasks(queue, query))

    async def api_series(request: Request) -> Response:
        minutes = http.integer(request, "minutes", 30, 1, 60)
        return json_response(await charts.series_doc(queue, minutes))

    async def api_task(request: Request) -> Response:
        task_id = http.task_id(request.path_params["task_id"])
        doc = await tasks.task_doc(queue, task_id)
        if doc is None:
            raise ApiError(404, f"no record of task {task_id} (unknown, not started, or expired)")
        return json_response(doc)

    async def api_dead_letters(request: Request) -> Response:
        p = request.query_params
        flt = data.DeadLetterFilter(
            task=p.get("task") or None,
            queue=p.get("queue") or None,
            reason=p.get("reason") or None,
            text=p.get("q") or None,
            error_type=p.get("error_type") or None,
            older_than=http.number(request, "older_than"),
            newer_than=http.number(request, "newer_than"),
        )
        limit = http.integer(request, "limit", 50, 1, MAX_LIMIT)
        offset = http.integer(request, "offset", 0, 0, 10**9)
        doc = await data.dead_letters_page(queue, flt, limit, offset)
        return json_response(doc | {"namespace": queue.namespace, "limit": limit, "offset": offset})

    async def api_replay(request: Request) -> Response:
        await http.body(request)
        task_id = http.task_id(request.path_params["task_id"])
        try:
            handle = await queue.retry(task_id)
        except SerializationError as exc:
            raise ApiError(422, f"dead letter {task_id} cannot be replayed: {exc}") from None
        if handle is None:
            raise ApiError(404, f"no dead letter with id {task_id}")
        if handle.duplicate:
            raise ApiError(409, f"not replayed: task {handle.id} holds its unique key")
        return json_response({"replayed": True, "id": handle.id, "queue": handle.queue})

    async def api_purge(request: Request) -> Response:
        payload = await http.body(request)
        if payload.get("confirm") != queue.namespace:
            raise ApiError(
                400, 'purging needs {"confirm": "<namespace>"}: the namespace of the queue'
            )
        return json_response({"purged": await queue.purge_dead_letters()})

    async def api_workers(request: Request) -> Response:
        return json_response({"workers": await data.workers_doc(queue)})

    async def api_periodic(request: Request) -> Response:
        return json_response({"periodic": await data.periodic_doc(queue, runtime)})

    async def api_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, ApiError):
            return json_response({"error": redact(str(exc))}, exc.status)
        status = 503 if isinstance(exc, BrokerError) else 400
        return json_response({"error": redact(f"{type(exc).__name__}: {exc}")}, status)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:  # a broker down now is no reason not to serve: the pages answer 503 until it is back
            await warm_up(queue)
        except BrokerError as exc:
            logger.warning("dashboard: the broker does not answer yet: %s", exc)
        try:
            yield
        finally:
            await close_queue(queue)

    routes = [
        Route("/", page("queues")),
        Route("/tasks", page("tasks")),
        Route("/queues/{name}", page("queue")),
        Route("/charts", page("charts")),
        Route("/tasks/{task_id:path}", page("tasks")),
        Route("/dead-letters", page("dead-letters")),
        Route("/workers", page("workers")),
        Route("/periodic", page("periodic")),
        Route("/static/{name}", static),
        Route("/api/queues", api_queues),
        Route("/api/tasks", api_task_list),
        Route("/api/series", api_series),
        *action_routes(queue, runtime),
        Route("/api/tasks/{task_id:path}", api_task),
        Route("/api/dead-letters", api_dead_letters),
        Route("/api/dead-letters/purge", api_purge, methods=["POST"]),
        Route("/api/dead-letters/{task_id:path}/replay", api_replay, methods=["POST"]),
        Route("/api/workers", api_workers),
        Route("/api/periodic", api_periodic),
    ]
    app: ASGIApp = Starlette(
        routes=routes,
        exception_handlers={ApiError: api_error, BlitzQError: api_error},
        lifespan=lifespan,
    )
    if basic_auth is not None:
        app = BasicAuth(app, *basic_auth)
    if flag("loopback_only", loopback_only):
        app = _LoopbackOnly(app)
    return _Headers(app)
