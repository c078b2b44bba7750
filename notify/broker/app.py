"""The broker process: config, store, flusher, service and listening socket, and their
lifecycle (start, periodic jobs, config reload, graceful stop).

Start-up takes what can fail for reasons outside the broker first, before it opens, writes or
registers anything (:mod:`notify.broker.startup`): the locks of its directories and its ports
(wire and HTTP, listening but unanswered). A start that fails later stops what it started
(ZooKeeper nodes go, files are closed); the store's recovery points are written only by a
broker that opened its store.

Config reload (new ``[topic=...]`` sections, changed per-topic settings) happens on any of:
SIGHUP, the wire ``reload`` command (``notify config reload``), or the file watch that
checks the ini file's mtime every ``configWatchInterval`` ms (0 turns it off). ``[system]``
changes other than per-topic defaults need a restart and are reported as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import ssl
import time
from dataclasses import replace
from operator import attrgetter
from typing import TYPE_CHECKING, Final

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from notify.broker import authlog
from notify.broker.connection import Connection
from notify.broker.delay import DelayQueue, delay_topic_config
from notify.broker.queues import QueueManager
from notify.broker.retention import apply_retention
from notify.broker.service import BrokerService
from notify.broker.startup import DirectoryLocks, holder_info, listen, locked_directories
from notify.broker.tlsaccept import TlsAccept
from notify.broker.transactions import TransactionManager
from notify.config import ServerConfig, SystemConfig, TopicConfig, default_topic, load_config
from notify.configserver import BrokerRegistrar, resolve_master
from notify.errors import ConfigError, NotifyError
from notify.faults import pausepoint
from notify.fdbudget import spare_fds
from notify.replication.cut import cut_member, forget_cut, load_cut, save_cut, set_cuts, start_caps
from notify.replication.failover import FailoverAgent
from notify.replication.redo import DELAYLOG_STREAM, QUEUELOG_STREAM, ReplicaRedo
from notify.replication.slave import SlaveReplicator
from notify.replication.sync_master import SyncMaster
from notify.runtime import SYSTEM_CLOCK
from notify.store.flusher import Flusher
from notify.store.manager import MessageStore
from notify.store.retention import RetentionResult, quartz_trigger

if TYPE_CHECKING:
    from notify.http.server import HttpServer

log = logging.getLogger("notify.broker")

TICK_S: Final = 0.05
RECOVERY_POINT_EVERY_S: Final = 1.0


class Broker:
    """A running broker. ``await start()``, then ``await wait_closed()`` / ``await stop()``."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.store = MessageStore(config)
        self.service: BrokerService | None = None
        self.flusher: Flusher | None = None
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: the producers' snapshot being written (a thread goes on when its awaiter is
        #: cancelled: the next write waits for it, or two would race on one temporary file)
        self._producer_save: asyncio.Future[None] | None = None
        self._stopped = asyncio.Event()
        self._config_mtime: float | None = None
        self.scheduler: AsyncIOScheduler | None = None
        self.slave: SlaveReplicator | None = None
        self.delay: DelayQueue | None = None
        self.port = config.system.server_port
        self.host = config.system.host_name
        self.http: HttpServer | None = None
        authlog.configure(config.system.auth_failure_log_interval_ms / 1000.0)
        self.registrar: BrokerRegistrar | None = None  # configserver
        #: the server-side TLS context of both ports (tlsCertFile/tlsKeyFile), None = plain
        self.tls: ssl.SSLContext | None = None
        #: automatic failover (autoFailover in ZooKeeper mode), None when off
        self.failover: FailoverAgent | None = None
        self._promote_override = False
        self._capped = False
        #: taken before anything else (see the module doc)
        self._locks: DirectoryLocks | None = None
        self._wire_sock: socket.socket | None = None
        self._http_sock: socket.socket | None = None
        self._store_open = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Take the directories' locks and the ports, then open the store, recover,
        serve and register. A failure stops whatever had started and is raised
        (:class:`~notify.errors.StartupError` when a lock or a port is taken: then nothing
        was changed)."""
        self._claim()
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    def _claim(self) -> None:
        sysc = self.config.system
        locks = DirectoryLocks(locked_directories(self.config))
        locks.lock_existing()  # a running broker's: fails here, having created nothing
        socks: list[socket.socket] = []
        try:
            self.tls = server_tls_context(sysc)
            wire = listen(sysc.host_name, sysc.server_port, "serverPort")
            socks.append(wire)
            if sysc.dashboard_http_port:
                socks.append(listen(sysc.host_name, sysc.dashboard_http_port, "dashboardHttpPort"))
            locks.lock_rest()
        except BaseException:
            for s in socks:
                s.close()
            locks.release()
            raise
        self._locks = locks
        self._wire_sock = socks[0]
        self._http_sock = socks[1] if len(socks) > 1 else None
        self.host, self.port = wire.getsockname()[:2]
        locks.describe(holder_info(self.config, self.host, self.port, sysc.dashboard_http_port))

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        reports = self.store.open()
        self._store_open = True
        for r in reports:
            if r.truncated_bytes:
                log.warning(
                    "recovery %s-%d: cut %d bytes of torn tail from %s (%s)",
                    r.topic,
                    r.partition,
                    r.truncated_bytes,
                    r.segment,
                    r.reason,
                )
        scanned = sum(r.scanned_bytes for r in reports)
        log.info(
            "store open: %d partitions, %d bytes scanned in recovery, %d truncated",
            len(self.store.partitions),
            scanned,
            sum(r.truncated_bytes for r in reports),
        )
        if self.config.system.failover.enabled:  # master or slave: decided by the election
            self.failover = FailoverAgent(self.config, self.store)
            self.config = await self.failover.join()
        store = self.store
        self.flusher = Flusher(
            loop,
            threshold_of=lambda p: store.topics[p.topic].unflush_threshold,
            interval_ms_of=lambda p: store.topics[p.topic].unflush_interval_ms,
        )
        self.service = BrokerService(self.config, self.store, self.flusher, loop, self.reload)
        service = self.service
        service.create_topic = self._create_topic
        service.producers.load(self.store.data_path, self.store.all_partitions())
        await self._save_producer_states()  # scans after a crash start from here
        if self.config.slave is not None:
            # a slave refuses producers from its first byte on the wire, before replication
            # has even found its master
            service.role = "slave"
        self.scheduler = AsyncIOScheduler(event_loop=loop)
        # the internal topic of delayed messages exists before transaction recovery, which
        # may re-apply committed delayed puts to it
        self.store.add_topic(delay_topic_config(default_topic(self.config.system, "")))
        service.refresh_topics()
        #: a slave's readers see only consistent cuts of its master (from the last it showed)
        self._capped = self.config.slave is not None and start_caps(
            self.store.all_partitions(), load_cut(self.store.data_path)
        )
        tm = TransactionManager(
            self.config.system,
            self.store,
            self.flusher,
            service.ids,
            loop,
            self.scheduler,
            service.puts.transaction_applied,
        )
        service.transactions = tm
        if self.config.slave is None:
            tm.recover()
        else:  # the log is the master's copy: recovered (and run) only when promoted
            tm.replica = True
            service.redo_replica = ReplicaRedo(tm.log, self.store)
        self.delay = DelayQueue(
            self.store,
            self.config.system,
            tm.applier,
            SYSTEM_CLOCK,
            lambda: service.role == "master",
            replica=tm.replica,  # a slave keeps its master's delay log (the __delaylog stream)
            before_delete=tm.log.sync,  # APPLIED durable before __delay segments go
        )
        self.delay.open()
        service.delay = self.delay
        service.queues = QueueManager(self.config, self.store, loop, replica=tm.replica)
        service.queues.open()
        if not tm.replica:
            tm.add_jobs()
        for topic in self.store.topics.values():
            self._schedule_retention(topic)
        self.scheduler.start()
        tls = self.tls

        def plain() -> asyncio.Protocol:
            return Connection(service)

        def with_tls() -> asyncio.Protocol:  # the handshake counts toward maxConnections
            assert tls is not None
            sysc = self.config.system
            handshake_s = sysc.tls.handshake_timeout_ms / 1000.0
            return TlsAccept(service, tls, plain, handshake_s, sysc.tls.max_hello_size)

        wire, self._wire_sock = self._wire_sock, None  # the server's now
        assert wire is not None
        self._server = await loop.create_server(plain if tls is None else with_tls, sock=wire)
        # configserver: register (ephemeral; ZooKeeper or embedded), find the master
        self.registrar = BrokerRegistrar(self.config)
        await self.registrar.start(self.host, self.port, self.store.topics)
        if self.registrar.enabled and service.queues is not None:
            service.queues.cluster = self.registrar.server  # ZooKeeper-driven removal
        pausepoint("broker.start.registered")
        self.config = await resolve_master(self.registrar, self.config)
        self._start_replication()
        self._start_failover()
        self.delay.start()
        # notify.http: dashboard, MetaQ HTTP, REST, /metrics; 0 = off
        if self.config.system.dashboard_http_port:
            # aiohttp is a third of a broker's start-up: loaded only when HTTP is on
            from notify.http.application import start_http

            sock, self._http_sock = self._http_sock, None
            self.http = await start_http(self, sock=sock)
        self._config_mtime = self._mtime()
        self._tasks.append(loop.create_task(self._ticker(), name="notify-ticker"))
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self._reload_logged)
        log.info(
            "broker %d listening on %s:%d, data in %s",
            self.config.system.broker_id,
            self.host,
            self.port,
            self.config.system.data_path,
        )

    async def stop(self) -> None:
        """Stop accepting, finish pending writes, fsync and close everything."""
        if self._stopped.is_set():
            return
        if self._locks is None and not self._store_open:  # never started: nothing to stop
            self._stopped.set()
            return
        if self.registrar is not None:  # configserver: clients stop choosing us
            await self.registrar.stop()
            self.registrar = None
        if self.failover is not None:  # leave the election: a slave takes over at once
            await self.failover.close()
        if self._server is not None:
            self._server.close()
        if self.delay is not None:
            await self.delay.close()
        if self.slave is not None:
            await self.slave.stop()
        if self.service is not None and self.service.sync_master is not None:
            await self.service.sync_master.stop()
        if self.http is not None:
            await self.http.close()
            self.http = None
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.scheduler is not None:
            with contextlib.suppress(Exception):
                self.scheduler.shutdown(wait=False)
        if self.service is not None and self._store_open:
            self.service.commit()
            await self._save_producer_states()
            if self.service.transactions is not None:
                await self.service.transactions.close()
            if self.service.queues is not None:
                await self.service.queues.close()
            for conn in list(self.service.connections):
                if conn.transport is not None:
                    conn.pump()
                    conn.transport.close()
        # let in-flight fsync callbacks land before closing the files
        for part in self.store.all_partitions():
            for fut in (part.flush_inflight, part.flush_next):
                if isinstance(fut, asyncio.Future):
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(asyncio.shield(fut), 5)
        # a store that did not open whole keeps its recovery points as they were
        self.store.close(write_points=self._store_open)
        if self.flusher is not None:
            self.flusher.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        for sock in (self._wire_sock, self._http_sock):  # taken, never served
            if sock is not None:
                sock.close()
        self._wire_sock = self._http_sock = None
        if self._locks is not None:  # last: the files are closed
            self._locks.release()
            self._locks = None
        self._stopped.set()
        log.info("broker stopped")

    async def wait_closed(self) -> None:
        await self._stopped.wait()

    # ------------------------------------------------------------------ periodic work

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        last_points = last_stats = last_watch = time.monotonic()
        watch_s = self.config.system.config_watch_interval_ms / 1000.0
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            assert self.flusher is not None and self.service is not None
            self.flusher.tick(self.store.all_partitions())
            if now - last_stats >= 1.0:
                last_stats = now
                self.service.stats.snapshot()
            if now - last_points >= RECOVERY_POINT_EVERY_S:
                last_points = now
                await loop.run_in_executor(None, self.store.write_recovery_points)
                await self._save_producer_states()
                await self._save_cut()
            if watch_s > 0 and now - last_watch >= watch_s:
                last_watch = now
                mtime = self._mtime()
                if mtime is not None and mtime != self._config_mtime:
                    self._config_mtime = mtime
                    self._reload_logged()

    async def _save_cut(self) -> None:
        """A slave remembers the last consistent cut it showed (it starts from it)."""
        cut = self.slave.cuts.to_save() if self.slave is not None else None
        if cut is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, save_cut, self.store.data_path, cut
            )
        except OSError as e:
            log.warning("cannot save the replica cut: %s (a restart shows an older one)", e)

    async def _save_producer_states(self) -> None:
        """Snapshot the idempotent producers' state (consistent cut on the loop, written
        off it) when it or a partition's end changed; a failure is logged, the next round
        tries again."""
        assert self.service is not None
        prev = self._producer_save
        if prev is not None and not prev.done():
            await asyncio.wait({prev})  # its outcome is its own awaiter's to log
        states = self.service.producers
        changed = states.snapshot_if_changed(self.store.all_partitions())
        if changed is None:  # nothing moved since the last write: an idle broker writes nothing
            return
        mark, snap = changed
        fut = asyncio.get_running_loop().run_in_executor(
            None, states.save, self.store.data_path, snap
        )
        self._producer_save = fut
        try:
            await asyncio.shield(fut)  # a cancelled awaiter leaves it running, and known
        except OSError as e:
            log.error("cannot save the idempotent producers' state: %s", e)
        else:
            states.saved(mark)

    # ------------------------------------------------------------------ reload

    def _mtime(self) -> float | None:
        src = self.config.source
        if src is None:
            return None
        try:
            return src.stat().st_mtime
        except OSError:
            return None

    def _reload_logged(self) -> None:
        try:
            log.info("config reload: %s", self.reload())
        except NotifyError as e:
            log.error("config reload failed, keeping the running config: %s", e)

    def reload(self, new: ServerConfig | None = None) -> str:
        """Re-read server.ini (or apply ``new``, already parsed from it); open new topics and
        partitions; apply per-topic settings. Unchanged topics cost nothing."""
        src = self.config.source
        if src is None:
            raise ConfigError("this broker was not started from a config file")
        new = load_config(src) if new is None else new
        self._config_mtime = self._mtime()
        added: list[str] = []
        changed: list[str] = []
        restart: list[str] = []
        old_sys = self.config.system
        for f in (
            "server_port",
            "host_name",
            "data_path",
            "broker_id",
            "max_segment_size",
            "tls.cert_file",
            "tls.key_file",
            "tls.ca_file",
            "tls.client_auth",
        ):
            if attrgetter(f)(new.system) != attrgetter(f)(old_sys):
                restart.append(f)
        check_fd_budget(self.config, new)
        for name, tc in new.topics.items():
            old = self.config.topics.get(name)
            if old is None:
                added.append(name)
            elif old == tc:
                continue
            else:
                if tc.num_partitions < old.num_partitions:
                    raise ConfigError(
                        f"[topic={name}] numPartitions: cannot shrink {old.num_partitions} -> "
                        f"{tc.num_partitions} while running (partitions hold data)"
                    )
                if tc.data_path != old.data_path:
                    restart.append(f"topic={name}.dataPath")
                    tc = replace(tc, data_path=old.data_path)
                changed.append(name)
            self._apply_topic(tc)
        removed = [n for n in self.config.topics if n not in new.topics]
        self.config = replace(
            new, topics={**{n: self.config.topics[n] for n in removed}, **new.topics}
        )
        if self.service is not None:
            self.service.config = self.config
            self.service.refresh_topics()
        if self.registrar is not None:  # configserver: register added topics
            self.registrar.update(self.store.topics, self.config)
        parts = [
            f"added topics: {', '.join(added) or '-'}",
            f"changed topics: {', '.join(changed) or '-'}",
        ]
        if removed:
            parts.append(f"still served until restart (removed from file): {', '.join(removed)}")
        if restart:
            parts.append(f"need a restart to change: {', '.join(restart)}")
        return "; ".join(parts)

    def _create_topic(self, name: str) -> None:
        """``autoCreateTopics``: a topic a client named, with the defaults (kept until the
        broker stops; a ``[topic=NAME]`` section written later takes over on reload)."""
        tc = default_topic(self.config.system, name)
        self._apply_topic(tc)
        self.config = replace(self.config, topics={**self.config.topics, name: tc})
        if self.service is not None:
            self.service.config = self.config
            self.service.refresh_topics()
        if self.registrar is not None:
            self.registrar.update(self.store.topics, self.config)
        log.info("topic %s created on first use (autoCreateTopics)", name)

    def _apply_topic(self, tc: TopicConfig) -> None:
        self.store.add_topic(tc)
        self._schedule_retention(tc)

    # ------------------------------------------------------------------ replication

    def _start_replication(self) -> None:
        service = self.service
        assert service is not None
        sysc = self.config.system
        if self.config.slave is not None:
            service.role = "slave"
            service.master_address = self.config.slave.master_address
            # links authenticate with replicationSecret and this broker id (= the master's)
            self.slave = SlaveReplicator(self, self.config.slave, sysc.replication.secret)
            self.slave.cuts.capping = self._capped
            service.on_promote = self.promote
            service.replication_stats = self.slave.stats_items
            self.slave.start()
            log.info("slave %d of %s", self.config.slave.slave_id, service.master_address)
        elif sysc.replication.sync_slave:
            start_sync_master(self.service, self.config.system, self.delay)

    def _start_failover(self) -> None:
        """Wire the election's agent to this broker (README "Replication and failover")."""
        agent, service = self.failover, self.service
        if agent is None or service is None:
            return
        service.epoch = agent.epoch
        service.fence = agent.fence
        service.saw_epoch = agent.saw_epoch
        service.epoch_declared = agent.poke
        if service.transactions is not None:  # COMMIT/PREPARE fenced at acknowledgement
            service.transactions.fence = agent.fence
        if service.queues is not None:  # queue verbs and acknowledgements likewise
            service.queues.fence = service.queue_fence
        service.failover_stats = agent.stats_items
        if self.slave is not None:
            self.slave.epoch = agent.epoch
            service.on_promote = self._promote_by_election
        if service.sync_master is not None:
            service.sync_master.epoch = agent.epoch
        agent.eligible = self._failover_eligible
        agent.stop_replication = self._stop_replication
        agent.promoted = self._elected
        agent.epoch_known = self._epoch_known
        agent.redo_span = self._redo_span
        agent.log_spans = self._log_spans
        agent.start()

    def _failover_eligible(self) -> bool:
        if self.slave is None:
            return False
        if self._promote_override or not self.config.system.failover.require_in_sync:
            return True
        return self.slave.in_sync

    def _promote_by_election(self) -> str:
        """``promote`` with autoFailover: this slave becomes eligible even when not in sync
        (an operator's override); it is master once it holds the group's lock."""
        self._promote_override = True
        return (
            "promote: contending for the group's lock (master once the current master's "
            "ZooKeeper session has ended)"
        )

    def _redo_span(self) -> tuple[int, int, int] | None:
        """The redo log's oldest segment and end (recorded when an epoch begins)."""
        tm = self.service.transactions if self.service is not None else None
        if tm is None:
            return None
        end = tm.log.end_position
        return tm.log.first_position.file_no, end.file_no, end.offset

    def _log_spans(self) -> dict[str, tuple[int, int, int]]:
        """The delay-queue and queue-state log copies' oldest segments and ends, by stream
        (recorded when a replicating slave takes over)."""
        out: dict[str, tuple[int, int, int]] = {}
        qm = self.service.queues if self.service is not None else None
        for name, lg in (
            ("delaylog", self.delay.log if self.delay is not None else None),
            ("queuelog", qm.log if qm is not None else None),
        ):
            if lg is not None and self.slave is not None:
                end = lg.end_position
                out[name] = (lg.first_position.file_no, end.file_no, end.offset)
        return out

    def _epoch_known(self, epoch: int) -> None:
        assert self.service is not None
        self.service.epoch = epoch
        if self.slave is not None:
            self.slave.epoch = epoch

    def _stop_replication(self) -> None:
        """Elected: take nothing more from the old master (no pull, no push)."""
        assert self.service is not None
        self.service.role = "promoting"
        if self.slave is not None:
            self.slave.cancel()
        for conn in list(self.service.connections):
            if conn.replica and conn.transport is not None:
                conn.transport.abort()

    def _elected(self, epoch: int) -> None:
        """Holding the lock in a new epoch: promote, re-register as master, push to the
        configured synchronous slave (if any) in this epoch."""
        assert self.service is not None
        self.service.epoch = epoch
        self.promote()
        for conn in list(self.service.connections):  # a client that declared an older
            if 0 < conn.client_epoch < epoch and conn.transport is not None:  # epoch
                conn.transport.abort()  # reconnects, declares again and learns this one
        if self.registrar is not None:
            asyncio.get_running_loop().create_task(self.registrar.set_slave_id(None))
        if self.service.sync_master is None:
            start_sync_master(self.service, self.config.system, self.delay)
        if self.service.sync_master is not None:
            self.service.sync_master.epoch = epoch

    def promote(self) -> str:
        """Failover: stop replicating and accept producers (offsets match the old master)."""
        assert self.service is not None
        if self.slave is not None:
            self.slave.cancel()  # no puller appends anything after this line
            asyncio.get_running_loop().create_task(self.slave.stop())
            self.slave = None
        # readers see all it holds (recovery below re-applies what a transaction lacks, in
        # this same step); no remembered cut caps it should it ever follow a master again
        set_cuts((p, None) for p in self.store.all_partitions() if cut_member(p))
        forget_cut(self.store.data_path)
        self.service.role = "master"
        self.service.replication_stats = None
        tm = self.service.transactions
        if tm is not None and tm.replica:
            # every byte a slave appended is whole, CRC-checked records (at the master's
            # offsets): recovery need not re-verify commits placed before its ends
            for part in self.store.all_partitions():
                part.scan_start = max(part.scan_start, part.end)
            # the master's transaction state, recovered exactly as a restarted master would
            tm.replica = False
            self.service.redo_replica = None
            tm.recover()
            tm.add_jobs()
        if self.delay is not None:  # delivered set and pending messages as on the master
            self.delay.promote()
        if self.service.queues is not None:  # queue groups' acknowledgements and progress
            self.service.queues.promote()
        log.warning("promoted to master (was a slave of %s)", self.service.master_address)
        return f"promoted: broker {self.config.system.broker_id} is now a master"

    # ------------------------------------------------------------------ retention

    def _schedule_retention(self, tc: TopicConfig) -> None:
        if self.scheduler is None:
            return
        self.scheduler.add_job(
            self.run_retention,
            quartz_trigger(tc.delete_when),
            args=[tc.name],
            id=f"retention:{tc.name}",
            replace_existing=True,
            max_instances=1,
            coalesce=True,
        )

    async def run_retention(self, topic: str) -> list[RetentionResult]:
        """Apply the topic's deletePolicy now (also run by its deleteWhen schedule)."""
        if self.service is None:
            return []
        return await apply_retention(self.store, self.service, self.config.system, topic)


