"""A minimal Django project for tests/integration/test_django_tasks.py: settings and tasks."""
