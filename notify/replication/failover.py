"""Automatic failover in ZooKeeper mode (``[system] autoFailover=true``): election with
kazoo's Lock recipe, an epoch (fencing token) per broker group, and demotion of a master
that was replaced.

A group is one ``brokerId``: its configured master and its slaves (``[slave] slaveId``; the
configured master's member id is ``failoverSlaveId``). The member that holds the group's
kazoo lock (``<zk.zkRoot>/failover/<brokerId>/lock``) is the master; taking it bumps the
epoch node (:mod:`notify.protocol.failover`). So:

* **join** (at start, before the transaction log is opened): the member named by the epoch
  node (or, before any epoch, the configured master) waits for the lock and leads; every
  other member follows the epoch's master as a slave, after cutting its partitions (and,
  when the epochs it missed recorded it, its redo log) to the lowest epoch-start end of the
  epochs it missed and dropping the logs it cannot cut (it pulls the new master's again):
  its bytes become a prefix of the new master's.
* **contend**: a slave whose last check found it in sync (:attr:`SlaveReplicator.in_sync`;
  any slave with ``failoverRequireInSync=false``) queues for the lock and publishes
  ``members/<N>`` (eligible, data size); once the master's ZooKeeper session ends the first
  in the queue gets the lock and, unless another eligible member holds more data (then it
  hands the lock on), stops replicating, records its ends, bumps the epoch and is promoted
  (transaction recovery as ``promote``), then re-registers as master.
* **fence**: a master takes writes only while it knows it holds the lock: a lease renewed by
  reading the epoch node every few hundred ms (valid for 3/4 of the session timeout,
  measured on the monotonic clock, so a master woken from SIGSTOP finds it lapsed before it
  reads a single request); SUSPENDED also fences. A lost session or an epoch node naming
  someone else demotes it: the broker asks to be restarted in-process (``rejoin``) and joins
  again, as a slave of the new master. Replication links carry the epoch both ways and
  refuse a peer in an older one; producers declare the newest epoch they saw (``epoch``):
  a master in an older one refuses their writes and checks ZooKeeper at once (:meth:`poke`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import CancelledError as KzCancelledError
from kazoo.exceptions import KazooException, LockTimeout, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from notify.config import ServerConfig, SlaveConfig
from notify.errors import NotifyError
from notify.protocol.failover import (
    EpochInfo,
    MemberInfo,
    decode_ends,
    decode_epoch,
    decode_member,
    decode_redo,
    encode_ends,
    encode_epoch,
    encode_member,
    epoch_node_name,
)
from notify.store.manager import MessageStore
from notify.txlog import Position, cut_log

log = logging.getLogger("notify.failover")

T = TypeVar("T")

#: Seconds between two looks at the epoch node (follower) / lease renewals (master), as a
#: fraction of the session timeout.
RENEW_FRACTION = 1 / 6
#: The master's lease lasts this fraction of the session timeout after a confirmed read.
LEASE_FRACTION = 0.75
#: Epoch-start nodes kept (a member away for more epochs than this must be re-seeded).
KEEP_EPOCHS = 256
LOCK_TRY_S = 0.5
LOCAL_FILE = "failover-epoch"


class FailoverError(NotifyError):
    """Automatic failover cannot proceed (epoch history gone, data below a cut point)."""


class FailoverAgent:
    """One broker's part in its group's election. Created and joined before the broker
    opens its transaction log; :meth:`start` after it listens; :meth:`close` on stop."""

    def __init__(self, config: ServerConfig, store: MessageStore):
        sysc, zk = config.system, config.zookeeper
        self.config = config
        self.store = store
        self.member = config.slave.slave_id if config.slave is not None else sysc.failover.slave_id
        self.address = f"{sysc.host_name}:{sysc.server_port}"
        root = "/" + zk.zk_root.strip().strip("/") if zk.zk_root.strip("/ ") else ""
        self.base = f"{root}/failover/{sysc.broker_id}"
        self.session_s = zk.zk_session_timeout_ms / 1000.0
        self.lease_s = self.session_s * LEASE_FRACTION
        self.client = KazooClient(
            hosts=zk.zk_connect,
            timeout=self.session_s,
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 0.5},
            command_retry={"max_tries": 0},
        )
        self.lock = self.client.Lock(f"{self.base}/lock", f"s{self.member} {self.address}")
        #: the epoch this broker is in (led or followed); 0 = none yet
        self.epoch = 0
        self.leader = False
        #: why this master was demoted ("" = it was not)
        self.demoted = ""
        #: set when the broker must restart in-process and join again (demoted, or a newer
        #: epoch appeared while following)
        self.rejoin = asyncio.Event()
        self.elections = 0
        self._lease_at = 0.0
        self._suspended = False
        self._closing = False
        self._poking = False
        self._poke_task: asyncio.Task[None] | None = None
        #: the ``members/<N>`` value last written (b"" = none yet) and until when this
        #: member stays out of the contention after handing the lock to a member with more
        self._published = b""
        self._yield_until = 0.0
        self.handed_on = 0
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="notify-failover")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._acquire: asyncio.Future[bool] | None = None
        #: set by the broker (start): is this slave eligible, stop replicating, promote
        self.eligible: Callable[[], bool] = lambda: False
        self.stop_replication: Callable[[], None] = lambda: None
        self.promoted: Callable[[int], None] = lambda epoch: None
        #: the redo-log copy's (oldest segment, end file, end offset), None when not open
        #: (set by the broker: recorded in the epoch-start node at a take-over)
        self.redo_span: Callable[[], tuple[int, int, int] | None] = lambda: None
        #: the same span of the delay-queue and queue-state log copies by stream name
        #: (``delaylog``, ``queuelog``; only those a replicating slave holds)
        self.log_spans: Callable[[], dict[str, tuple[int, int, int]]] = lambda: {}
        #: a slave that joined before epoch 1 learns it: replication links name it
        self.epoch_known: Callable[[int], None] = lambda epoch: None

    # ------------------------------------------------------------------ plumbing

    async def _zk(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kw))

    @property
    def _epoch_path(self) -> str:
        return f"{self.base}/epoch"

    async def _read_epoch(self) -> tuple[EpochInfo, int] | None:
        try:
            raw, stat = await self._zk(self.client.get, self._epoch_path)
        except NoNodeError:
            return None
        return decode_epoch(bytes(raw)), int(stat.version)

    def _local_path(self) -> Path:
        return self.config.system.data_path / LOCAL_FILE

    def _read_local(self) -> int:
        try:
            return int(self._local_path().read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _write_local(self, epoch: int) -> None:
        path = self._local_path()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{epoch}\n")
        tmp.replace(path)

    def _on_state(self, state: Any) -> None:  # kazoo's thread
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._state_changed, state)

    def _state_changed(self, state: Any) -> None:
        self._suspended = state == KazooState.SUSPENDED
        if state == KazooState.LOST and self.leader and not self._closing:
            self._demote("its ZooKeeper session expired (the group may have elected another)")

    # ------------------------------------------------------------------ join

    async def join(self) -> ServerConfig:
        """Decide this broker's role; returns the config to start with (a ``[slave]``
        section pointing at the epoch's master when following, none when leading)."""
        self._loop = asyncio.get_running_loop()
        self.client.add_listener(self._on_state)
        while True:  # without ZooKeeper this broker cannot know whether it is master: wait
            try:
                await self._zk(self.client.start, min(self.session_s * 5, 15.0))
                await self._zk(self.client.ensure_path, f"{self.base}/epochs")
                break
            except (KazooException, KazooTimeoutError) as e:
                log.error(
                    "autoFailover: ZooKeeper %s unreachable (%s): waiting for it before "
                    "taking a role",
                    self.config.zookeeper.zk_connect,
                    type(e).__name__,
                )
                await asyncio.sleep(1.0)
        local = self._read_local()
        while True:
            got = await self._read_epoch()
            cur = got[0] if got else None
            mine = cur.member == self.member if cur else self.config.slave is None
            if mine:
                if await self._try_lock(LOCK_TRY_S):
                    again = await self._read_epoch()
                    if (again[0] if again else None) != cur:
                        await self._release()
                        continue  # someone led meanwhile: look again
                    await self._lead(again)
                    return replace(self.config, slave=None)
                continue
            if cur is None:  # a configured slave before any master led: follow its config
                log.info("failover: no epoch yet; following the configured master")
                return self.config
            return await self._follow(cur, local)

    async def _try_lock(self, timeout: float) -> bool:
        def attempt() -> bool:
            try:
                return bool(self.lock.acquire(timeout=timeout))
            except LockTimeout:
                return False

        return await self._zk(attempt)

    async def _release(self) -> None:
        with contextlib.suppress(KazooException):
            await self._zk(self.lock.release)

    async def _lead(self, cur: tuple[EpochInfo, int] | None) -> None:
        """Holding the lock: open the next epoch with this broker's ends."""
        new = (cur[0].epoch if cur else 0) + 1
        ends = [(p.topic, p.index, p.end) for p in self.store.all_partitions() if not p.memory]
        node = f"{self.base}/epochs/{epoch_node_name(new)}"
        value = encode_ends(ends, self.redo_span(), self.log_spans())
        try:
            await self._zk(self.client.create, node, value)
        except NodeExistsError:
            await self._zk(self.client.set, node, value)
        info = EpochInfo(new, self.member, self.address)
        if cur is None:
            await self._zk(self.client.create, self._epoch_path, encode_epoch(info))
        else:  # versioned: fails if anyone wrote it since we read it
            await self._zk(self.client.set, self._epoch_path, encode_epoch(info), cur[1])
        self._write_local(new)
        self.epoch = new
        self.leader = True
        self.elections += 1
        self._lease_at = time.monotonic()
        with contextlib.suppress(KazooException):  # a leader is no candidate
            await self._zk(self.client.delete, f"{self.base}/members/{self.member}")
        log.warning("failover: broker %s leads epoch %d", self.address, new)
        await self._trim_history(new)

    async def _trim_history(self, new: int) -> None:
        with contextlib.suppress(KazooException):
            kids = await self._zk(self.client.get_children, f"{self.base}/epochs")
            for k in sorted(kids):
                if k.isdigit() and int(k) <= new - KEEP_EPOCHS:
                    await self._zk(self.client.delete, f"{self.base}/epochs/{k}")

    async def _follow(self, cur: EpochInfo, local: int) -> ServerConfig:
        if local < cur.epoch:
            await self._truncate(local, cur.epoch)
            self._write_local(cur.epoch)
        self.epoch = cur.epoch
        base = self.config.slave or SlaveConfig(slave_id=self.member)
        slave = replace(base, slave_id=self.member, master_address=cur.address)
        log.warning(
            "failover: following %s, master of epoch %d (member %d)",
            cur.address,
            cur.epoch,
            cur.member,
        )
        return replace(self.config, slave=slave)

    async def _truncate(self, local: int, current: int) -> None:
        """Cut each partition to the lowest epoch-start end of epochs ``local+1..current``
        and drop the redo-log copy: what remains is a prefix of the new master's bytes."""
        cut: dict[tuple[str, int], int] = {}
        redo: list[tuple[int, int, int] | None] = []
        spans: dict[str, list[tuple[int, int, int] | None]] = {"delaylog": [], "queuelog": []}
        for e in range(local + 1, current + 1):
            try:
                raw, _ = await self._zk(
                    self.client.get, f"{self.base}/epochs/{epoch_node_name(e)}"
                )
            except NoNodeError:
                if local == 0:
                    continue  # never in an epoch: nothing of ours to compare
                raise FailoverError(
                    f"autoFailover: epoch {e}'s start is no longer kept in ZooKeeper; this "
                    f"broker (last in epoch {local}) must be re-seeded: clear its data"
                ) from None
            for key, start in decode_ends(bytes(raw)).items():
                cut[key] = min(start, cut.get(key, start))
            redo.append(decode_redo(bytes(raw)))
            for name, got in spans.items():
                got.append(decode_redo(bytes(raw), name))
        for part in self.store.all_partitions():
            end = cut.get((part.topic, part.index), -1)
            if end < 0 or part.memory or part.end <= end:
                continue
            if end < part.min_offset:
                raise FailoverError(
                    f"autoFailover: {part.topic}-{part.index} must be cut to {end}, below its "
                    f"first offset {part.min_offset}: clear this broker's data and restart"
                )
            log.warning(
                "failover: %s-%d: cutting %d bytes the new master never had (%d -> %d)",
                part.topic,
                part.index,
                part.end - end,
                part.end,
                end,
            )
            part.rollback_to(end)
            part.sync()
        # the replicated logs (redo, delay queue, queue state) are dropped and pulled again
        # from the new master, as a new slave's: a tail this broker wrote as master (or
        # pulled from a master that was replaced) may not be the new master's, and its own
        # checkpoints may have discarded records the new history still needs
        sysc = self.config.system
        redo_kept = self._cut_redo(redo) if local else False
        delay_kept = local and self._cut_log(sysc.delay_log_path, spans["delaylog"], "delay log")
        queue_kept = local and self._cut_log(sysc.queue_log_path, spans["queuelog"], "queue log")
        for what, path in (
            ("redo log", None if redo_kept else sysc.tx_log_path),
            ("delay-queue log", None if delay_kept else sysc.delay_log_path),
            ("queue-state log", None if queue_kept else sysc.queue_log_path),
        ):
            if path is not None and path.exists():
                log.warning("failover: dropping the %s %s (re-copied from the master)", what,
                            path)  # fmt: skip
                shutil.rmtree(path)

    def _cut_redo(self, spans: list[tuple[int, int, int] | None]) -> bool:
        """Cut the redo log at the lowest epoch-start end of the epochs missed, when each
        recorded it and this broker still holds every segment from the oldest any of those
        masters held (so its checkpoints cannot have let go of a record the new history
        needs). Returns whether the log was kept (False: drop it, pull it all)."""
        return self._cut_log(self.config.system.tx_log_path, spans, "redo log")

    def _cut_log(
        self, path: Path, spans: list[tuple[int, int, int] | None], what: str
    ) -> bool:
        """:meth:`_cut_redo` for any replicated log (the delay-queue and queue-state logs
        too: their state is rebuilt from the CKPT/SNAPSHOT records in the segments kept, as
        the checkpoint file is dropped, and every segment from the oldest the new master
        held is there, so recovery sees what the new master's own copy would)."""
        if not spans or any(s is None for s in spans):
            return False
        first = min(s[0] for s in spans if s is not None)
        at = min(Position(s[1], s[2]) for s in spans if s is not None)
        removed = cut_log(path, at, first) if path.exists() else None
        if removed is None:
            return False
        log.warning(
            "failover: %s %s kept up to %d:%d (%d bytes cut); pulling only the rest",
            what, path, at.file_no, at.offset, removed,
        )  # fmt: skip
        return True

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        """Run the lease (master) or the watch and contention (slave) in the background."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="failover")

    def fence(self) -> str | None:
        """Why this master must refuse writes now, or None."""
        if not self.leader:
            return self.demoted or None
        if self.demoted:
            return self.demoted
        if self._suspended:
            return (
                f"fenced: the ZooKeeper connection of the master of failover epoch {self.epoch} "
                "is suspended; retry (another broker may be elected)"
            )
        age = time.monotonic() - self._lease_at
        if age > self.lease_s:
            return (
                f"fenced: leadership of failover epoch {self.epoch} not confirmed by ZooKeeper "
                f"for {age:.1f}s; retry (another broker may be elected)"
            )
        return None

    def saw_epoch(self, epoch: int) -> None:
        """A replication peer named ``epoch``: newer than this master's means it was
        replaced (demoted at once, before ZooKeeper says so); a follower rejoins."""
        if not self.epoch or epoch <= self.epoch:
            return
        if self.leader:
            self._demote(f"a replication peer is in epoch {epoch}")
        elif not self.rejoin.is_set():
            log.warning("failover: a peer is in epoch %d (this broker: %d): rejoining", epoch,
                        self.epoch)  # fmt: skip
            self._cancel_acquire()
            self.rejoin.set()

    def poke(self, epoch: int) -> None:
        """A producer declared ``epoch`` (the ``epoch`` extension), newer than this
        broker's: confirm with ZooKeeper now instead of at the next renewal. A client's word
        alone does not demote (it is not authenticated as a replication peer is); its writes
        are refused meanwhile."""
        if not self.leader or epoch <= self.epoch or self._poking or self._closing:
            return
        self._poking = True

        async def check() -> None:
            try:
                await self._renew()
            except (KazooException, KazooTimeoutError, ValueError) as e:
                log.debug("failover: %s", e)
            finally:
                self._poking = False

        self._poke_task = asyncio.get_running_loop().create_task(check(), name="failover-poke")

    def _demote(self, why: str) -> None:
        if self.demoted:
            return
        self.demoted = f"fenced: no longer the master of failover epoch {self.epoch}: {why}"
        log.error("failover: %s; rejoining as a slave", self.demoted)
        self.rejoin.set()

    async def _run(self) -> None:
        step = max(0.05, self.session_s * RENEW_FRACTION)
        while not self._closing:
            try:
                if self.leader:
                    await self._renew()
                else:
                    await self._follower_step()
            except (KazooException, KazooTimeoutError, ValueError) as e:
                log.debug("failover: %s", e)
            await asyncio.sleep(step)

    async def _renew(self) -> None:
        sent = time.monotonic()
        got = await self._read_epoch()
        if got is None or got[0].epoch != self.epoch or got[0].member != self.member:
            who = f"epoch {got[0].epoch} is led by member {got[0].member}" if got else "no epoch"
            self._demote(who)
            return
        if self.client.state == KazooState.CONNECTED:
            self._lease_at = max(self._lease_at, sent)

    async def _follower_step(self) -> None:
        got = await self._read_epoch()
        if got is None or self.rejoin.is_set():
            return
        cur = got[0]
        if self.epoch == 0:  # followed the configured master before it opened epoch 1
            if cur.address == (self.config.slave.master_address if self.config.slave else ""):
                self.epoch = cur.epoch
                self._write_local(cur.epoch)
                self.epoch_known(cur.epoch)
            else:
                self.rejoin.set()
            return
        if cur.epoch > self.epoch:
            log.warning("failover: epoch %d (%s) replaced %d: rejoining", cur.epoch, cur.address,
                        self.epoch)  # fmt: skip
            self._cancel_acquire()
            self.rejoin.set()
            return
        eligible = self.eligible()
        await self._publish(eligible)
        if eligible and time.monotonic() < self._yield_until:
            eligible = False  # it handed the lock on: the other member's turn
        if eligible and self._acquire is None:
            self._acquire = asyncio.get_running_loop().run_in_executor(
                self._pool, self._acquire_blocking
            )
            self._acquire.add_done_callback(self._acquired)
        elif not eligible and self._acquire is not None:
            self._cancel_acquire()

    def _size(self) -> int:
        return sum(p.end for p in self.store.all_partitions() if not p.memory)

    async def _publish(self, eligible: bool) -> None:
        """Write this follower's ``members/<N>`` node (ephemeral) when its value changed."""
        value = encode_member(MemberInfo(eligible, self._size(), self.address))
        if value == self._published:
            return
        path = f"{self.base}/members/{self.member}"
        try:
            await self._zk(self.client.set, path, value)
        except NoNodeError:
            await self._zk(self.client.create, path, value, ephemeral=True, makepath=True)
        self._published = value

    async def _better_member(self) -> tuple[int, MemberInfo] | None:
        """An eligible member holding more data than this one (the largest), or None."""
        mine = self._size()
        best: tuple[int, MemberInfo] | None = None
        base = f"{self.base}/members"
        for kid in await self._zk(self.client.get_children, base):
            if not kid.isdigit() or int(kid) == self.member:
                continue
            try:
                raw, _ = await self._zk(self.client.get, f"{base}/{kid}")
                info = decode_member(bytes(raw))
            except (NoNodeError, ValueError):
                continue
            if info.eligible and info.size > max(mine, best[1].size if best else -1):
                best = (int(kid), info)
        return best

    def _acquire_blocking(self) -> bool:
        try:
            return bool(self.lock.acquire())
        except KzCancelledError:
            return False

    def _cancel_acquire(self) -> None:
        if self._acquire is not None:
            self.lock.cancel()

    def _acquired(self, fut: asyncio.Future[bool]) -> None:
        self._acquire = None
        ok = not fut.cancelled() and fut.exception() is None and fut.result()
        if ok and not self._closing:
            asyncio.get_running_loop().create_task(self._take_over(), name="failover-take-over")

    async def _take_over(self) -> None:
        got = await self._read_epoch()
        if got is None or got[0].epoch != self.epoch or not self.eligible():
            log.info("failover: got the lock but not eligible now; releasing it")
            await self._release()
            return
        try:
            better = await self._better_member()
        except (KazooException, KazooTimeoutError) as e:
            log.warning("failover: members not read (%s): taking over", e)
            better = None
        if better is not None:  # the in-sync member with the most data leads
            log.warning(
                "failover: member %d (%s) holds %d bytes, this one %d: handing the lock on",
                better[0], better[1].address, better[1].size, self._size(),
            )  # fmt: skip
            self.handed_on += 1
            self._yield_until = time.monotonic() + self.session_s
            await self._release()
            return
        t0 = time.monotonic()
        self.stop_replication()
        try:
            await self._lead(got)
        except (KazooException, KazooTimeoutError) as e:
            log.error("failover: could not open a new epoch (%s); rejoining", e)
            self.rejoin.set()
            return
        self.promoted(self.epoch)
        log.warning(
            "failover: promoted to master of epoch %d in %.3fs",
            self.epoch,
            time.monotonic() - t0,
        )

    def stats_items(self) -> list[tuple[str, object]]:
        """``stats`` lines: epoch, role in the election, fence state."""
        return [
            ("failover_epoch", self.epoch),
            ("failover_member", self.member),
            ("failover_leader", self.leader),
            ("failover_fenced", self.fence() or "-"),
            ("failover_contending", self._acquire is not None),
            ("failover_handed_on", self.handed_on),
        ]

    async def close(self) -> None:
        """Leave the election (the lock and the session end at once)."""
        self._closing = True
        self._cancel_acquire()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        with contextlib.suppress(Exception):
            self.client.remove_listener(self._on_state)
        with contextlib.suppress(Exception):
            await self._zk(self.client.stop)
        with contextlib.suppress(Exception):
            await self._zk(self.client.close)
        self._pool.shutdown(wait=False, cancel_futures=True)
