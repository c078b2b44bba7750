"""Session and administration verbs: ``auth``, ``version``, ``quit``, ``stats``, ``reload``
and ``promote``.

``auth <secret>`` selects the connection's role by the secret it names (README "Security"):
``adminSecret`` -> admin (and produce/consume), ``authSecret`` -> produce/consume (and admin
when no adminSecret is set), ``replicationSecret`` -> replica (a broker of the replication
set: produce/consume, internal topics, msync/sync). ``stats`` serves MetaQ's items and
notify's; ``reload`` and ``promote`` need the admin role (the dispatch answers 403 for the
others before they get here).
"""

from __future__ import annotations

import hmac
import logging
from typing import Final

from notify.broker.authlog import record_auth_failure
from notify.broker.connection import Connection
from notify.broker.context import BrokerContext
from notify.config import served_config
from notify.errors import ConfigError, NotifyError
from notify.protocol.frames import (
    Auth,
    Promote,
    Quit,
    Reload,
    Stats,
    Version,
    encode_result,
    encode_stats_body,
)
from notify.protocol.replies import encode_replica_ack
from notify.version import __version__

log = logging.getLogger("notify.broker")

STATS_ITEMS: Final = (
    "", "topics", "offsets", "realtime", "config", "reset", "help", "queues", "producers"
)


