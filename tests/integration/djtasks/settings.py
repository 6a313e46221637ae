"""Settings of the test project (``DJANGO_SETTINGS_MODULE=tests.integration.djtasks.settings``).

The blitzq worker subprocess of the tests reads them; the broker comes from the environment
(``BLITZQ_REDIS_URL``, ``BLITZQ_NAMESPACE``), as the test process sets it.
"""

from __future__ import annotations

import os
from typing import Any

SECRET_KEY = "test-only"
USE_TZ = True
INSTALLED_APPS: list[str] = []
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}


def tasks_setting(redis_url: str, namespace: str) -> dict[str, Any]:
    """The ``TASKS`` setting of the test project on ``redis_url`` / ``namespace``."""
    return {
        "default": {
            "BACKEND": "blitzq.integrations.django.BlitzqTaskBackend",
            "QUEUES": ["default", "emails"],
            "ENQUEUE_ON_COMMIT": True,
            "OPTIONS": {"redis_url": redis_url, "namespace": namespace},
        }
    }


TASKS = tasks_setting(
    os.environ.get("BLITZQ_REDIS_URL", "redis://127.0.0.1:6379/0"),
    os.environ.get("BLITZQ_NAMESPACE", "blitzq"),
)
