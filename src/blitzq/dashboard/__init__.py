"""The blitzq dashboard: a web view of one Queue's queues, tasks, dead letters, workers and
periodic entries, with a JSON API behind it ([dashboard](../../docs/dashboard.md)).

``create_app(queue)`` returns an ASGI application (Starlette) to mount in a host app or to
serve alone (``blitzq dashboard MODULE:ATTR``). Needs the ``dashboard`` extra
(``pip install -e '.[dashboard]'`` in the checkout: starlette, uvicorn).
"""

from __future__ import annotations

from .app import BasicAuth, create_app

__all__ = ["BasicAuth", "create_app"]
