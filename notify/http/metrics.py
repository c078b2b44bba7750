"""``/metrics``: the broker's live counters in Prometheus' text format.

One :class:`CollectorRegistry` per broker (several brokers may share a process in tests).
A custom collector reads the counters the broker keeps anyway at scrape time, on the event
loop that owns them, into a snapshot; the text is rendered from it in a worker thread, so a
big scrape does not stall the loop. Per-group series are capped at
``metricsMaxConsumerSeries`` (``notify_consumer_series_dropped`` counts the rest). Only the
fsync latency histogram is fed as fsyncs complete, through the
flusher's ``on_fsync`` hook. Counters restart from zero after ``stats reset`` (Prometheus'
``rate()`` treats that as a counter reset). Replication metrics appear only where there is
replication to measure: an async slave's lag, a master's synchronous slave; a plain master
exports its role and nothing else about replication.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from notify.broker.authlog import auth_failures_total
from notify.core.states import TxState
from notify.http.views import replication_view
from notify.version import __version__

if TYPE_CHECKING:
    from notify.http.host import BrokerHost

FSYNC_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


class BrokerCollector(Collector):
    """Everything but the fsync histogram, read from the live broker at scrape time."""

    def __init__(self, broker: BrokerHost, http_refused: Callable[[], int] | None = None):
        self.broker = broker
        self.http_refused = http_refused

    def collect(self) -> Iterator[Metric]:
        for item in self.collect_deferred():
            if isinstance(item, _GroupSnapshot):
                yield from item.families()
            else:
                yield item

    def collect_deferred(self) -> Iterator[Metric | _GroupSnapshot]:
        """The families, except the per-group ones: a cheap copy of the group positions
        stands in their place, to be turned into families off the loop (they may be tens of
        thousands of series)."""
        service = self.broker.service
        if service is None:
            return
        st = service.stats
        bid = str(self.broker.config.system.broker_id)
        info = GaugeMetricFamily(
            "notify_build_info", "Broker version and id", labels=["version", "broker_id"]
        )
        info.add_metric([__version__, bid], 1)
        yield info
        yield GaugeMetricFamily(
            "notify_start_time_seconds", "Unix time the broker's counters started", st.started
        )
        yield GaugeMetricFamily(
            "notify_connections_open", "Open wire connections", st.connections_current
        )
        yield CounterMetricFamily(
            "notify_connections", "Wire connections accepted", st.connections_total
        )
        yield CounterMetricFamily(
            "notify_connections_refused",
            "Connections refused (maxConnections)",
            st.connections_refused,
        )
        cmds = CounterMetricFamily("notify_commands", "Requests handled", labels=["command"])
        for name, value in (
            ("put", st.cmd_put),
            ("mput", st.cmd_mput),
            ("get", st.cmd_get),
            ("offset", st.cmd_offset),
            ("other", st.cmd_other),
        ):
            cmds.add_metric([name], value)
        yield cmds
        yield CounterMetricFamily(
            "notify_protocol_errors", "Malformed requests", st.protocol_errors
        )
        yield CounterMetricFamily(
            "notify_auth_failures",
            "Failed authentications, wire and HTTP (per process)",
            auth_failures_total(),
        )
        if self.http_refused is not None:
            yield CounterMetricFamily(
                "notify_http_connections_refused",
                "HTTP connections refused (httpMaxConnections)",
                self.http_refused(),
            )

        labels = ["topic"]
        put_msgs = CounterMetricFamily("notify_put_messages", "Messages stored", labels=labels)
        put_bytes = CounterMetricFamily("notify_put_bytes", "Payload bytes stored", labels=labels)
        put_failed = CounterMetricFamily("notify_put_failed", "Puts refused", labels=labels)
        get_reqs = CounterMetricFamily("notify_get_requests", "Fetches", labels=labels)
        get_miss = CounterMetricFamily(
            "notify_get_misses", "Fetches that found no message", labels=labels
        )
        get_bytes = CounterMetricFamily("notify_get_bytes", "Bytes served", labels=labels)
        for topic in sorted(service.store.topics):
            tc = st.topic(topic)
            put_msgs.add_metric([topic], tc.put_messages)
            put_bytes.add_metric([topic], tc.put_bytes)
            put_failed.add_metric([topic], tc.put_failed)
            get_reqs.add_metric([topic], tc.get_requests)
            get_miss.add_metric([topic], tc.get_misses)
            get_bytes.add_metric([topic], tc.get_bytes)
        yield from (put_msgs, put_bytes, put_failed, get_reqs, get_miss, get_bytes)

        plabels = ["topic", "partition"]
        max_off = GaugeMetricFamily(
            "notify_partition_max_offset", "Visible end offset (bytes)", labels=plabels
        )
        min_off = GaugeMetricFamily(
            "notify_partition_min_offset", "First offset still stored", labels=plabels
        )
        size = GaugeMetricFamily(
            "notify_partition_size_bytes", "Bytes stored in the partition", labels=plabels
        )
        unflushed = GaugeMetricFamily(
            "notify_partition_unflushed_bytes",
            "Bytes written but not yet fsynced",
            labels=plabels,
        )
        segments = GaugeMetricFamily("notify_partition_segments", "Segment files", labels=plabels)
        for part in service.store.all_partitions():
            lv = [part.topic, str(part.index)]
            max_off.add_metric(lv, part.visible_end)
            min_off.add_metric(lv, part.min_offset)
            size.add_metric(lv, part.visible_end - part.min_offset)
            unflushed.add_metric(lv, part.end - part.flushed_end)
            segments.add_metric(lv, len(part.segments))
        yield from (max_off, min_off, size, unflushed, segments)

        yield CounterMetricFamily("notify_fsyncs", "fsyncs completed", service.flusher.fsyncs)

        parts: list[tuple[str, int, int, list[tuple[str, tuple[int, float]]]]] = []
        for (topic, index), seen in service.consumer_positions.items():
            where = service.store.get(topic, index)
            if where is not None:
                parts.append((topic, index, where.visible_end, list(seen.items())))
        yield _GroupSnapshot(
            parts,
            self.broker.config.system.metrics_max_consumer_series,
            len(service.consumer_positions),
        )

        yield from self._replication()

        tm = service.transactions
        if tm is not None:
            states = GaugeMetricFamily(
                "notify_transactions",
                "Transactions known to the broker, by state",
                labels=["state"],
            )
            counts = dict.fromkeys((s.value for s in TxState), 0)
            for tx in tm.txs.values():
                counts[tx.state.value] += 1
            for state, n in counts.items():
                states.add_metric([state], n)
            yield states
            outcomes = CounterMetricFamily(
                "notify_transaction_outcomes",
                "Transactions finished, by outcome",
                labels=["outcome"],
            )
            s = tm.stats
            for name, value in (
                ("begun", s.begun),
                ("committed", s.committed),
                ("rolled_back", s.rolled_back),
                ("timed_out", s.timed_out),
                ("connection_rollbacks", s.connection_rollbacks),
            ):
                outcomes.add_metric([name], value)
            yield outcomes

    def _replication(self) -> Iterator[Metric]:
        """The role; an async slave's lag; a master's synchronous slave. Only what this
        broker really measures: nothing for a master without a synchronous slave."""
        rep = replication_view(self.broker)
        role = GaugeMetricFamily("notify_role", "The broker's replication role", labels=["role"])
        role.add_metric([rep["role"]], 1)
        yield role
        if "partitions" in rep:
            labels = ["topic", "partition"]
            lag = GaugeMetricFamily(
                "notify_replication_lag_bytes",
                "Bytes the master has that this slave has not pulled yet",
                labels=labels,
            )
            age = GaugeMetricFamily(
                "notify_replication_last_pull_age_seconds",
                "Seconds since this slave last pulled the partition",
                labels=labels,
            )
            for row in rep["partitions"]:
                lv = [row["topic"], str(row["partition"])]
                if row["lag_bytes"] is not None:
                    lag.add_metric(lv, row["lag_bytes"])
                if row["last_pull_seconds_ago"] is not None:
                    age.add_metric(lv, row["last_pull_seconds_ago"])
            yield from (lag, age)
        sync = rep.get("sync_slave")
        if sync is not None:
            state = GaugeMetricFamily(
                "notify_sync_slave_state",
                "1 for the synchronous slave's current state",
                labels=["state"],
            )
            for name in ("connecting", "in_sync", "degraded", "refusing"):
                state.add_metric([name], 1 if sync["state"] == name else 0)
            yield state
            batches = CounterMetricFamily(
                "notify_sync_slave_batches",
                "Batches sent to the synchronous slave, by result",
                labels=["result"],
            )
            batches.add_metric(["pushed"], sync["pushed_batches"])
            batches.add_metric(["failed"], sync["failed_batches"])
            yield batches


class BrokerMetrics:
    """The registry of one broker and its fsync histogram."""

    def __init__(self, broker: BrokerHost, http_refused: Callable[[], int] | None = None):
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = BrokerCollector(broker, http_refused)
        self.registry.register(self.collector)
        self.fsync_seconds = Histogram(
            "notify_fsync_seconds",
            "Time from the start of an fsync round to each partition's fsync completing",
            buckets=FSYNC_BUCKETS,
            registry=self.registry,
        )
        self._flusher = broker.flusher
        if self._flusher is not None:
            self._flusher.on_fsync.append(self._observe)

    def _observe(self, seconds: float) -> None:
        self.fsync_seconds.observe(seconds)

    def close(self) -> None:
        if self._flusher is not None:
            with contextlib.suppress(ValueError):
                self._flusher.on_fsync.remove(self._observe)
            self._flusher = None

    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def render_async(self) -> bytes:
        """Collect on the loop (the broker's state is only consistent there) into plain
        copies; build the per-group families and render the text in a worker thread."""
        items = [*self.collector.collect_deferred(), *self.fsync_seconds.collect()]
        frozen = _Frozen(items)
        return await asyncio.get_running_loop().run_in_executor(None, generate_latest, frozen)


class _GroupSnapshot:
    """The consumer positions copied on the loop: per partition (topic, index, visible end,
    [(group, (offset, seen at))]), the series cap and the number of group names."""

    def __init__(
        self,
        parts: list[tuple[str, int, int, list[tuple[str, tuple[int, float]]]]],
        cap: int,
        names: int,
    ):
        self.parts = parts
        self.cap = cap
        self.names = names

    def families(self) -> list[Metric]:
        """Lag and offset per (group, topic, partition), sorted, at most ``cap`` series."""
        lag = GaugeMetricFamily(
            "notify_consumer_lag_bytes",
            "Bytes between a group's last fetch offset and the partition's visible end",
            labels=["group", "topic", "partition"],
        )
        pos = GaugeMetricFamily(
            "notify_consumer_offset",
            "Offset of a group's last fetch",
            labels=["group", "topic", "partition"],
        )
        left = self.cap
        total = 0
        for topic, index, end, seen in sorted(self.parts, key=lambda p: (p[0], p[1])):
            total += len(seen)
            if left <= 0:
                continue
            for group, (offset, _at) in sorted(seen)[:left]:
                lv = [group, topic, str(index)]
                lag.add_metric(lv, max(0, end - offset))
                pos.add_metric(lv, offset)
                left -= 1
        return [
            lag,
            pos,
            GaugeMetricFamily(
                "notify_consumer_groups",
                "Consumer group names remembered (maxConsumerGroups)",
                self.names,
            ),
            GaugeMetricFamily(
                "notify_consumer_series_dropped",
                "Group/partition series left out of this scrape (metricsMaxConsumerSeries)",
                max(0, total - self.cap),
            ),
        ]


class _Frozen(Collector):
    """Metric families collected already (group snapshots are expanded when rendered, in
    the worker thread)."""

    def __init__(self, items: list[Metric | _GroupSnapshot]):
        self.items = items

    def collect(self) -> Iterator[Metric]:
        for item in self.items:
            if isinstance(item, _GroupSnapshot):
                yield from item.families()
            else:
                yield item


def add_routes(
    app: web.Application, broker: BrokerHost, http_refused: Callable[[], int]
) -> BrokerMetrics:
    """Serve ``/metrics`` for ``broker``; the returned registry must be closed with the app."""
    metrics = BrokerMetrics(broker, http_refused)

    async def handler(request: web.Request) -> web.Response:
        resp = web.Response(body=await metrics.render_async())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    app.router.add_get("/metrics", handler)
    return metrics
