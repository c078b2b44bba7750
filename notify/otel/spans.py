"""The spans themselves: a tracer, the per-kind span starters, and the transaction spans
kept from begin to commit or rollback."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import Token
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer

from notify.version import __version__

from .semconv import (
    A_BATCH,
    A_GROUP,
    A_MSG_ID,
    A_PARTITION,
    A_SYSTEM,
    A_TX_ID,
    A_TX_KIND,
    SYSTEM,
    attributes,
    extract,
    link,
    message_headers,
    message_id,
    partition_id,
    span_name,
)

#: set while a traced send runs: a send the client makes on the way (a producer's send
#: handing the message to its transaction's) is part of the outer span, not a new one
SENDING: contextvars.ContextVar[bool] = contextvars.ContextVar("notify_otel_sending", default=False)
#: the same for transactions (``transaction()`` begins through ``begin_transaction()``)
BEGINNING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "notify_otel_beginning", default=False
)

#: set while a transaction's ``__exit__`` runs: the commit or rollback it calls leaves the
#: span to the exit, which knows the exception that ended the block
EXITING: contextvars.ContextVar[bool] = contextvars.ContextVar("notify_otel_exiting", default=False)


class State:
    """The instrumentation's tracer (None: off)."""

    tracer: Tracer | None = None


def tracer() -> Tracer | None:
    return State.tracer


def make_tracer(provider: trace.TracerProvider | None) -> Tracer:
    return trace.get_tracer("notify.otel", __version__, tracer_provider=provider)


def fail(span: Span, e: BaseException) -> None:
    span.record_exception(e)
    span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))


@contextmanager
def producer_span(op: str, topic: str, **attrs: Any) -> Iterator[Span | None]:
    """A PRODUCER span (``send``, ``create``) current for the block; None when off."""
    t = State.tracer
    if t is None:
        yield None
        return
    with t.start_as_current_span(
        span_name(op, topic), kind=SpanKind.PRODUCER, attributes=attributes(op, op, topic, **attrs)
    ) as span:
        yield span


def set_result(span: Span | None, result: object) -> None:
    """Partition and message id of a ``SendResult`` (or a batch's partition and count)."""
    if span is None or result is None:
        return
    pid = partition_id(getattr(result, "partition", None))
    if pid is not None:
        span.set_attribute(A_PARTITION, pid)
    mid = message_id(result)
    if mid is not None:
        span.set_attribute(A_MSG_ID, mid)
    if getattr(result, "success", True) is False:
        err = getattr(result, "error", None)
        span.set_status(Status(StatusCode.ERROR, str(err)))


def consumer_attrs(msg: object, group: str | None) -> dict[str, Any]:
    return {
        A_PARTITION: partition_id(getattr(msg, "partition", None)),
        A_MSG_ID: message_id(msg),
        A_GROUP: group,
    }


def start_process(msg: object, group: str | None, op: str = "process") -> Span | None:
    """A CONSUMER span for one message: its parent is the message's creation context
    (one trace from the producer), and it links to it as the conventions ask."""
    t = State.tracer
    if t is None:
        return None
    headers = message_headers(msg)
    parent = extract(headers)
    lk = link(headers)
    topic = getattr(msg, "topic", None)
    return t.start_span(
        span_name(op, topic),
        context=parent,
        kind=SpanKind.CONSUMER,
        links=[lk] if lk is not None else None,
        attributes=attributes(op, "process", topic, **consumer_attrs(msg, group)),
    )


def start_client(
    op: str,
    op_type: str,
    topic: str | None,
    msgs: Sequence[object],
    group: str | None = None,
    start_ns: int | None = None,
) -> Span | None:
    """A CLIENT span (``receive``, settling; CONSUMER for a batch's ``process``) linked to
    every message's creation context."""
    t = State.tracer
    if t is None:
        return None
    kind = SpanKind.CONSUMER if op_type == "process" else SpanKind.CLIENT
    links: list[Link] = [lk for m in msgs if (lk := link(message_headers(m))) is not None]
    extra: dict[str, Any] = {A_GROUP: group}
    if len(msgs) > 1:
        extra[A_BATCH] = len(msgs)
    elif msgs:
        extra.update(consumer_attrs(msgs[0], group))
    return t.start_span(
        span_name(op, topic),
        kind=kind,
        links=links or None,
        attributes=attributes(op, op_type, topic, **extra),
        start_time=start_ns,
    )


# ------------------------------------------------------------------ transactions

_open: dict[int, tuple[Span, Token[Context]]] = {}
_open_lock = threading.Lock()


def begin_transaction(kind: str, key: object = None, topic: str | None = None) -> Span | None:
    """Start a transaction span and make it current (until :func:`end_transaction`)."""
    t = State.tracer
    if t is None:
        return None
    attrs: dict[str, Any] = {A_SYSTEM: SYSTEM, A_TX_KIND: kind}
    if topic is not None:
        attrs["messaging.destination.name"] = topic
    span = t.start_span(f"transaction {kind}", kind=trace.SpanKind.INTERNAL, attributes=attrs)
    if key is not None:
        span.set_attribute(A_TX_ID, str(key))
    return span


def hold(tx: object, span: Span) -> None:
    """Make ``span`` current until ``tx`` ends."""
    token = otel_context.attach(trace.set_span_in_context(span))
    with _open_lock:
        _open[id(tx)] = (span, token)


def end_transaction(tx: object, error: BaseException | None, outcome: str | None = None) -> None:
    """End the span of ``tx`` (once; later calls do nothing)."""
    with _open_lock:
        held = _open.pop(id(tx), None)
    if held is None:
        return
    span, token = held
    otel_context.detach(token)  # logs, never raises
    status = getattr(tx, "status", None)
    if isinstance(status, str):
        span.set_attribute("notify.transaction.outcome", status)
    elif outcome is not None:
        span.set_attribute("notify.transaction.outcome", outcome)
    if error is not None:
        fail(span, error)
    span.end()


def open_transactions() -> int:
    """Transaction spans begun and not ended (for tests)."""
    with _open_lock:
        return len(_open)