def check_fd_budget(old: ServerConfig, new: ServerConfig) -> None:
    """Refuse a reload whose new disk partitions need more file descriptors than the
    process can spare (each keeps its active segment open): opening them would fail
    half-way and leave the broker without descriptors for connections and its logs."""
    need = 0
    for name, tc in new.topics.items():
        if tc.store == "memory":
            continue
        before = old.topics.get(name)
        need += tc.num_partitions - (before.num_partitions if before is not None else 0)
    if need <= 0:
        return
    spare, how = spare_fds(new.system.fd_reserve)
    if need > spare:
        raise ConfigError(
            f"the new partitions need {need} file descriptors and this broker can spare "
            f"{max(spare, 0)} ({how})"
        )


def start_sync_master(
    service: BrokerService | None, sysc: SystemConfig, delay: DelayQueue | None
) -> None:
    """With ``syncSlave``: push to the synchronous slave, the partitions' appends and the
    redo, delay-queue and queue logs alike (each acknowledgement waits for the slave)."""
    assert service is not None
    rep = sysc.replication
    if not rep.sync_slave:
        return
    service.sync_master = sm = SyncMaster(
        service,
        rep.sync_slave,
        rep.sync_slave_timeout_ms,
        rep.sync_slave_failure_policy,
        rep.sync_slave_max_failures,
        rep.secret,
        sysc.broker_id,
    )
    sm.on_dropped = service.taken_back
    sm.start()
    tm = service.transactions
    if tm is not None:  # the redo log follows the partitions to the slave
        tm.log.on_write = lambda pos, frames: tm.ship(sm.replicate_redo(pos, frames))
        # and so do the shares of commits and delay moves, in append order (the
        # slave's next batch would find it behind them)
        tm.applier.on_covered = lambda part, base, data, count: _consume(
            sm.replicate(part, base, data, count)
        )
    if delay is not None:  # and the delay queue's log (a move waits for the slave)
        delay.log.on_write = lambda pos, frames: delay.ship(
            sm.replicate_log(DELAYLOG_STREAM, pos, frames)
        )
    qm = service.queues
    if qm is not None and qm.log is not None:  # acknowledgements wait for the slave
        qm.log.on_write = lambda pos, frames: qm.ship(
            sm.replicate_log(QUEUELOG_STREAM, pos, frames)
        )


def _consume(fut: asyncio.Future[None] | None) -> None:
    """A push nobody awaits: its failure counts in the synchronous master's state."""
    if fut is not None:
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())


def server_tls_context(sysc: SystemConfig) -> ssl.SSLContext | None:
    """The TLS context of the wire and HTTP ports, or None when ``tlsCertFile`` is unset.

    TLS 1.2 or later with the ``ssl`` module's secure defaults; with ``tlsClientAuth`` a
    client must present a certificate that chains to ``tlsCaFile`` (mutual TLS)."""
    if sysc.tls.cert_file is None or sysc.tls.key_file is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(sysc.tls.cert_file), str(sysc.tls.key_file))
        if sysc.tls.ca_file is not None:
            ctx.load_verify_locations(cafile=str(sysc.tls.ca_file))
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(
            f"[system] tlsCertFile/tlsKeyFile/tlsCaFile: cannot load "
            f"{sysc.tls.cert_file}, {sysc.tls.key_file}: {e}"
        ) from e
    ctx.verify_mode = ssl.CERT_REQUIRED if sysc.tls.client_auth else ssl.CERT_NONE
    return ctx
