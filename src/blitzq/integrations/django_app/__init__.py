"""blitzq as a Django app: ``INSTALLED_APPS += ["blitzq.integrations.django_app"]``.

It adds the ``manage.py blitzq_worker`` command (:mod:`.management.commands.blitzq_worker`,
the same worker as ``blitzq worker --django``) and a read-only admin page of task records
(:mod:`.views`, mounted with :mod:`.urls` under the admin). It needs no database table:
task records live in Redis (see docs/integrations.md).
"""
