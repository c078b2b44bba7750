"""The tracing guide's picture: an outbox transaction from the request to the consumer,
traced for real and drawn from the spans exported.

An application handles ``POST /orders``: in one SQLite transaction it stores the order and
writes the message with ``Outbox.send``; the relay publishes the row to a test broker; a
consumer processes it and does its own work. Every span comes from
:class:`notify.otel.NotifyInstrumentor` (or the application's own tracer) through the SDK's
in-memory exporter; the script draws them as a Gantt chart (one row per span, links as
dashed arrows) into ``docs/guides/img/outbox-trace.png`` and prints them.

    .venv/bin/python bench/trace_picture.py       # needs matplotlib (the bench extra)
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import sqlalchemy as sa
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from notify.client import ConsumerConfig, Message, connect
from notify.migrations import upgrade
from notify.otel import NotifyInstrumentor
from notify.outbox import Outbox, RelayConfig
from notify.testing import broker

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "guides" / "img" / "outbox-trace.png"


def run(tmp: Path) -> list[ReadableSpan]:
    """Trace one order through the outbox; the spans exported."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    NotifyInstrumentor().instrument(tracer_provider=provider)
    app = provider.get_tracer("shop")
    engine = sa.create_engine(f"sqlite:///{tmp / 'shop.db'}")
    upgrade(engine)
    orders = sa.Table(
        "orders", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("item", sa.String(50)),
    )  # fmt: skip
    orders.metadata.create_all(engine)
    outbox = Outbox(engine)
    handled = threading.Event()

    def ship(msg: Message) -> None:
        with app.start_as_current_span("ship order"):
            time.sleep(0.002)  # the consumer's own work
        handled.set()

    with broker() as b, connect([b.address]) as session:
        consumer = session.create_consumer(ConsumerConfig(group="shipping", data_dir=tmp / "c"))
        consumer.subscribe("orders", ship).complete_subscribe()
        relay = outbox.relay(session, RelayConfig(poll_min_s=0.001, poll_max_s=0.005))
        with relay:
            with app.start_as_current_span("POST /orders", kind=SpanKind.SERVER):
                with app.start_as_current_span("db transaction"), engine.begin() as conn:
                    conn.execute(orders.insert().values(id=42, item="book"))
                    outbox.send(conn, "orders", b"order 42", key="42")
                time.sleep(0.001)  # the response is written
            if not handled.wait(20):
                raise SystemExit("the order was not consumed within 20 s")
        consumer.close()
    NotifyInstrumentor().uninstrument()
    engine.dispose()
    return list(exporter.get_finished_spans())


def draw(spans: list[ReadableSpan], out: Path) -> None:
    keep = [s for s in spans if s.start_time and s.end_time]
    keep.sort(key=lambda s: s.start_time or 0)
    t0 = min(s.start_time or 0 for s in keep)
    rows = {s.context.span_id: i for i, s in enumerate(keep)}
    trace_no: dict[int, int] = {}
    for s in keep:
        trace_no.setdefault(s.context.trace_id, len(trace_no) + 1)
    colors = {"SERVER": "#5c6bc0", "INTERNAL": "#90a4ae", "PRODUCER": "#43a047",
              "CONSUMER": "#fb8c00", "CLIENT": "#8e24aa"}  # fmt: skip
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(keep) + 1.4))
    for i, s in enumerate(keep):
        start = ((s.start_time or 0) - t0) / 1e6
        width = max(((s.end_time or 0) - (s.start_time or 0)) / 1e6, 0.05)
        kind = s.kind.name
        ax.barh(i, width, left=start, color=colors.get(kind, "#90a4ae"), height=0.6)
        depth = 0
        p = s.parent
        by_id = {x.context.span_id: x for x in keep}
        while p is not None and p.span_id in by_id:
            depth += 1
            p = by_id[p.span_id].parent
        ax.text(start + width + 0.6, i, f"{s.name}  ({kind.lower()}, {width:.1f} ms, "
                f"trace {trace_no[s.context.trace_id]}, depth {depth})", va="center",
                fontsize=8)  # fmt: skip
        for lk in s.links:
            j = rows.get(lk.context.span_id)
            if j is not None:
                src = keep[j]
                x0 = ((src.start_time or 0) - t0) / 1e6
                arrow = {"arrowstyle": "->", "linestyle": "--", "color": "#555"}
                ax.annotate("", xy=(start, i), xytext=(x0, j), arrowprops=arrow)
    ax.set_yticks([])
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds since the request began")
    end = max(((s.end_time or 0) - t0) / 1e6 for s in keep)
    ax.set_xlim(0, end * 1.75)
    traces = {s.context.trace_id for s in keep}
    ax.set_title(f"POST /orders through the outbox: {len(keep)} spans, {len(traces)} traces "
                 "(the relay's send is linked, dashed)", fontsize=10)  # fmt: skip
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, [k.lower() for k in colors], loc="upper right", fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spans = run(Path(tmp))
    t0 = min(s.start_time or 0 for s in spans)
    for s in sorted(spans, key=lambda s: s.start_time or 0):
        parent = f"{s.parent.span_id:016x}" if s.parent else "-"
        print(
            f"{((s.start_time or 0) - t0) / 1e6:8.2f} ms {s.name:24} {s.kind.name:9} "
            f"trace {s.context.trace_id:032x} span {s.context.span_id:016x} parent {parent} "
            f"links {len(s.links)}"
        )
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    draw(spans, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
