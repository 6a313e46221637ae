"""The dashboard's HTTP helpers: the API's error, its JSON answers, and the parsing of
query parameters and request bodies (each refusal an :class:`ApiError` with its status)."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..exceptions import ConfigurationError, SerializationError
from ..json_input import parse_json
from ..limits import MAX_REQUEST_BODY, MAX_TASK_ID
from ..routing import check_task_id
from . import data

__all__ = [
    "MAX_ID",
    "MAX_LIMIT",
    "ApiError",
    "body",
    "json_response",
    "number",
    "task_id",
    "worker_id",
]

#: Longest task or worker id the API accepts (characters): the rule of task ids'.
MAX_ID = MAX_TASK_ID
#: Most dead letters one API call returns.
MAX_LIMIT = 500


class ApiError(Exception):
    """A request the API refuses: answered as ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Json(JSONResponse):
    """JSON that also encodes task data of any plain type (bytes, sets, …)."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=data.jsonable, ensure_ascii=False).encode()


def json_response(content: Any, status: int = 200) -> Response:
    """``content`` as a JSON answer, never cached."""
    return _Json(content, status, headers={"Cache-Control": "no-store"})


def task_id(raw: str) -> str:
    """``raw`` (a route's task id) once it passes the rule of task ids
    (:func:`~blitzq.routing.check_task_id`, the rule enqueue applies): refused as given, never
    trimmed into another id.

    Raises:
        ApiError: 400 otherwise.
    """
    try:
        return check_task_id("task id", raw)
    except (ConfigurationError, SerializationError) as exc:
        raise ApiError(400, f"not a task id: {exc}") from None


def worker_id(raw: str) -> str:
    """``raw`` (a route's worker id, surrounding blanks removed) when it is 1 to
    :data:`MAX_ID` printable characters.

    Raises:
        ApiError: 400 otherwise.
    """
    ident = raw.strip()
    if not ident or len(ident) > MAX_ID or not ident.isprintable():
        raise ApiError(400, f"not a worker id (1 to {MAX_ID} printable characters)")
    return ident


def integer(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be an integer") from None
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be in [{low}, {high}]")
    return value


def number(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ApiError(400, f"{name} must be a number of seconds") from None
    if not 0 <= value < 1e12:  # also refuses nan
        raise ApiError(400, f"{name} must be a number of seconds >= 0")
    return value


async def body(request: Request) -> dict[str, Any]:
    """The request's JSON object (``{}`` for an empty body).

    The body is read in chunks and refused (413) as soon as it passes
    :data:`~blitzq.limits.MAX_REQUEST_BODY` bytes, or at once when ``Content-Length`` says it
    will; its JSON goes through :func:`~blitzq.json_input.parse_json` (400 when not JSON, too
    deep, holding a non-finite number, or not an object).

    Raises:
        ApiError: 415 without ``Content-Type: application/json``, 413, 400 as above.
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise ApiError(415, "send Content-Type: application/json")
    too_large = f"the body is larger than {MAX_REQUEST_BODY} bytes"
    declared = request.headers.get("content-length")
    if declared is not None:
        digits = declared.strip()
        if not (digits.isascii() and digits.isdigit()):
            raise ApiError(400, f"Content-Length is not a number of bytes: {declared[:40]!r}")
        if int(digits) > MAX_REQUEST_BODY:
            raise ApiError(413, too_large)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_REQUEST_BODY:
            raise ApiError(413, too_large)
    if not raw:
        return {}
    try:
        body: dict[str, Any] = parse_json(bytes(raw), "the body", expect=dict)
    except ConfigurationError as exc:
        raise ApiError(400, str(exc)) from None
    return body