class AdminVerbs:
    """``auth``, ``version``, ``quit``, ``stats``, ``reload``, ``promote``."""

    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx

    def version(self, conn: Connection, r: Version) -> None:
        conn.send(encode_result(200, r.opaque, __version__.encode()))

    def quit(self, conn: Connection, _r: Quit) -> None:
        conn.close_after_replies()

    def auth(self, conn: Connection, r: Auth) -> None:
        """``auth <secret> [<brokerId> [<epoch>]]``: the secret selects the role."""
        ctx = self.ctx
        sysc = ctx.config.system
        if not (sysc.auth_secret or sysc.admin_secret or sysc.replication.secret):
            conn.grant(True, True, False)
            return conn.send(encode_result(200, r.opaque, b"authentication not required"))
        given = r.secret.encode()

        def match(secret: str) -> bool:
            return bool(secret) and hmac.compare_digest(given, secret.encode())

        if match(sysc.admin_secret):
            conn.grant(True, True, conn.replica)
            return conn.send(encode_result(200, r.opaque, b"ok role=admin"))
        if match(sysc.auth_secret):
            admin = conn.admin or not sysc.admin_secret
            conn.grant(True, admin, conn.replica)
            return conn.send(encode_result(200, r.opaque, b"ok role=admin" if admin else b"ok"))
        if match(sysc.replication.secret):
            return self._replica_auth(conn, r)
        record_auth_failure(conn.peer)  # counted in /metrics; rate-limited log lines
        conn.send(encode_result(403, r.opaque, b"authentication failed"))
        conn.close_after_replies()

    def _replica_auth(self, conn: Connection, r: Auth) -> None:
        """``auth <replicationSecret> <brokerId> [<epoch>]``: the link also names the broker
        id it replicates: a slave takes writes only from its own master (same brokerId, as
        in MetaQ), a master serves its own slaves."""
        ctx = self.ctx
        sysc = ctx.config.system
        if r.broker_id != sysc.broker_id:
            ctx.stats.denied += 1
            log.warning(
                "replica auth from %s for broker %s refused: this is broker %d",
                conn.peer,
                r.broker_id,
                sysc.broker_id,
            )
            conn.send(
                encode_result(
                    403,
                    r.opaque,
                    b"replica auth must name this broker's id %d" % sysc.broker_id,
                )
            )
            return conn.close_after_replies()
        if ctx.epoch and (r.epoch or 0) < ctx.epoch:  # a replaced master, or behind
            ctx.stats.denied += 1
            conn.send(
                encode_result(
                    403,
                    r.opaque,
                    b"replica auth in failover epoch %d refused: this broker is in epoch %d"
                    % (r.epoch or 0, ctx.epoch),
                )
            )
            return conn.close_after_replies()
        if r.epoch and r.epoch > ctx.epoch and ctx.saw_epoch is not None:
            ctx.saw_epoch(r.epoch)  # this broker may have been replaced: fence now
        conn.grant(True, conn.admin, True)
        ack = encode_replica_ack(sysc.broker_id, ctx.epoch)
        conn.send(encode_result(200, r.opaque, ack))

    def reload(self, conn: Connection, r: Reload) -> None:
        ctx = self.ctx
        if ctx.reload is None:
            return ctx.error(conn, 500, r.opaque, "reload is not available")
        try:
            summary = ctx.reload()
        except NotifyError as e:  # a rejected server.ini (ConfigError): 400, the reason
            code = 400 if isinstance(e, ConfigError) else 500
            return ctx.error(conn, code, r.opaque, f"reload failed, config unchanged: {e}")
        conn.send(encode_result(200, r.opaque, summary.encode()))

    def reload_denied(self, conn: Connection, r: Reload) -> None:
        self.ctx.denied(conn, r.opaque, "reload", "admin")

    def promote(self, conn: Connection, r: Promote) -> None:
        ctx = self.ctx
        if ctx.role == "master" or ctx.on_promote is None:
            ctx.error(conn, 400, r.opaque, "this broker is already a master")
        else:
            conn.send(encode_result(200, r.opaque, ctx.on_promote().encode()))

    def promote_denied(self, conn: Connection, r: Promote) -> None:
        self.ctx.denied(conn, r.opaque, "promote", "admin")

    # ------------------------------------------------------------------ stats

    def stats(self, conn: Connection, r: Stats) -> None:
        ctx = self.ctx
        item = r.item or ""
        st = ctx.stats
        items: list[tuple[str, object]]
        if item == "":
            items = self._system_items()
        elif item == "topics":
            items = self._topic_items()
        elif item == "offsets":
            items = [
                (
                    f"{t}-{p.index}",
                    f"min_offset={p.min_offset} max_offset={p.visible_end} "
                    f"flushed_offset={p.flushed_end} segments={len(p.segments)}",
                )
                for t, parts in sorted(ctx.topic_parts.items())
                for p in parts
            ]
        elif item == "realtime":
            items = st.realtime()
        elif item == "queues":
            items = ctx.queues.stats_items() if ctx.queues is not None else []
        elif item == "producers":  # named identities' holders: replicas and admins
            if not (conn.replica or conn.admin):
                return ctx.denied(conn, r.opaque, "stats producers", "admin")
            items = ctx.producers.newest_holders()
        elif item == "config":
            return self._stats_config(conn, r)
        elif item == "reset":
            if not conn.admin:
                return ctx.denied(conn, r.opaque, "stats reset", "admin")
            st.reset()
            items = [("reset", "ok")]
        elif item == "help":
            items = [(i or "(empty)", "") for i in (*STATS_ITEMS, "<topic>")]
        elif item in ctx.topic_parts or ctx.auto_create(item) is not None:
            items = self._one_topic_items(item)  # known, or created now (autoCreateTopics)
        else:
            # MetaQ reads any other item as a topic: 200, resultCode 1 = no such topic
            items = [
                (item, None),
                ("resultCode", 1),
                ("partitions", 0),
                ("message_count", 0),
                ("bytes", 0),
            ]
        conn.send(encode_result(200, r.opaque, encode_stats_body(items)))

    def _system_items(self) -> list[tuple[str, object]]:
        ctx = self.ctx
        producers = ctx.producers
        items: list[tuple[str, object]] = [
            ("version", __version__),
            ("broker_id", ctx.config.system.broker_id),
            *ctx.stats.system(),
            ("topics", len(ctx.topic_parts)),
            ("parked_gets_current", sum(map(len, ctx.waiting.values()))),
            ("idempotent_duplicates", producers.duplicates),
            ("idempotent_evicted", producers.evicted),
            ("idempotent_refused", producers.refused),
            ("idempotent_fenced", producers.fenced),
            ("producer_state_bytes", producers.bytes),
            ("producer_identities_named", len(producers.named)),
            ("fsyncs", ctx.flusher.fsyncs),
            ("fsync_seconds", round(ctx.flusher.fsync_seconds, 3)),
        ]
        if ctx.transactions is not None:
            items += ctx.transactions.stats_items()
        if ctx.delay is not None:
            items += ctx.delay.stats_items()
        if ctx.sync_master is not None:
            items += ctx.sync_master.stats_items()
        elif ctx.replication_stats is not None:
            items += ctx.replication_stats()
        elif ctx.role != "slave":  # a master without a synchronous slave, or promoting
            items.append(("role", ctx.role))  # (a slave says "slave" once it pulls)
        if ctx.failover_stats is not None:
            items += ctx.failover_stats()
        return items

    def _topic_items(self) -> list[tuple[str, object]]:
        ctx = self.ctx
        items: list[tuple[str, object]] = []
        for t, parts in sorted(ctx.topic_parts.items()):
            tc = ctx.stats.topic(t)
            pub, sub = ctx.accept[t]
            size = sum(p.size_bytes for p in parts)
            items.append(
                (
                    t,
                    f"partitions={len(parts)} bytes={size} put_messages={tc.put_messages} "
                    f"put_bytes={tc.put_bytes} get_requests={tc.get_requests} "
                    f"accept_publish={str(pub).lower()} accept_subscribe={str(sub).lower()}",
                )
            )
        return items

    def _one_topic_items(self, topic: str) -> list[tuple[str, object]]:
        ctx = self.ctx
        parts = ctx.topic_parts[topic]
        tc = ctx.stats.topic(topic)
        items: list[tuple[str, object]] = [
            ("topic", topic),
            ("partitions", len(parts)),
            ("put_messages", tc.put_messages),
            ("put_bytes", tc.put_bytes),
            ("put_failed", tc.put_failed),
            ("get_requests", tc.get_requests),
            ("get_misses", tc.get_misses),
            ("get_bytes", tc.get_bytes),
        ]
        items += [(f"partition.{p.index}", f"min={p.min_offset} max={p.visible_end}")
                  for p in parts]
        return items

    def _stats_config(self, conn: Connection, r: Stats) -> None:
        """MetaQ's ``stats config``: the server.ini text as loaded (see ``served_config``),
        which a MetaQ async slave with ``autoSyncMasterConfig`` loads as its own ini."""
        text = served_config(self.ctx.config)
        if text is None:
            return self.ctx.error(conn, 500, r.opaque, "this broker was not started from a file")
        conn.send(encode_result(200, r.opaque, text))
