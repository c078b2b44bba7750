"""NotifyInstrumentor through a real broker (the in-process test broker), spans read back
from the SDK's in-memory exporter: one trace from the producer to the consumer, the
messaging attributes, transaction spans over their sends, receive links, the outbox's
create -> relay send -> process chain, and nothing left behind when switched off."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa
from opentelemetry.trace import SpanKind

from notify.client import (
    AsyncMessageSessionFactory,
    ConsumerConfig,
    Message,
    Producer,
    connect,
)
from notify.migrations import upgrade
from notify.outbox import Outbox, RelayConfig
from notify.testing import TestBroker
from notify.xa import (
    BrokerParticipant,
    CoordinatorConfig,
    PostgresParticipant,
    TransactionManager,
)
from tests.coordinator.helpers import create_pg_table
from tests.helpers import wait_until
from tests.otel.conftest import Spans
from tests.services import PostgresServer, fresh_database
from tests.services_conftest import running

FAST_RELAY = RelayConfig(poll_min_s=0.001, poll_max_s=0.01, heartbeat_s=0.2, instance_ttl_s=1.0)


def _consumer(session, tmp_path: Path, group: str = "g"):  # type: ignore[no-untyped-def]
    return session.create_consumer(ConsumerConfig(group=group, data_dir=tmp_path / group))


def test_one_trace_from_the_producer_to_the_consumer(
    spans: Spans, notify_broker: TestBroker, tmp_path: Path
) -> None:
    got: list[Message] = []
    done = threading.Event()

    def listener(msg: Message) -> None:
        with spans.tracer.start_as_current_span("handle order"):
            got.append(msg)
        done.set()

    with connect([notify_broker.address]) as session:
        with spans.tracer.start_as_current_span("request"):
            result = session.create_producer().send(
                "orders", b"o-1", key="k", headers={"app": "shop"}
            )
        consumer = _consumer(session, tmp_path, "billing")
        consumer.subscribe("orders", listener).complete_subscribe()
        assert done.wait(20)
        consumer.close()

    request, send = spans.one("request"), spans.one("send orders")
    process, handle = spans.one("process orders"), spans.one("handle order")
    # one trace: request -> send -> process -> the application's own span
    trace_id = request.context.trace_id
    assert {s.context.trace_id for s in (send, process, handle)} == {trace_id}
    assert send.parent is not None and send.parent.span_id == request.context.span_id
    assert process.parent is not None and process.parent.span_id == send.context.span_id
    assert handle.parent is not None and handle.parent.span_id == process.context.span_id
    assert [lk.context.span_id for lk in process.links] == [send.context.span_id]
    assert send.kind is SpanKind.PRODUCER and process.kind is SpanKind.CONSUMER
    pid = f"{result.partition.broker_id}-{result.partition.partition}"
    assert spans.attrs(send) == {
        "messaging.system": "notify",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "orders",
        "messaging.destination.partition.id": pid,
        "messaging.message.id": str(result.msg_id),
    }
    assert spans.attrs(process) == {
        "messaging.system": "notify",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "orders",
        "messaging.destination.partition.id": pid,
        "messaging.message.id": str(result.msg_id),
        "messaging.consumer.group.name": "billing",
    }
    # the application's headers are kept beside the trace context
    assert got[0].headers["app"] == "shop"
    assert got[0].headers["traceparent"].split("-")[1] == f"{trace_id:032x}"


def test_a_transaction_span_parents_its_sends(
    spans: Spans, notify_broker: TestBroker, tmp_path: Path
) -> None:
    with connect([notify_broker.address]) as session:
        producer = session.create_producer()
        with producer.transaction(timeout=10):
            producer.send("orders", b"o-1")
            producer.send("audit", b"o-1 created")
        with pytest.raises(RuntimeError), producer.transaction(timeout=10):
            producer.send("orders", b"o-2")
            raise RuntimeError("the application changed its mind")
        seen = [m.data for m in _consumer(session, tmp_path).messages("orders", 0.5)]
    assert seen == [b"o-1"]
    committed, rolled_back = spans.named("transaction local")
    sends = spans.named("send orders") + spans.named("send audit")
    assert len(sends) == 3
    by_parent = {s.name + s.attributes.get("messaging.destination.name", ""): s for s in sends}
    assert by_parent
    children = [s for s in sends if s.parent and s.parent.span_id == committed.context.span_id]
    assert sorted(s.name for s in children) == ["send audit", "send orders"]
    assert [s.parent.span_id for s in sends if s not in children] == [  # type: ignore[union-attr]
        rolled_back.context.span_id
    ]
    assert spans.attrs(committed)["notify.transaction.kind"] == "local"
    assert spans.attrs(committed)["notify.transaction.outcome"] == "committed"
    assert rolled_back.status.status_code.name == "ERROR"
    assert "RuntimeError" in str(rolled_back.status.description)
    # each message consumed continues its send's trace (one process span for o-1)
    process = spans.one("process orders")
    o1 = next(s for s in children if s.name == "send orders")
    assert process.parent is not None and process.parent.span_id == o1.context.span_id


def test_a_fetch_links_every_message_it_receives(
    spans: Spans, notify_broker: TestBroker, tmp_path: Path
) -> None:
    with connect([notify_broker.address]) as session:
        producer = session.create_producer()
        for i in range(3):
            producer.send("batch", b"m%d" % i)
        consumer = _consumer(session, tmp_path)
        got = consumer.fetch("batch", max_wait_s=5)
        assert len(got) == 3
    receive = spans.one("receive batch")
    assert receive.kind is SpanKind.CLIENT
    assert spans.attrs(receive)["messaging.batch.message_count"] == 3
    sends = spans.named("send batch")
    assert {lk.context.span_id for lk in receive.links} == {s.context.span_id for s in sends}


def test_the_outbox_carries_the_trace_from_the_request_to_the_consumer(
    spans: Spans, notify_broker: TestBroker, tmp_path: Path
) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    upgrade(engine)
    outbox = Outbox(engine)
    with connect([notify_broker.address]) as session:
        with spans.tracer.start_as_current_span("POST /orders"), engine.begin() as conn:
            outbox.send(conn, "orders", b"order 42", key="42")
        with outbox.relay(session, FAST_RELAY):
            consumer = _consumer(session, tmp_path)
            seen = [m.data for m in consumer.messages("orders", 2.0)]
            wait_until(lambda: spans.named("send orders") != [], timeout=10, what="relay span")
    engine.dispose()
    assert seen == [b"order 42"]
    request, create = spans.one("POST /orders"), spans.one("create orders")
    relay_send, process = spans.one("send orders"), spans.one("process orders")
    assert create.parent is not None and create.parent.span_id == request.context.span_id
    assert spans.attrs(create)["messaging.operation.type"] == "create"
    # the relay publishes on its own thread: its span links to the row's transaction
    assert [lk.context.span_id for lk in relay_send.links] == [create.context.span_id]
    assert relay_send.kind is SpanKind.PRODUCER
    # and the consumer continues the request's trace
    assert process.context.trace_id == request.context.trace_id
    assert process.parent is not None and process.parent.span_id == create.context.span_id


def test_uninstrument_puts_everything_back(notify_broker: TestBroker) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from notify.client import Producer
    from notify.otel import NotifyInstrumentor

    before = Producer.__dict__["send"]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    inst = NotifyInstrumentor()
    inst.instrument(tracer_provider=provider)
    inst.instrument(tracer_provider=provider)  # twice: still one wrapper
    assert Producer.__dict__["send"].__wrapped__ is before
    inst.uninstrument()
    assert Producer.__dict__["send"] is before and not inst.is_instrumented_by_opentelemetry
    with connect([notify_broker.address]) as session:
        session.create_producer().send("orders", b"x")
    assert exporter.get_finished_spans() == ()


def test_nothing_of_opentelemetry_is_loaded_when_tracing_is_off(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from notify.client import connect\n"
        "from notify.outbox import Outbox\n"
        "from notify.testing import broker\n"
        "with broker() as b, connect([b.address]) as s:\n"
        "    assert s.create_producer().send('t', b'x').success\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "[]"


def test_an_xa_transaction_spans_its_branches_and_decision(
    spans: Spans, notify_broker: TestBroker, tmp_path: Path, postgres: PostgresServer
) -> None:
    url = fresh_database(running(postgres), "otel")
    dsn = create_pg_table(url)
    tm = TransactionManager(
        CoordinatorConfig(tmp_path / "xa", coordinator_id="t1", recovery_interval_s=0)
    )
    tm.register("pg", lambda: PostgresParticipant(dsn))
    tm.register("broker", lambda: BrokerParticipant(notify_broker.address))
    tm.start()
    try:
        with tm.transaction(timeout=10) as tx:
            tx.enlist("pg").execute("INSERT INTO orders (id) VALUES (1)")
            tx.enlist("broker").send("orders", b"1")
    finally:
        tm.close()
    xa_tx = spans.one("transaction xa")
    assert spans.attrs(xa_tx)["notify.transaction.outcome"] == "committed"
    inside = [s for s in spans.all() if s.parent and s.parent.span_id == xa_tx.context.span_id]
    names = [s.name for s in sorted(inside, key=lambda s: s.start_time or 0)]
    assert names == ["send orders", "xa prepare", "xa prepare", "xa decision", "xa commit",
                     "xa commit"]  # fmt: skip
    branches = {spans.attrs(s)["notify.xa.participant"] for s in inside if s.name == "xa commit"}
    assert branches == {"PostgresParticipant", "BrokerParticipant"}
    assert all(spans.attrs(s)["notify.xa.vote"] == "ok" for s in spans.named("xa prepare"))


def test_a_queue_consumer_receives_processes_and_settles_in_the_senders_trace(
    spans: Spans, notify_broker: TestBroker
) -> None:
    with connect([notify_broker.address]) as session:
        producer = session.create_producer()
        for i in range(2):
            producer.send("jobs", b"j%d" % i)
        pulled = session.create_queue_consumer("jobs", "workers", credit=1)
        first = pulled.get(timeout_s=10)
        assert first is not None and first.ack()
        second = pulled.get(timeout_s=10)
        assert second is not None and second.release()
        pulled.close()
        done = threading.Event()
        batches: list[int] = []

        def batch_listener(msgs: list[object]) -> None:
            batches.append(len(msgs))
            done.set()

        pushed = session.create_queue_consumer("jobs", "workers", batch_listener=batch_listener)
        assert done.wait(10)
        pushed.close()
    send_ids = {s.context.span_id for s in spans.named("send jobs")}
    receives, ack = spans.named("receive jobs"), spans.one("ack jobs")
    release = spans.one("release jobs")
    assert len(receives) == 2 and all(r.kind is SpanKind.CLIENT for r in receives)
    assert spans.attrs(ack)["messaging.operation.type"] == "settle"
    assert spans.attrs(ack)["messaging.consumer.group.name"] == "workers"
    for span in (*receives, ack, release):
        assert len(span.links) == 1 and span.links[0].context.span_id in send_ids
    batch = spans.one("process jobs")
    assert batch.kind is SpanKind.CONSUMER and sum(batches) == 1  # the released one
    assert {lk.context.span_id for lk in batch.links} <= send_ids


@pytest.mark.skipif(
    not hasattr(Producer, "half_message"),
    reason="half_message() comes with the client core",
)
def test_a_half_message_block_spans_its_message_and_the_consumer_continues(
    spans: Spans, notify_broker: TestBroker, tmp_path: Path
) -> None:
    from notify.client import LocalTxState

    with connect([notify_broker.address]) as session:
        producer = session.create_transactional_producer("shop", lambda msg: LocalTxState.ROLLBACK)
        with spans.tracer.start_as_current_span("POST /orders"):
            with producer.half_message("orders", b"o-1", key="k") as half:
                half.prepared()
                with spans.tracer.start_as_current_span("save order"):
                    pass
            with pytest.raises(RuntimeError), producer.half_message("orders", b"o-2") as half:
                raise RuntimeError("the order was not saved")
        seen = [m.data for m in _consumer(session, tmp_path).messages("orders", 0.5)]
    assert seen == [b"o-1"]
    committed, rolled_back = spans.named("transaction half")
    request, save = spans.one("POST /orders"), spans.one("save order")
    send = [s for s in spans.named("send orders") if s.parent.span_id == committed.context.span_id]
    assert len(send) == 1 and send[0].kind is SpanKind.PRODUCER
    assert committed.parent is not None and committed.parent.span_id == request.context.span_id
    assert save.parent is not None and save.parent.span_id == committed.context.span_id
    assert rolled_back.status.status_code.name == "ERROR"
    process = spans.one("process orders")
    assert process.parent is not None and process.parent.span_id == send[0].context.span_id


def test_the_asyncio_api_traces_transactions_sends_and_iterations(
    spans: Spans, notify_broker: TestBroker, tmp_path: Path
) -> None:
    async def run() -> list[bytes]:
        async with AsyncMessageSessionFactory([notify_broker.address]) as session:
            producer = session.create_producer()
            with spans.tracer.start_as_current_span("request"):
                async with producer.transaction(timeout=10):
                    await producer.send("orders", b"a-1")
                await producer.send("orders", b"a-2")
            consumer = session.create_consumer(ConsumerConfig(group="g", data_dir=tmp_path / "g"))
            got = []
            async for msg in consumer.messages("orders", idle_timeout_s=0.5):
                with spans.tracer.start_as_current_span("handle"):
                    got.append(msg.data)
            await consumer.close()
            return got

    assert asyncio.run(run()) == [b"a-1", b"a-2"]
    request, tx = spans.one("request"), spans.one("transaction local")
    sends = sorted(spans.named("send orders"), key=lambda s: s.start_time or 0)
    assert tx.parent is not None and tx.parent.span_id == request.context.span_id
    assert [s.parent.span_id for s in sends if s.parent] == [
        tx.context.span_id,
        request.context.span_id,
    ]
    processes = sorted(spans.named("process orders"), key=lambda s: s.start_time or 0)
    handles = sorted(spans.named("handle"), key=lambda s: s.start_time or 0)
    assert [p.parent.span_id for p in processes if p.parent] == [s.context.span_id for s in sends]
    assert [h.parent.span_id for h in handles if h.parent] == [p.context.span_id for p in processes]
    assert {s.context.trace_id for s in spans.all()} == {request.context.trace_id}


def test_queued_sends_carry_the_trace_and_their_spans_end_with_the_result(
    spans: Spans, notify_broker: TestBroker, tmp_path: Path
) -> None:
    """``send_future``, ``post`` and ``send_delayed`` (blocking API), ``send_nowait`` and
    ``post`` (asyncio): each message carries its span's context to the consumer; a queued
    send's span ends with its result (partition and message id), a post is a ``create``."""
    with connect([notify_broker.address]) as session:
        producer = session.create_producer()
        with spans.tracer.start_as_current_span("request"):
            fut = producer.send_future("orders", b"future", key="k")
            producer.post("orders", b"post", key="k")
            producer.send_delayed("orders", b"delayed", delay=0.01, key="k")
            batch = producer.send_batch_future("orders", [b"b1", b"b2"], key="k")
        result = fut.result(20)
        batch.result(20)
        producer.flush(20)

    async def queued() -> None:
        async with AsyncMessageSessionFactory([notify_broker.address]) as s:
            p = s.create_producer()
            with spans.tracer.start_as_current_span("request"):
                await p.send_nowait("orders", b"nowait", key="k")
                p.post("orders", b"apost", key="k")
                await p.flush()

    asyncio.run(queued())
    with connect([notify_broker.address]) as session:
        consumer = _consumer(session, tmp_path)
        got = {m.data: m for m in consumer.messages("orders", idle_timeout_s=1.0)}
        consumer.close()
    assert set(got) == {b"future", b"post", b"delayed", b"b1", b"b2", b"nowait", b"apost"}
    requests = spans.named("request")
    by_span = {s.context.span_id: s for s in spans.all()}
    for body in (b"future", b"post", b"delayed", b"nowait", b"apost"):
        parent = got[body].headers["traceparent"].split("-")
        span = by_span[int(parent[2], 16)]
        assert span.parent is not None
        assert span.parent.span_id in {r.context.span_id for r in requests}, body
        assert span.name == ("create orders" if body in (b"post", b"apost") else "send orders")
        assert span.end_time is not None
    future_span = next(
        s
        for s in spans.named("send orders")
        if s.attributes.get("messaging.message.id") == str(result.msg_id)
    )
    pid = f"{result.partition.broker_id}-{result.partition.partition}"
    assert future_span.attributes["messaging.destination.partition.id"] == pid
    batches = [
        s
        for s in spans.named("send orders")
        if "messaging.batch.message_count" in (s.attributes or {})
    ]
    assert [s.attributes["messaging.batch.message_count"] for s in batches] == [2]
    assert "traceparent" not in (got[b"b1"].headers or {})
