"""``manage.py blitzq_worker``: run a blitzq worker for Django's tasks framework.

The same worker as ``blitzq worker --django`` (:mod:`blitzq.integrations.django_worker`), with
the settings ``manage.py`` was given (``--settings`` or ``DJANGO_SETTINGS_MODULE``), as
django-rq's ``rqworker`` and Celery's ``celery worker`` are started::

    python manage.py blitzq_worker                   # every queue of TASKS' QUEUES
    python manage.py blitzq_worker emails default -c 20 --log-level debug
    python manage.py blitzq_worker --burst           # run what is queued, then exit

Options are the worker's main ones; any other ``blitzq worker`` option goes after ``--``
(``manage.py blitzq_worker -- --workers 4``). The broker is the backend's ``OPTIONS`` (or
``BLITZQ_REDIS_URL`` / ``BLITZQ_NAMESPACE``, as for ``blitzq worker``).
"""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

LEVELS = ("debug", "info", "warning", "error")


class Command(BaseCommand):  # type: ignore[misc]
    """Run ``blitzq worker --django`` in this process with the project's settings."""

    help = (
        "Run a blitzq worker for the tasks of Django's tasks framework (TASKS backend "
        "blitzq.integrations.django.BlitzqTaskBackend); stops gracefully on SIGTERM/SIGINT."
    )
    requires_system_checks: tuple[str, ...] = ()  # the worker checks what it needs

    def add_arguments(self, parser: CommandParser) -> None:
        """The worker's main options (see the module docstring)."""
        parser.add_argument(
            "queues", nargs="*", metavar="QUEUE", help="Queues to consume (default: QUEUES)."
        )
        parser.add_argument(
            "-c", "--concurrency", type=int, default=None, help="Tasks running at once."
        )
        parser.add_argument(
            "--burst", action="store_true", help="Run the waiting tasks, then exit."
        )
        parser.add_argument(
            "--log-level", choices=LEVELS, default=None, help="Log level of the worker."
        )
        parser.add_argument(
            "--backend", default=None, help="The TASKS alias to serve (default: default)."
        )

    def run_from_argv(self, argv: list[str]) -> None:
        """Split off what follows ``--`` (options passed to ``blitzq worker`` as they are)."""
        if "--" in argv:
            cut = argv.index("--")
            self._passthrough = argv[cut + 1 :]
            argv = argv[:cut]
        super().run_from_argv(argv)

    def handle(self, *args: Any, **options: Any) -> None:
        """Build the ``blitzq worker --django`` command line and run it here.

        Raises:
            SystemExit: with ``blitzq worker``'s exit code when it is not 0 (2: a usage or
                configuration error, printed on one line; 1: a failed operation).
        """
        from blitzq.cli import cli

        argv = ["worker", "--django"]
        if options["queues"]:
            argv += ["--queues", ",".join(options["queues"])]
        if options["concurrency"] is not None:
            argv += ["--concurrency", str(options["concurrency"])]
        if options["burst"]:
            argv.append("--burst")
        if options["log_level"]:
            argv += ["--log-level", options["log_level"]]
        argv += list(getattr(self, "_passthrough", []))
        if options["backend"]:
            os.environ["BLITZQ_DJANGO_BACKEND"] = options["backend"]
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", settings.SETTINGS_MODULE or "")
        try:
            cli.main(args=argv, prog_name="manage.py blitzq_worker", standalone_mode=True)
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
