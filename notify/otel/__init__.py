"""OpenTelemetry tracing for notify (``pip install notify[otel]``; the API only).

::

    from notify.otel import NotifyInstrumentor
    NotifyInstrumentor().instrument()          # tracer_provider=... optional
    ...
    NotifyInstrumentor().uninstrument()

Nothing of OpenTelemetry is imported, and nothing is spent, until this module is imported
and :meth:`NotifyInstrumentor.instrument` called: the instrumentation wraps the public
methods of the client (producers, consumers, transactions, queue consumers), of the outbox
(``Outbox.send``, the relay's publisher) and of the XA coordinator, and
:meth:`~NotifyInstrumentor.uninstrument` puts them back.

Spans follow the OpenTelemetry messaging semantic conventions (:mod:`notify.otel.semconv`
lists names and attributes). The trace context travels in the message headers
(``traceparent``): a consumer's ``process`` span is a child of the message's creation
context and links to it, a receive of several messages links to each, and an outbox row
carries the context of the transaction that wrote it, so the relay's ``send`` links to it
and the consumer continues the application's trace.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.trace import TracerProvider

from notify import client
from notify import xa as notify_xa
from notify.outbox import Outbox, Relay

from . import consumers, coordinator, producers, spans
from .patching import Patches
from .spans import open_transactions

__all__ = ["NotifyInstrumentor", "open_transactions"]

_lock = threading.Lock()
_patches = Patches()


def _producers(p: Patches) -> None:
    for cls in (client.Producer, client.Transaction):
        p.wrap(cls, "send", producers.send_sync)
        p.wrap(cls, "send_batch", producers.batch_sync)
    for acls in (client.AsyncProducer, client.AsyncTransaction):
        p.wrap(acls, "send", producers.send_async)
        p.wrap(acls, "send_batch", producers.batch_async)
    p.wrap(client.Producer, "send_delayed", producers.send_sync)
    p.wrap(client.AsyncProducer, "send_delayed", producers.send_async)
    p.wrap(client.Producer, "send_future", producers.send_later)
    p.wrap(client.AsyncProducer, "send_nowait", producers.send_later)
    p.wrap(client.Producer, "send_batch_future", producers.batch_later)
    p.wrap(client.AsyncProducer, "send_batch_nowait", producers.batch_later)
    for pcls in (client.Producer, client.AsyncProducer):
        p.wrap(pcls, "post", producers.post)
        p.wrap(pcls, "transaction", producers.begin)
        p.wrap(pcls, "begin_transaction", producers.begin)
        p.wrap(pcls, "half_message", producers.half_message)
    p.wrap(client.Producer, "send_in_transaction", producers.in_transaction_sync)
    p.wrap(client.AsyncProducer, "send_in_transaction", producers.in_transaction_async)
    for name in ("commit", "rollback", "__exit__"):
        p.wrap(client.Transaction, name, producers.end_sync)
    for name in ("commit", "rollback", "__aexit__"):
        p.wrap(client.AsyncTransaction, name, producers.end_async)
    p.wrap(Outbox, "send", producers.outbox_send)
    p.wrap(Relay, "start", producers.relay_start)


def _consumers(p: Patches) -> None:
    p.wrap(client.Consumer, "subscribe", consumers.subscribe)
    p.wrap(client.AsyncConsumer, "subscribe", consumers.subscribe)
    p.wrap(client.Consumer, "messages", consumers.messages_sync)
    p.wrap(client.AsyncConsumer, "messages", consumers.messages_async)
    p.wrap(client.Consumer, "fetch", consumers.fetch_sync)
    p.wrap(client.AsyncConsumer, "fetch", consumers.fetch_async)
    p.wrap(client.MessageSessionFactory, "create_queue_consumer", consumers.queue_consumer)
    p.wrap(client.AsyncMessageSessionFactory, "create_queue_consumer", consumers.queue_consumer)
    p.wrap(client.QueueConsumer, "get", consumers.queue_get_sync)
    p.wrap(client.QueueConsumer, "messages", consumers.messages_sync)
    p.wrap(client.AsyncQueueConsumer, "get", consumers.queue_get_async)
    for name in ("ack", "release", "reject"):
        p.wrap(client.SyncQueueMessage, name, consumers.settle_sync)
        p.wrap(client.QueueMessage, name, consumers.settle_async)


def _xa(p: Patches) -> None:
    xa = notify_xa
    p.wrap(xa.TransactionManager, "begin", coordinator.begin)
    p.wrap(xa.Transaction, "commit", coordinator.end)
    p.wrap(xa.Transaction, "rollback", coordinator.end)
    for cls in (
        xa.BrokerParticipant,
        xa.PostgresParticipant,
        xa.MySQLParticipant,
        xa.SQLAlchemyParticipant,
    ):
        for name in ("prepare", "commit", "rollback"):
            p.wrap(cls, name, coordinator.branch)
    p.wrap(xa.DecisionLog, "decide", coordinator.decide)
    p.wrap(xa.BrokerProducer, "send", producers.send_plain)


class NotifyInstrumentor:
    """Switches notify's tracing on and off for the whole process (all instances share
    one state, as OpenTelemetry instrumentors do)."""

    def instrument(self, tracer_provider: TracerProvider | None = None, **_: Any) -> None:
        """Trace notify with ``tracer_provider`` (default: the global one). Calling it
        again while on changes the provider only."""
        with _lock:
            spans.State.tracer = spans.make_tracer(tracer_provider)
            if len(_patches):
                return
            _producers(_patches)
            _consumers(_patches)
            _xa(_patches)

    def uninstrument(self, **_: Any) -> None:
        """Put every wrapped method back; spans already started end normally."""
        with _lock:
            spans.State.tracer = None
            _patches.restore()

    @property
    def is_instrumented_by_opentelemetry(self) -> bool:
        """Whether tracing is on."""
        return spans.State.tracer is not None
