"""Helpers that tie a :class:`~blitzq.Queue` to the life cycle of web frameworks.

Each submodule imports its framework lazily or not at all, so ``import blitzq`` never needs
one; install the matching extra of the checkout (``fastapi``, ``django``, ``flask``, e.g.
``pip install -e '.[fastapi]'``):

- :mod:`blitzq.integrations.asgi`: ``lifespan(queue)`` for FastAPI / Starlette and
  ``BlitzQLifespan(app, queue)`` for any ASGI app (no framework import);
- :mod:`blitzq.integrations.django`: ``enqueue_on_commit(task, *args, **kwargs)``;
- :mod:`blitzq.integrations.flask`: ``init_app(app, queue)`` and ``get_queue()``.
"""
