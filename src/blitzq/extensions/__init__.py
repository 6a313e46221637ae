"""The one extension mechanism: middleware (which declares the per-task options it handles)
with signals as a thin observer layer on it, and the built-in middleware (unique tasks,
locks, ``max_age`` expiry)."""
