"""In-process workflow state, mixed into :class:`~.memory.MemoryBroker`.

Same semantics as the workflow ops of ``broker/redis/lua/complete.lua`` (``workflow_start``,
``workflow_step``, ``workflow_done``, ``workflow_fail``, ``chord``); the state hashes do not
expire (the memory broker lives as long as its process).
"""

from __future__ import annotations

import threading
from typing import Any

_RUNNING = b"running"


def _b(value: Any) -> bytes:
    """A hash field value as Redis would store it."""
    if isinstance(value, bytes):
        return value
    return str(value).encode()


class MemoryWorkflows:
    """Workflow state hashes of the memory broker (a mixin; needs the broker's ``_lock``,
    ``_push``, ``_queues``, ``_record_waiters`` and ``_block``)."""

    _lock: threading.Lock

    def _wf_hashes(self) -> dict[str, dict[str, bytes]]:
        """``"<id>"`` and ``"<id>:j:<join>"`` -> fields (lock held)."""
        state: Any = self.__dict__.get("_workflows")
        if state is None:
            state = self.__dict__["_workflows"] = {}
        return state  # type: ignore[no-any-return]

    def _wf_open(self, workflow_id: str) -> bool:
        state = self._wf_hashes().get(workflow_id, {}).get("state")
        return state is None or state == _RUNNING

    def _wf_push(self, queue: str, message: bytes) -> None:
        broker: Any = self
        broker._queues.add(queue)
        broker._push(queue, message, 1)

    def _wf_end(self, workflow_id: str, fields: dict[str, Any]) -> None:
        if not self._wf_open(workflow_id):
            return
        state = self._wf_hashes().setdefault(workflow_id, {})
        state.update({k: _b(v) for k, v in fields.items()})
        from .memory import _wake

        broker: Any = self
        _wake(broker._record_waiters.pop("wf:" + workflow_id, None))

    def _op_workflow_start(self, op: tuple[Any, ...]) -> None:
        """``("workflow_start", id, steps, ttl, now)`` (lock held)."""
        self._wf_hashes()[op[1]] = {
            "state": _RUNNING,
            "steps": _b(op[2]),
            "created_at": _b(op[4]),
        }

    def _op_workflow_step(self, op: tuple[Any, ...]) -> None:
        """``("workflow_step", id, kind, queue, message)`` (lock held)."""
        if self._wf_open(op[1]):
            self._wf_push(op[3], op[4])

    def _op_workflow_done(self, op: tuple[Any, ...]) -> None:
        """``("workflow_done", id, result, ttl, now)`` (lock held)."""
        self._wf_end(op[1], {"state": "succeeded", "result": op[2], "finished_at": op[4]})

    def _op_workflow_fail(self, op: tuple[Any, ...]) -> None:
        """``("workflow_fail", id, state, error_type, error, step, ttl, now)`` (lock held)."""
        self._wf_end(
            op[1],
            {"state": op[2], "error_type": op[3], "error": op[4], "step": op[5]}
            | {"finished_at": op[7]},
        )

    def _op_chord(self, op: tuple[Any, ...]) -> None:
        """``("chord", id, join, index, size, result, ttl, kind, queue, head, tail, now,
        splice, result_ttl, max_bytes)`` (lock held): record once, fire once; a body over
        ``max_bytes`` fails the workflow with ResultTooLarge instead."""
        (_, workflow_id, join, index, size, result, _, _, queue, head, tail, now, splice) = op[:13]
        fields = self._wf_hashes().setdefault(f"{workflow_id}:j:{join}", {})
        fields.setdefault(str(index), _b(result))
        if len(fields) < int(size) or "f" in fields:
            return
        fields["f"] = _b(now)
        parts = [head]
        if int(splice) == 1:
            parts += [fields[str(i)] for i in range(int(size))]
        parts.append(tail)
        total, max_bytes = sum(len(p) for p in parts), int(op[14]) if len(op) > 14 else 0
        if 0 < max_bytes < total:
            error = f"chord results of {total} bytes are over the limit of {max_bytes} bytes"
            self._wf_end(
                workflow_id,
                {"state": "failed", "error_type": "blitzq.exceptions.ResultTooLarge"}
                | {"error": error, "step": join, "finished_at": now},
            )
            return
        body = b"".join(parts)
        if queue == "":
            self._wf_end(workflow_id, {"state": "succeeded", "result": body, "finished_at": now})
        elif self._wf_open(workflow_id):
            self._wf_push(queue, body)

    async def workflow_state(self, workflow_id: str) -> dict[str, bytes] | None:
        """The fields of a workflow's state, or ``None``."""
        with self._lock:
            state = self._wf_hashes().get(workflow_id)
            return dict(state) if state is not None else None

    async def wait_for_workflow(self, workflow_id: str, timeout: float) -> dict[str, bytes] | None:
        """The workflow's state once it is no longer running, or as it is after ``timeout``."""
        broker: Any = self

        def ended() -> dict[str, bytes] | None:
            state = self._wf_hashes().get(workflow_id)
            if state is None or state.get("state") != _RUNNING:
                return dict(state) if state is not None else {}
            return None

        found = await broker._block(broker._record_waiters, "wf:" + workflow_id, timeout, ended)
        if found is None:
            return await self.workflow_state(workflow_id)
        return found or None
