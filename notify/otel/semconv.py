"""The OpenTelemetry messaging semantic conventions as notify uses them, and the W3C trace
context in message headers.

Spans are named ``{operation} {destination}`` (``send orders``, ``process orders``); their
attributes::

    messaging.system                      "notify"
    messaging.operation.name              send | create | receive | process | ack |
                                          release | reject | prepare | commit | rollback
    messaging.operation.type              create | send | receive | process | settle
    messaging.destination.name            the topic
    messaging.destination.partition.id    "<brokerId>-<partition>"
    messaging.message.id                  the broker's message id (decimal)
    messaging.consumer.group.name         the consumer's group
    messaging.batch.message_count         messages of a batch (2 or more)
    notify.transaction.kind               local | outbox | half | xa (transaction spans)
    notify.transaction.id                 the transaction's key or xid

Span kinds: send and create PRODUCER, receive and settle CLIENT, process CONSUMER,
transactions INTERNAL. The creation context travels in the message's headers
(``traceparent``, ``tracestate``: W3C Trace Context, through the global propagator); MetaQ
clients ignore headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.trace import Link, get_current_span

from notify.protocol.properties import decode_attribute
from notify.protocol.records import split_payload

SYSTEM: Final = "notify"
A_SYSTEM: Final = "messaging.system"
A_OP_NAME: Final = "messaging.operation.name"
A_OP_TYPE: Final = "messaging.operation.type"
A_DEST: Final = "messaging.destination.name"
A_PARTITION: Final = "messaging.destination.partition.id"
A_MSG_ID: Final = "messaging.message.id"
A_GROUP: Final = "messaging.consumer.group.name"
A_BATCH: Final = "messaging.batch.message_count"
A_TX_KIND: Final = "notify.transaction.kind"
A_TX_ID: Final = "notify.transaction.id"
A_XA_BRANCH: Final = "notify.xa.participant"

#: the header names the propagator writes are the only ones read back
TRACE_HEADERS: Final = ("traceparent", "tracestate")


def attributes(op_name: str, op_type: str, topic: str | None, **more: Any) -> dict[str, Any]:
    """The common attributes of a messaging span (``None`` values left out)."""
    out: dict[str, Any] = {A_SYSTEM: SYSTEM, A_OP_NAME: op_name, A_OP_TYPE: op_type}
    if topic is not None:
        out[A_DEST] = topic
    out.update((k, v) for k, v in more.items() if v is not None)
    return out


def span_name(op_name: str, topic: str | None) -> str:
    """``{operation} {destination}`` (the operation alone without one)."""
    return op_name if topic is None else f"{op_name} {topic}"


def inject(headers: Mapping[str, Any] | None, context: Context | None = None) -> dict[str, Any]:
    """A copy of ``headers`` with the trace context of ``context`` (default: the current
    one) added; the application's own values are kept."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=context)
    out = dict(headers or {})
    for k, v in carrier.items():
        out.setdefault(k, v)
    return out


def extract(headers: Mapping[str, Any]) -> Context | None:
    """The creation context a message's headers carry, or None."""
    carrier = {k: v for k in TRACE_HEADERS if isinstance(v := headers.get(k), str)}
    if "traceparent" not in carrier:
        return None
    ctx = propagate.extract(carrier)
    return ctx if get_current_span(ctx).get_span_context().is_valid else None


def link(headers: Mapping[str, Any]) -> Link | None:
    """A link to the creation context in ``headers``, or None."""
    ctx = extract(headers)
    return None if ctx is None else Link(get_current_span(ctx).get_span_context())


def record_headers(flag: int, payload: bytes) -> dict[str, Any]:
    """The headers of a record as stored (``(flag, payload)``); {} when it has none or
    they cannot be read (a message is never refused for its trace context)."""
    try:
        text, _body = split_payload(payload, flag)
        return dict(decode_attribute(text, flag).headers)
    except (ValueError, TypeError):
        return {}


def message_headers(msg: object) -> dict[str, Any]:
    """The headers of a consumed message (a client ``Message`` or a queue message)."""
    try:
        h = getattr(msg, "headers", None)
        if isinstance(h, Mapping):
            return dict(h)
        flag, payload = getattr(msg, "flag", None), getattr(msg, "payload", None)
        if isinstance(flag, int) and isinstance(payload, bytes | bytearray | memoryview):
            return record_headers(flag, bytes(payload))
    except Exception:
        return {}
    return {}


def message_id(msg: object) -> str | None:
    v = getattr(msg, "msg_id", None)
    return str(v) if isinstance(v, int) and v >= 0 else None


def partition_id(p: object) -> str | None:
    """``"<brokerId>-<partition>"`` of a client ``Partition`` (or a partition number)."""
    if p is None:
        return None
    bid, num = getattr(p, "broker_id", None), getattr(p, "partition", None)
    if isinstance(bid, int) and isinstance(num, int):
        return f"{bid}-{num}"
    return str(p)
