"""URLs of blitzq's admin page of task records; include them under the admin, before
``admin.site.urls``::

    path("admin/blitzq/tasks/", include("blitzq.integrations.django_app.urls")),

Every view goes through ``admin.site.admin_view`` (staff login required)."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from . import views

app_name = "blitzq"
urlpatterns = [
    path("", admin.site.admin_view(views.task_list), name="tasks"),
    path("<str:task_id>/", admin.site.admin_view(views.task_detail), name="task"),
]
