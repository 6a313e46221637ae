"""The Django app of blitzq (label ``blitzq``)."""

from __future__ import annotations

from django.apps import AppConfig


class BlitzqConfig(AppConfig):  # type: ignore[misc]
    """``blitzq.integrations.django_app``: the ``blitzq_worker`` command and the admin page
    of task records; no models."""

    name = "blitzq.integrations.django_app"
    label = "blitzq"
    verbose_name = "blitzq"
