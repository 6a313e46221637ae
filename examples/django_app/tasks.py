"""The blitzq side of the Django example: the Queue and its task (no Django import needed)."""

from __future__ import annotations

from blitzq import Queue

queue = Queue("signups")


@queue.task
def send_welcome(signup_id: int, name: str) -> str:
    """Pretend to e-mail the new user; return the message."""
    return f"Welcome, {name}! (signup #{signup_id})"
