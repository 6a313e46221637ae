"""The app of the cross-process tracing test: a traced Queue whose spans are written to a file.

``python -m blitzq worker tests.integration.otel_app:queue`` with ``BLITZQ_TEST_SPANS`` (the
file: one JSON object per finished span), ``BLITZQ_REDIS_URL`` and ``BLITZQ_NAMESPACE`` set.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from blitzq import Queue
from blitzq.integrations.opentelemetry import BlitzqInstrumentor


class FileExporter(SpanExporter):
    """Append each span as a JSON line (name, kind, ids, parent ids, attributes)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self.path, "a", encoding="utf-8") as out:
            for span in spans:
                ctx, parent = span.get_span_context(), span.parent
                assert ctx is not None
                line = {
                    "name": span.name,
                    "kind": span.kind.name,
                    "trace_id": ctx.trace_id,
                    "span_id": ctx.span_id,
                    "parent_trace_id": parent.trace_id if parent else None,
                    "parent_span_id": parent.span_id if parent else None,
                    "attributes": dict(span.attributes or {}),
                }
                out.write(json.dumps(line) + "\n")
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["BLITZQ_TEST_SPANS"])))
queue = Queue(name="otel")
BlitzqInstrumentor().instrument(queue=queue, tracer_provider=provider)


@queue.task(name="otel.add")
async def add(a: int, b: int) -> int:
    """Return ``a + b``."""
    return a + b
