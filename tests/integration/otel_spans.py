"""Finished OTel spans as plain records, and a span tree read from them (the tracing tests).

The worker process of the cross-process test (:mod:`tests.integration.otel_app`) dumps its
spans with :func:`record` as JSON; the test turns its own in-memory spans into the same
records, so both sides make one :class:`SpanTree`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan


def record(span: ReadableSpan) -> dict[str, Any]:
    """``span`` as plain JSON data: name, kind, ids (hex), parent, links, attributes, status and
    event names."""
    ctx, parent = span.get_span_context(), span.parent
    assert ctx is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent else None,
        "parent_trace_id": f"{parent.trace_id:032x}" if parent else None,
        "links": [
            {
                "trace_id": f"{link.context.trace_id:032x}",
                "span_id": f"{link.context.span_id:016x}",
                "attributes": dict(link.attributes or {}),
            }
            for link in span.links
        ],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [event.name for event in span.events],
    }


class SpanTree:
    """Span records from any number of processes, looked up by id, parent and attribute.

    Args:
        spans: the records (:func:`record`).
    """

    def __init__(self, spans: Iterable[dict[str, Any]]) -> None:
        self.spans = list(spans)
        self.by_id = {span["span_id"]: span for span in self.spans}

    def find(self, name: str | None = None, **attributes: Any) -> list[dict[str, Any]]:
        """Spans called ``name`` (any name if ``None``) whose attributes include
        ``attributes`` (``_`` in a keyword stands for ``.``)."""
        wanted = {key.replace("_", "."): value for key, value in attributes.items()}
        return [
            span
            for span in self.spans
            if (name is None or span["name"] == name)
            and all(span["attributes"].get(k) == v for k, v in wanted.items())
        ]

    def one(self, name: str | None = None, **attributes: Any) -> dict[str, Any]:
        """The only span :meth:`find` finds."""
        found = self.find(name, **attributes)
        assert len(found) == 1, (name, attributes, found)
        return found[0]

    def parent(self, span: dict[str, Any]) -> dict[str, Any] | None:
        """The parent of ``span`` among the records, or ``None`` (a root, or not recorded)."""
        parent_id = span["parent_span_id"]
        return self.by_id.get(parent_id) if parent_id else None

    @staticmethod
    def links(span: dict[str, Any]) -> dict[str, str]:
        """``{link type: linked span id}`` of ``span``."""
        return {link["attributes"]["blitzq.link.type"]: link["span_id"] for link in span["links"]}
