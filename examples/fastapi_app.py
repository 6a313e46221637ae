"""FastAPI + blitzq: an endpoint enqueues a task and returns its id; another reads the result.

Run it from the repository root (``BLITZQ_REDIS_URL=redis://localhost:6379/0`` to use a Redis
server; without it both processes share the embedded server in ``./.blitzq``)::

    pip install -e ".[fastapi]"    # from the checkout: FastAPI and uvicorn
    blitzq worker examples.fastapi_app:queue &
    uvicorn examples.fastapi_app:app --port 8000 &
    curl -s -X POST localhost:8000/reports -H 'content-type: application/json' \\
        -d '{"month": "2024-05"}'
    # {"task_id":"3f2c…"}
    curl -s 'localhost:8000/reports/3f2c…?wait=5'
    # {"task_id":"3f2c…","state":"succeeded","result":{"month":"2024-05","rows":31},"error":null}

``lifespan(queue)`` connects to the broker when the server starts (a wrong URL stops it at
once) and closes the connections when it stops. An endpoint that needs the Queue itself
takes a parameter typed ``QueueDep`` (``blitzq.integrations.fastapi``), which tests can swap
with ``app.dependency_overrides[get_queue]``.
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field, field_validator

from blitzq import Queue, ResultTimeout, TaskFailed
from blitzq.integrations.asgi import lifespan
from blitzq.integrations.fastapi import QueueDep

#: ``track_state``: a record is written at enqueue (``queued``) and kept current, so the
#: status endpoint can tell a report waiting its turn from an id nobody enqueued.
queue = Queue("reports", track_state=True)


@queue.task(retries=2)
async def build_report(month: str) -> dict[str, Any]:
    """Build the report of ``month`` (``YYYY-MM``): here, one row per day."""
    year, number = (int(part) for part in month.split("-"))
    await asyncio.sleep(0.05)  # stands for real work: queries, rendering, upload
    return {"month": month, "rows": calendar.monthrange(year, number)[1]}


app = FastAPI(title="reports", lifespan=lifespan(queue))


class ReportRequest(BaseModel):
    """Body of ``POST /reports``: a bad month is answered 422 here, never enqueued (a task
    would fail the same way on every retry and end as a dead letter)."""

    month: str = Field(pattern=r"^\d{4}-\d{2}$", examples=["2024-05"])

    @field_validator("month")
    @classmethod
    def _real_month(cls, value: str) -> str:
        year, number = (int(part) for part in value.split("-"))
        if not (year >= 1 and 1 <= number <= 12):
            raise ValueError("month must be YYYY-MM with a month 01-12 and a year from 0001")
        return value


@app.post("/reports", status_code=202)
async def create_report(body: ReportRequest) -> dict[str, str]:
    """Enqueue a report; the answer carries the task id to poll."""
    handle = await build_report.enqueue(body.month)
    return {"task_id": handle.id}


@app.get("/reports/{task_id}")
async def get_report(task_id: str, reports: QueueDep, wait: float = 0.0) -> dict[str, Any]:
    """State and result of a report task; ``?wait=SECONDS`` waits (at most 30 s) for the end."""
    if wait > 0:
        with contextlib.suppress(ResultTimeout, TaskFailed):
            await reports.get_result(task_id, timeout=min(wait, 30.0))
    record = await reports.inspect(task_id)
    if record is None:  # with track_state every enqueued task has one: an unknown id
        raise HTTPException(404, f"no report task {task_id!r} (unknown, or expired)")
    return {
        "task_id": task_id,
        "state": record.state.value,
        "result": record.result,
        "error": record.error,
    }
