"""Settings of the Django tasks example: SQLite, and Django's tasks framework on blitzq.

The server and the worker read the broker from ``BLITZQ_REDIS_URL`` (without it both use the
embedded server in ``./.blitzq``) and the namespace from ``BLITZQ_NAMESPACE``.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

DEBUG = True
SECRET_KEY = "example-only"
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "app"
USE_TZ = True
INSTALLED_APPS: list[str] = []
MIDDLEWARE: list[str] = []
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(Path(tempfile.gettempdir()) / "blitzq-django-tasks-example.sqlite3"),
    }
}
TASKS = {
    "default": {
        "BACKEND": "blitzq.integrations.django.BlitzqTaskBackend",
        "QUEUES": ["default"],
        "ENQUEUE_ON_COMMIT": True,
        "OPTIONS": {"redis_url": os.environ.get("BLITZQ_REDIS_URL")},
    }
}
