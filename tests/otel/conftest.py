"""Tracing tests: the SDK's in-memory exporter behind ``NotifyInstrumentor``, and a test
broker per test. Without the SDK (it comes with the dev extra) they are skipped, except in
CI where it must be there."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import IN_CI

try:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
except ImportError:  # pragma: no cover - the dev extra installs it
    if IN_CI:
        raise
    pytest.skip(
        "opentelemetry-sdk is not installed (pip install -e .[dev])", allow_module_level=True
    )


class Spans:
    """The spans exported so far, by name."""

    def __init__(self, exporter: InMemorySpanExporter, provider: TracerProvider):
        self.exporter = exporter
        self.provider = provider
        self.tracer = provider.get_tracer("tests")

    def all(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.all() if s.name == name]

    def one(self, name: str) -> ReadableSpan:
        got = self.named(name)
        assert len(got) == 1, f"{name}: {len(got)} spans; all: {[s.name for s in self.all()]}"
        return got[0]

    def attrs(self, span: ReadableSpan) -> dict[str, Any]:
        return dict(span.attributes or {})


@pytest.fixture
def spans() -> Iterator[Spans]:
    from notify.otel import NotifyInstrumentor, open_transactions

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inst = NotifyInstrumentor()
    inst.instrument(tracer_provider=provider)
    try:
        yield Spans(exporter, provider)
    finally:
        inst.uninstrument()
        provider.shutdown()
    assert open_transactions() == 0
