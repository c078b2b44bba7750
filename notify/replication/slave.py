"""The asynchronous slave: a broker started with a ``[slave]`` section pulls every partition
of its master as consumer group ``slaveGroup`` and appends the fetched bytes unchanged, so
message ids and byte offsets are identical on both (MetaQ's async slave).

One puller per partition: a long-poll ``get`` from the slave's own end (held up to
``slaveMaxDelayInMills`` when there is nothing new), whole records only, CRC-checked, then one
append. With ``autoSyncMasterConfig`` the topic list and partition counts follow the master's
``stats topics`` (checked every few seconds). A master that deleted old segments answers 301:
an empty slave partition then starts at the master's first offset.

The slave serves consumers; it refuses producers until promoted (``promote``). It shows them
only consistent cuts of its master (:mod:`notify.replication.cut`): another long poll asks
for them, and each is shown once every partition holds it, so no reader sees part of a
transaction here either.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from notify.config import ServerConfig, SlaveConfig, default_topic
from notify.errors import NotifyError
from notify.protocol import records
from notify.protocol.frames import encode_get, encode_line, encode_offset
from notify.protocol.replies import parse_fields, parse_offset, parse_stats
from notify.replication.cut import CUT_STREAM, CutFollower, cut_member, parse_cut, set_cuts
from notify.replication.link import BrokerLink, ReplicaHandshakeError, connect_link
from notify.replication.redo import (
    DELAYLOG_STREAM,
    QUEUELOG_STREAM,
    TXLOG_STREAM,
    ReplicaRedo,
)
from notify.store.partition import Partition

if TYPE_CHECKING:
    from notify.broker.service import BrokerService
    from notify.store.manager import MessageStore

log = logging.getLogger("notify.replication")

FETCH_BYTES = 1 << 20
#: A partition whose last pull is older than slaveMaxDelayInMills plus this is "stalled".
STALL_S = 15.0
_SEVERITY = {"ok": 0, "catching_up": 1, "unknown": 2, "stalled": 3, "diverged": 4}
TOPIC_SYNC_S = 3.0
#: Seconds between checkpoints of the replica redo log.
CHECKPOINT_S = 5.0
REDO_KEY = (TXLOG_STREAM, 0)
CUT_KEY = (CUT_STREAM, 0)
#: after a cut arrives, how long the next request waits (changes meanwhile come in one cut)
CUT_GATHER_S = 0.002
#: how long a slave whose master serves no cuts (an older version) waits to ask again
CUT_UNSUPPORTED_RETRY_S = 30.0
#: the other replicated logs (the delay queue's, the queues'), pulled like the redo log
OTHER_LOGS = (DELAYLOG_STREAM, QUEUELOG_STREAM)
RETRY_S = 0.5


@dataclass
class PullState:
    master_end: int = -1
    last_pull: float = 0.0
    pulled_bytes: int = 0
    error: str = ""


class SlaveHost(Protocol):
    """What the replicator needs of the broker it runs in (the broker sets ``service`` once
    it has started, and may replace ``config`` on reload)."""

    config: ServerConfig
    store: MessageStore
    service: BrokerService | None


class SlaveReplicator:
    """Pulls the master's partitions into this broker's store."""

    def __init__(
        self,
        broker: SlaveHost,
        cfg: SlaveConfig,
        secret: str = "",
        tls: ssl.SSLContext | None = None,
    ):
        self.broker = broker
        self.cfg = cfg
        self.secret = secret
        self.tls = tls
        self.master = cfg.master_address
        #: the master's broker id, which a slave shares (MetaQ): checked in the handshake
        self.broker_id = broker.config.system.broker_id
        self.state: dict[tuple[str, int], PullState] = {}
        self.redo = PullState()
        self.logs = {s: PullState() for s in OTHER_LOGS}
        self._tasks: dict[tuple[str, int], asyncio.Task[None]] = {}
        self._main: asyncio.Task[None] | None = None
        self.stopped = False
        #: failover epoch this slave follows (0 = no automatic failover): links name it
        self.epoch = 0
        self._ends_known = False  # a whole round of the master's ends answered
        self._redo_ok = False  # the redo log pulled without error at that round
        #: the master's consistent cuts, applied as this slave's partitions reach them
        self.cuts = CutFollower(broker.store.partitions)
        self.cut_state = PullState()
        self._cut_reset = False  # a partition appeared: ask for a whole cut again
        self._cut_unsupported = False

    def start(self) -> None:
        if not self.master:
            raise NotifyError("[slave] masterAddress is required without ZooKeeper")
        service = self.broker.service
        if service is not None:  # a flush may complete a cut (group-commit partitions)
            service.flusher.on_flushed.append(self._flushed)
        self._main = asyncio.get_running_loop().create_task(self._run(), name="slave-sync")

    def _flushed(self, _part: Partition) -> None:
        if self.cuts.pending and not self.stopped:
            self.cuts.try_apply()

    def cancel(self) -> None:
        """Stop at once: no puller appends anything once this returns (``promote``)."""
        service = self.broker.service
        if service is not None and self._flushed in service.flusher.on_flushed:
            service.flusher.on_flushed.remove(self._flushed)
        self.stopped = True
        for t in (self._main, *self._tasks.values()):
            if t is not None:
                t.cancel()

    async def stop(self) -> None:
        self.cancel()
        tasks = [t for t in (self._main, *self._tasks.values()) if t is not None]
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    # ------------------------------------------------------------------ topics

    async def _run(self) -> None:
        link: BrokerLink | None = None
        while not self.stopped:
            self._ensure_pullers()  # local partitions report their state even if unreachable
            try:
                if link is None or not link.is_open:
                    link = await connect_link(
                        self.master, self.secret, self.broker_id, self.tls, self.epoch
                    )
                if self.cfg.auto_sync_master_config:
                    await self._sync_topics(link)
                self._ensure_pullers()
                await self._refresh_master_ends(link)
                await self._learn_producers(link)
            except NotifyError as e:
                log.warning("slave: master %s unreachable: %s", self.master, e)
                if link is not None:
                    link.close()
                link = None
            await asyncio.sleep(TOPIC_SYNC_S)

    async def _sync_topics(self, link: BrokerLink) -> None:
        r = await link.request(lambda o: encode_line("stats", "topics", o))
        if r.code != 200:
            return
        store = self.broker.store
        changed = False
        for topic, value in parse_stats(r.body):
            fields = parse_fields(value)
            try:
                n = int(fields.get("partitions", "0"))
            except ValueError:
                continue
            tc = store.topics.get(topic)
            if tc is None:
                tc = replace(default_topic(self.broker.config.system, topic), num_partitions=n)
            elif tc.num_partitions >= n:
                continue
            else:
                tc = replace(tc, num_partitions=n)
            store.add_topic(tc)
            changed = True
            log.info("slave: replicating topic %s with %d partitions from the master", topic, n)
        if changed and self.broker.service is not None:
            self.broker.service.refresh_topics()

    async def _learn_producers(self, link: BrokerLink) -> None:
        """The master's newest holders of named producer identities (``stats producers``):
        promoted, this slave fences the instances they replaced (their last batches come
        with the records)."""
        service = self.broker.service
        if service is None:
            return
        r = await link.request(lambda o: encode_line("stats", "producers", o))
        if r.code != 200:
            return
        for pid, value in parse_stats(r.body):
            epoch, _, instance = value.partition(" ")
            if epoch.isdigit() and instance:
                service.producers.learn_holder(pid, int(epoch), instance)

    def _ensure_pullers(self) -> None:
        loop = asyncio.get_running_loop()
        service = self.broker.service
        if service is not None and service.redo_replica is not None and REDO_KEY not in self._tasks:
            self._tasks[REDO_KEY] = loop.create_task(
                self._pull_redo(service.redo_replica), name="slave-pull-redo"
            )
        for stream in OTHER_LOGS:
            rl = service.stream_replica(stream) if service is not None else None
            if rl is not None and (stream, 0) not in self._tasks:
                self._tasks[(stream, 0)] = loop.create_task(
                    self._pull_redo(rl, stream, self.logs[stream]), name=f"slave-pull-{stream}"
                )
        if service is not None and CUT_KEY not in self._tasks:
            self._tasks[CUT_KEY] = loop.create_task(self._follow_cuts(), name="slave-cuts")
        for (topic, idx), part in self.broker.store.partitions.items():
            if part.memory or (topic, idx) in self._tasks:
                continue
            if cut_member(part) and part.cut is None and self.cuts.capping:
                # a partition new on this slave shows nothing until a whole cut names it
                set_cuts([(part, part.min_offset)])
                self._cut_reset = True
            self.state[(topic, idx)] = PullState()
            self._tasks[(topic, idx)] = loop.create_task(
                self._pull(part), name=f"slave-pull-{topic}-{idx}"
            )

    async def _refresh_master_ends(self, link: BrokerLink) -> None:
        known = True
        for (topic, idx), st in self.state.items():
            r = await link.request(
                functools.partial(encode_offset, topic, self.cfg.slave_group, idx, 2**63 - 1)
            )
            if r.code == 200:
                st.master_end = parse_offset(r.body)
            else:
                known = False
        self._ends_known = known
        self._redo_ok = not self.redo.error

    @property
    def in_sync(self) -> bool:
        """Automatic failover's eligibility (README "Replication and failover"): the last
        whole round of the master's ends was answered, the redo log pulled without error
        then, and every partition is now within ``failoverMaxLagBytes`` of the end the
        master last reported (a synchronous slave is, pushes arrive before the ack)."""
        if not (self._ends_known and self._redo_ok):
            return False
        bound = self.broker.config.system.failover.max_lag_bytes
        for (topic, idx), st in self.state.items():
            part = self.broker.store.get(topic, idx)
            if part is None or st.master_end < 0 or st.master_end - part.end > bound:
                return False
        return True

    # ------------------------------------------------------------------ pulling

    async def _pull(self, part: Partition) -> None:
        key = (part.topic, part.index)
        st = self.state[key]
        link: BrokerLink | None = None
        wait_ms = self.cfg.slave_max_delay_in_mills
        group = self.cfg.slave_group
        service = self.broker.service
        assert service is not None
        # a window always large enough for one whole record (the master widens to it)
        fetch = max(FETCH_BYTES, self.broker.config.system.max_message_size + 4096)
        while not self.stopped:
            self._ensure_pullers()  # local partitions report their state even if unreachable
            try:
                if link is None or not link.is_open:
                    link = await connect_link(
                        self.master, self.secret, self.broker_id, self.tls, self.epoch
                    )
                off = part.end
                r = await link.request(
                    functools.partial(
                        encode_get,
                        part.topic,
                        group,
                        part.index,
                        off,
                        fetch,
                        max_wait_ms=wait_ms,
                    ),
                    timeout_s=wait_ms / 1000.0 + 10,
                )
                st.last_pull = time.monotonic()
                if r.code == 404:
                    st.error = ""
                    continue
                if r.code == 301:
                    nearest = parse_offset(r.body)
                    if nearest > off and part.size_bytes == 0:
                        part.reset_start(nearest)
                        log.info(
                            "slave: %s-%d starts at the master's first offset %d",
                            part.topic,
                            part.index,
                            nearest,
                        )
                        continue
                    st.error = f"master answered 301 -> {nearest} for slave end {off}"
                    log.error("slave: %s-%d: %s (diverged?)", part.topic, part.index, st.error)
                    await asyncio.sleep(5)
                    continue
                if r.code != 200:
                    st.error = f"{r.code} {r.body[:200].decode('utf-8', 'replace')}"
                    await asyncio.sleep(RETRY_S)
                    continue
                valid, why = records.scan(r.body)
                if valid == 0:
                    # no whole valid record at our end: the master's records do not start
                    # here (diverged) or the window cut one short; report it, never spin
                    st.error = f"no valid record from the master at slave end {off}: {why}"
                    log.error("slave: %s-%d: %s", part.topic, part.index, st.error)
                    await asyncio.sleep(RETRY_S)
                    continue
                if part.end != off:
                    continue  # a synchronous push appended meanwhile: fetch again from there
                part.append(memoryview(r.body)[:valid])
                service.producers.observe(part, memoryview(r.body)[:valid], off)
                st.pulled_bytes += valid
                st.error = ""
                fut = service.flusher.after_append(part, 0)
                if fut is not None:
                    fut.add_done_callback(_consume)
                if self.cuts.pending:
                    self.cuts.try_apply()
            except NotifyError as e:
                link = await _failed(st, link, e)

    async def _follow_cuts(self) -> None:
        """Ask the master for its consistent cuts (a long poll) and queue them; each is
        shown once this slave's partitions hold it (:class:`CutFollower`)."""
        st = self.cut_state
        link: BrokerLink | None = None
        wait_ms = self.cfg.slave_max_delay_in_mills
        while not self.stopped:
            try:
                if link is None or not link.is_open or self._cut_reset:
                    if link is not None:
                        link.close()
                    self._cut_reset = False
                    self.cuts.reset()  # a new connection starts with a whole cut
                    link = await connect_link(
                        self.master, self.secret, self.broker_id, self.tls, self.epoch
                    )
                r = await link.request(
                    functools.partial(
                        encode_get, CUT_STREAM, self.cfg.slave_group, 0, 0, FETCH_BYTES,
                        max_wait_ms=wait_ms,
                    ),
                    timeout_s=wait_ms / 1000.0 + 10,
                )  # fmt: skip
                st.last_pull = time.monotonic()
                if r.code == 404:  # an older master: no cuts to follow
                    self._no_cuts(link)
                    link = None
                    await asyncio.sleep(CUT_UNSUPPORTED_RETRY_S)
                    continue
                if r.code != 200:
                    raise NotifyError(f"{r.code} {r.body[:200].decode('utf-8', 'replace')}")
                if self._cut_unsupported:
                    log.info("slave: master %s serves consistent cuts again", self.master)
                    self._cut_unsupported = False
                self.cuts.received_cut(parse_cut(r.body))
                st.error = ""
                await asyncio.sleep(CUT_GATHER_S)
            except ReplicaHandshakeError:  # not a notify master (MetaQ's): no cuts either
                self._no_cuts(link)
                link = None
                await asyncio.sleep(CUT_UNSUPPORTED_RETRY_S)
            except (NotifyError, ValueError) as e:
                link = await _failed(st, link, e)

    def _no_cuts(self, link: BrokerLink | None) -> None:
        if not self._cut_unsupported:
            log.warning(
                "slave: master %s serves no consistent cuts (an older version?): readers of "
                "this slave see pulled data as it arrives, and may see part of a "
                "transaction until its other partitions are pulled",
                self.master,
            )
        self._cut_unsupported = True
        self.cuts.reset()
        self.cuts.capping = False
        if link is not None:
            link.close()
        set_cuts((p, None) for p in self.broker.store.all_partitions() if cut_member(p))

    async def _pull_redo(
        self, rr: ReplicaRedo, stream: str = TXLOG_STREAM, st: PullState | None = None
    ) -> None:
        """Pull the master's redo log (or another log ``stream``: the delay queue's) into
        ``rr`` at the master's positions; checkpoint it every CHECKPOINT_S (see
        :mod:`notify.replication.redo`)."""
        st = self.redo if st is None else st
        link: BrokerLink | None = None
        wait_s = self.cfg.slave_max_delay_in_mills / 1000.0
        last_checkpoint = time.monotonic()
        loop = asyncio.get_running_loop()
        while not self.stopped:
            if time.monotonic() - last_checkpoint >= CHECKPOINT_S:
                last_checkpoint = time.monotonic()
                plan = rr.checkpoint_plan()
                try:
                    if plan is not None:
                        await loop.run_in_executor(None, rr.log.checkpoint, *plan)
                        rr.checkpointed()
                except NotifyError as e:
                    log.error("slave: checkpoint of the replica %s failed: %s", stream, e)
            try:
                if link is None or not link.is_open:
                    link = await connect_link(
                        self.master, self.secret, self.broker_id, self.tls, self.epoch
                    )
                at = rr.end
                r = await link.request(
                    functools.partial(
                        encode_get, stream, self.cfg.slave_group, at.file_no, at.offset,
                        FETCH_BYTES,
                    )
                )  # fmt: skip
                st.last_pull = time.monotonic()
                if r.code == 301:
                    rr.skip_to(int(r.body))
                elif r.code == 404:
                    st.error = ""
                    await asyncio.sleep(wait_s)
                    continue
                elif r.code != 200:
                    raise NotifyError(f"{r.code} {r.body[:200].decode('utf-8', 'replace')}")
                else:
                    if rr.end == at:  # else a synchronous push appended meanwhile
                        rr.append(at, bytes(r.body))
                        st.pulled_bytes += len(r.body)
                st.error = ""
            except (NotifyError, ValueError) as e:
                link = await _failed(st, link, e)

    def stats_items(self) -> list[tuple[str, object]]:
        items: list[tuple[str, object]] = [
            ("role", "slave"),
            ("slave_id", self.cfg.slave_id),
            ("master", self.master),
        ]
        now = time.monotonic()
        stale_s = self.cfg.slave_max_delay_in_mills / 1000.0 + STALL_S
        worst = "ok"
        rows: list[tuple[str, object]] = []
        for (topic, idx), st in sorted(self.state.items()):
            part = self.broker.store.get(topic, idx)
            end = part.end if part is not None else 0
            since = round((now - st.last_pull) * 1000) if st.last_pull else -1
            # a stall is never reported as "lag 0": state says what is wrong, and a slave
            # ahead of its master (diverged) reports the difference, not a clamped zero
            if st.master_end < 0:
                lag, state = -1, "stalled" if st.error else "unknown"
            elif end > st.master_end:
                lag, state = end - st.master_end, "diverged"
            else:
                lag = st.master_end - end
                stalled = st.error or (st.last_pull and now - st.last_pull > stale_s)
                state = "stalled" if stalled else ("ok" if lag == 0 else "catching_up")
                if stalled and lag == 0:
                    lag = -1  # the master's end is not known now: unknown, never "no lag"
            if _SEVERITY[state] > _SEVERITY[worst]:
                worst = state
            rows.append(
                (
                    f"replication.{topic}-{idx}",
                    f"slave_end={end} master_end={st.master_end} lag_bytes={lag} "
                    f"state={state} last_pull_ms_ago={since}"
                    + (f" error={st.error}" if st.error else ""),
                )
            )
        service = self.broker.service
        rr = service.redo_replica if service is not None else None
        if rr is not None:
            redo_end = rr.end
            rows.append(
                (
                    "replication.redo",
                    f"slave_end={redo_end.file_no}:{redo_end.offset} "
                    f"live_transactions={len(rr.live)}"
                    + (f" state=stalled error={self.redo.error}" if self.redo.error else ""),
                )
            )
            if self.redo.error and _SEVERITY[worst] < _SEVERITY["stalled"]:
                worst = "stalled"
        for stream in OTHER_LOGS:
            rl = service.stream_replica(stream) if service is not None else None
            if rl is None:
                continue
            dend, err = rl.end, self.logs[stream].error
            rows.append(
                (
                    f"replication.{stream.lstrip('_')}",
                    f"slave_end={dend.file_no}:{dend.offset}"
                    + (f" state=stalled error={err}" if err else ""),
                )
            )
            if err and _SEVERITY[worst] < _SEVERITY["stalled"]:
                worst = "stalled"
        cs = self.cuts
        cut_state = (
            "unsupported"
            if self._cut_unsupported
            else "stalled"
            if self.cut_state.error
            else "ok"
        )
        rows.append(
            (
                "replication.cut",
                f"applied={cs.applied} received={cs.received} queued={len(cs.pending)} "
                f"state={cut_state}"
                + (f" error={self.cut_state.error}" if self.cut_state.error else ""),
            )
        )
        items.append(("replication_state", worst))
        return items + rows


async def _failed(st: PullState, link: BrokerLink | None, e: Exception) -> BrokerLink | None:
    """A pull failed: note why, close the link and wait a little; the link to use next (none:
    the next attempt connects again)."""
    st.error = str(e)
    if link is not None:
        link.close()
    await asyncio.sleep(RETRY_S)
    return None


def _consume(fut: asyncio.Future[int]) -> None:
    if not fut.cancelled():
        fut.exception()
