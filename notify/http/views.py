"""Read-only JSON views of a running broker (REST face, dashboard, metrics, admin CLI).

Plain functions from the live objects to JSON-ready dicts; they run on the broker's event
loop, which owns every structure they read, so no locking is needed. Message ids are 64-bit
and given as decimal strings (JavaScript numbers stop being exact at 2**53).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from notify.config import DeletePolicy, TopicConfig, system_values
from notify.core.states import TxState
from notify.errors import StoreError
from notify.protocol import records
from notify.store.partition import Partition
from notify.version import __version__

if TYPE_CHECKING:
    from notify.broker.service import BrokerService
    from notify.http.host import BrokerHost

JSON = dict[str, Any]
#: Seconds of per-second samples the dashboard's charts show.
HISTORY_S: Final = 180


def _jsonable(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, DeletePolicy):
        age_h = value.max_age_s / 3600.0
        text = f"{value.action},{age_h:g}"
        return text + (",zip" if value.compress else "")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def partition_view(part: Partition) -> JSON:
    return {
        "partition": part.index,
        "min_offset": part.min_offset,
        "max_offset": part.visible_end,
        "end_offset": part.end,
        "flushed_offset": part.flushed_end,
        "size_bytes": part.visible_end - part.min_offset,
        "unflushed_bytes": part.end - part.flushed_end,
        "segments": len(part.segments),
        "failed": part.failed,
    }


def topic_config_view(tc: TopicConfig) -> JSON:
    return {f.name: _jsonable(getattr(tc, f.name)) for f in fields(tc) if f.name != "name"}


def topic_view(service: BrokerService, name: str) -> JSON:
    tc = service.store.topics[name]
    parts = service.store.topic_partitions(name)
    counters = service.stats.topic(name)
    groups = sorted({g for p in parts for g in service.consumer_positions.get((name, p.index), {})})
    return {
        "name": name,
        "internal": name.startswith("__"),
        "num_partitions": len(parts),
        "size_bytes": sum(p.visible_end - p.min_offset for p in parts),
        "accept_publish": tc.accept_publish,
        "accept_subscribe": tc.accept_subscribe,
        "put_messages": counters.put_messages,
        "put_bytes": counters.put_bytes,
        "put_failed": counters.put_failed,
        "get_requests": counters.get_requests,
        "get_misses": counters.get_misses,
        "get_bytes": counters.get_bytes,
        "groups": groups,
        "partitions": [partition_view(p) for p in parts],
        "config": topic_config_view(tc),
    }


def topics_view(service: BrokerService) -> list[JSON]:
    return [topic_view(service, name) for name in sorted(service.store.topics)]


#: Bytes of records read per group and partition to count its lag in messages (and in all,
#: per ``/api/groups`` call); beyond, the count is extrapolated from the records read
#: (``lag_messages_exact`` false), or null once the call's budget is spent.
LAG_SCAN_BYTES: Final = 1 << 20
LAG_SCAN_TOTAL_BYTES: Final = 16 << 20


def lag_messages(
    part: Partition, offset: int, end: int, max_scan: int = LAG_SCAN_BYTES
) -> tuple[int | None, bool]:
    """Messages between byte offsets ``offset`` and ``end`` of ``part``: ``(count, exact)``,
    reading at most ``max_scan`` bytes; ``(None, False)`` when nothing could be read."""
    pos = offset
    count = 0
    try:
        while pos < end and pos - offset < max_scan:
            chunk = part.read(pos, min(end - pos, 256 << 10))
            if not chunk:
                break
            n, used = records.count_records(chunk)
            if n == 0:  # one record larger than the chunk
                size = records.first_record_size(chunk)
                if size is None or size <= 0:
                    break
                n, used = 1, size
            count += n
            pos += used
    except (StoreError, OSError):
        return None, False
    if pos >= end:
        return count, True
    if pos == offset:
        return None, False
    return count + round((end - pos) * count / (pos - offset)), False


def groups_view(service: BrokerService, count_messages: bool = True) -> list[JSON]:
    """Consumer positions the broker saw (the offset of each group's last fetch) and the lag
    behind the partition's visible end, in bytes (MetaQ offsets are byte offsets) and, with
    ``count_messages``, in messages. A group is ``live`` when it fetched within
    ``consumerSessionTimeout``."""
    now = time.monotonic()
    live_s = service.config.system.consumer_session_timeout_ms / 1000.0
    budget = LAG_SCAN_TOTAL_BYTES
    out: list[JSON] = []
    for (topic, index), seen in sorted(service.consumer_positions.items()):
        part = service.store.get(topic, index)
        if part is None:
            continue
        end = part.visible_end
        for group, (offset, at) in sorted(seen.items()):
            idle = now - at
            row: JSON = {
                "group": group,
                "topic": topic,
                "partition": index,
                "offset": offset,
                "max_offset": end,
                "lag_bytes": max(0, end - offset),
                "idle_seconds": round(idle, 1),
                "live": idle < live_s,
            }
            if count_messages:
                scan = min(LAG_SCAN_BYTES, budget)
                row["lag_messages"], row["lag_messages_exact"] = (
                    lag_messages(part, offset, end, scan) if scan > 0 else (None, False)
                )
                budget -= min(scan, max(0, end - offset))
            out.append(row)
    return out


def transactions_view(service: BrokerService) -> list[JSON]:
    tm = service.transactions
    if tm is None:
        return []
    now_ms = time.time() * 1000
    out: list[JSON] = []
    for tx in tm.snapshot():
        out.append(
            {
                "key": tx.key,
                "xa": tx.xa,
                "state": tx.state.value,
                "in_doubt": tx.state is TxState.PREPARED,
                "messages": tx.message_count,
                "bytes": tx.nbytes,
                "created_ms": tx.created_ms,
                "age_seconds": round(max(0.0, now_ms - tx.created_ms) / 1000.0, 1),
                "timeout_seconds": tx.timeout_s,
                "producer_group": tx.group,
                "prepared_at_ms": tx.prepared_at_ms or None,
                "check_backs": tx.checks,
                "apply_error": tx.apply_error,
                "connection": tx.owner.peer if tx.owner is not None else None,
            }
        )
    return out


def config_view(broker: BrokerHost) -> JSON:
    cfg = broker.config
    system: dict[str, Any] = {}
    for attr, _key, value in system_values(cfg.system):
        section, _, name = attr.rpartition(".")  # a typed section's keys: one object
        (system.setdefault(section, {}) if section else system)[name] = _jsonable(value)
    return {
        "source": str(cfg.source) if cfg.source else None,
        "system": system,
        "zookeeper": {
            f.name: _jsonable(getattr(cfg.zookeeper, f.name)) for f in fields(cfg.zookeeper)
        },
        "topics": {name: topic_config_view(tc) for name, tc in sorted(cfg.topics.items())},
    }


def replication_view(broker: BrokerHost) -> JSON:
    """The broker's replication role and, where there is replication, its progress: an
    async slave's lag per partition (bytes the master has that it has not pulled yet), a
    master's synchronous slave state."""
    service = broker.service
    assert service is not None
    out: JSON = {"role": service.role}
    slave = broker.slave
    if slave is not None:
        now = time.monotonic()
        rows = []
        for (topic, index), st in sorted(slave.state.items()):
            part = service.store.get(topic, index)
            end = part.end if part is not None else 0
            rows.append(
                {
                    "topic": topic,
                    "partition": index,
                    "slave_end": end,
                    "master_end": st.master_end if st.master_end >= 0 else None,
                    "lag_bytes": max(0, st.master_end - end) if st.master_end >= 0 else None,
                    "last_pull_seconds_ago": round(now - st.last_pull, 3) if st.last_pull else None,
                    "error": st.error or None,
                }
            )
        out["master"] = service.master_address
        out["partitions"] = rows
    sm = service.sync_master
    if sm is not None:
        out["sync_slave"] = {
            "address": sm.addr,
            "state": "refusing" if sm.refusing else ("degraded" if sm.degraded else "in_sync"),
            "connected": bool(sm.link and sm.link.is_open),
            "pushed_batches": sm.pushed_batches,
            "failed_batches": sm.failed_batches,
            "last_error": sm.last_error or None,
        }
    return out


def system_view(broker: BrokerHost) -> JSON:
    service = broker.service
    assert service is not None
    st = service.stats
    flusher = service.flusher
    out: JSON = {
        "version": __version__,
        "broker_id": broker.config.system.broker_id,
        "host": broker.host,
        "port": broker.port,
        "uptime_seconds": int(time.time() - st.started),
        "connections": st.connections_current,
        "connections_total": st.connections_total,
        "cmd_put": st.cmd_put,
        "cmd_mput": st.cmd_mput,
        "cmd_get": st.cmd_get,
        "cmd_offset": st.cmd_offset,
        "put_messages": st.put_messages,
        "put_bytes": st.put_bytes,
        "put_failed": st.put_failed,
        "get_bytes": st.get_bytes,
        "get_misses": st.get_misses,
        "fsyncs": flusher.fsyncs,
        "fsync_seconds": round(flusher.fsync_seconds, 6),
        "auth_required": bool(broker.config.system.auth_secret),
        "replication": replication_view(broker),
    }
    tm = service.transactions
    if tm is not None:
        s = tm.stats
        out["transactions"] = {
            "begun": s.begun,
            "committed": s.committed,
            "rolled_back": s.rolled_back,
            "timed_out": s.timed_out,
        }
    return out


@dataclass(frozen=True, slots=True)
class Sample:
    """Cumulative counters at one moment (monotonic ``t``, wall clock ``wall``)."""

    t: float
    wall: float
    put_messages: int
    put_bytes: int
    get_requests: int
    get_bytes: int
    fsyncs: int


class History:
    """A ring of one-second samples; rates for the dashboard's charts."""

    def __init__(self, seconds: int = HISTORY_S):
        self.samples: deque[Sample] = deque(maxlen=seconds + 1)

    def sample(self, service: BrokerService) -> None:
        st = service.stats
        self.samples.append(
            Sample(
                time.monotonic(),
                time.time(),
                st.put_messages,
                st.put_bytes,
                st.cmd_get,
                st.get_bytes,
                service.flusher.fsyncs,
            )
        )

    def rates(self) -> list[JSON]:
        out: list[JSON] = []
        prev: Sample | None = None
        for s in self.samples:
            if prev is not None:
                dt = max(s.t - prev.t, 1e-6)
                out.append(
                    {
                        "t": round(s.wall, 3),
                        # a stats reset makes counters go back: show 0, not a negative rate
                        "put_tps": round(max(0, s.put_messages - prev.put_messages) / dt, 1),
                        "get_tps": round(max(0, s.get_requests - prev.get_requests) / dt, 1),
                        "put_bps": round(max(0, s.put_bytes - prev.put_bytes) / dt, 1),
                        "get_bps": round(max(0, s.get_bytes - prev.get_bytes) / dt, 1),
                        "fsync_ps": round(max(0, s.fsyncs - prev.fsyncs) / dt, 1),
                    }
                )
            prev = s
        return out


def overview(broker: BrokerHost, history: History) -> JSON:
    """Everything the dashboard shows, in one response."""
    service = broker.service
    assert service is not None
    txs = transactions_view(service)
    return {
        "system": system_view(broker),
        "rates": history.rates(),
        "topics": topics_view(service),
        "groups": groups_view(service, count_messages=False),
        "transactions": txs,
        "in_doubt": sum(1 for t in txs if t["in_doubt"]),
        "config": config_view(broker),
    }
