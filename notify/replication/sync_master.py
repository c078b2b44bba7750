"""Synchronous replication, master side (MetaQ's "samsa"): every batch the master appends is
pushed to the slave (``msync``) and the producers' acknowledgements wait for the slave's.

Pushes are pipelined on one connection, in append order, so the slave appends at the same
offsets. When the slave does not confirm within ``syncSlaveTimeout`` ms (down, slow, or
behind and catching up by pulling), the batch counts as a failure and the configured policy
applies:

* ``refuse`` (default): the put fails with 503 and is not stored: the batch was appended
  *held* (invisible to readers, :meth:`Partition.append`) and is taken back (truncated,
  fsynced) before the 503, with whatever was appended after it; a slave that got it anyway
  is cut back to the master's end by the probe (an empty ``msync`` at that offset). After
  ``syncSlaveMaxFailures`` consecutive
  failures the master stops accepting puts at all (503 at once) and probes the slave until
  every partition's end matches its own, then accepts again;
* ``async``: the put is acknowledged anyway (the slave's puller catches up later) and the
  master is flagged degraded — in the log and in ``stats`` — until the slave is back in sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import time
from collections.abc import Callable
from typing import Protocol

from notify.errors import NotifyError
from notify.protocol.frames import Response, encode_msync, encode_offset
from notify.protocol.replies import parse_offset
from notify.replication.link import BrokerLink, connect_link
from notify.replication.redo import TXLOG_STREAM
from notify.store.manager import MessageStore
from notify.store.partition import Partition
from notify.txlog import Position


class _Host(Protocol):
    """What the synchronous-replication master needs from the broker."""

    loop: asyncio.AbstractEventLoop
    store: MessageStore

log = logging.getLogger("notify.replication")

PROBE_S = 0.5


class SyncReplicationError(NotifyError):
    """The synchronous slave did not confirm a batch."""

    retriable = True


class SyncMaster:
    """Pushes appended batches to one synchronous slave."""

    def __init__(
        self,
        service: _Host,
        addr: str,
        timeout_ms: int,
        policy: str,
        max_failures: int,
        secret: str,
        broker_id: int,
        tls: ssl.SSLContext | None = None,
    ):
        self.service = service
        self.broker_id = broker_id
        self.addr = addr
        self.timeout_s = timeout_ms / 1000.0
        self.policy = policy
        self.max_failures = max_failures
        self.secret = secret
        self.tls = tls
        self.link: BrokerLink | None = None
        self.failures = 0
        self.refusing = False
        self.degraded = False
        self.pushed_batches = 0
        self.failed_batches = 0
        self.last_error = ""
        self._task: asyncio.Task[None] | None = None
        self._last_warn = 0.0
        #: failover epoch of this master (0 = no automatic failover): the link names it
        self.epoch = 0
        #: (id(partition), base) -> (partition, reply future) of held batches not confirmed
        self._held: dict[tuple[int, int], tuple[Partition, asyncio.Future[None]]] = {}
        #: called after held batches from (partition, offset) on were taken back
        self.on_dropped: Callable[[Partition, int], None] | None = None
        self.dropped_batches = 0
        self.kept_batches = 0
        self._resync = False  # something was taken back: the probe checks the slave's ends
        #: the probe has seen the slave's partitions end where this master's do (until then
        #: ``stats`` says ``connecting``, not ``in_sync``: nothing confirmed it yet)
        self.confirmed = False
        self._probe_warned = 0.0

    @property
    def holds(self) -> bool:
        """Whether puts are appended held until this slave confirms them (``refuse``)."""
        return self.policy == "refuse"

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._probe(), name="sync-master")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.link is not None:
            self.link.close()

    @property
    def accepting(self) -> bool:
        return not self.refusing

    def refusal(self) -> str:
        return (
            f"synchronous slave {self.addr} is unavailable ({self.last_error}); "
            "not accepting messages until it is back in sync"
        )

    # ------------------------------------------------------------------ pushing

    def replicate(
        self, part: Partition, base: int, data: bytes | bytearray | memoryview, count: int
    ) -> asyncio.Future[None] | None:
        """Push a batch the master just appended at ``base``; None when nothing to wait for.
        A held batch is confirmed to its partition, or taken back, before its future ends."""
        if not (self.holds and part.holds_last(base)) or (id(part), base) in self._held:
            return self._push(part.topic, part.index, base, data, count)
        out = self._push(
            part.topic, part.index, base, data, count, functools.partial(self._settled, part, base)
        )
        if not out.done():
            self._held[(id(part), base)] = (part, out)
        return out

    def _settled(self, part: Partition, base: int, ok: bool) -> None:
        self._held.pop((id(part), base), None)
        if ok:
            part.confirm(base)
            return
        if not part.held_from(base):
            # something another log covers (an applied transaction, a delay move) was
            # appended after it meanwhile: it cannot be cut out, so it stays (and is visible)
            part.confirm(base)
            self.kept_batches += 1
            log.warning(
                "%s-%d: refused batch at %d kept (appended over)", part.topic, part.index, base
            )
            return
        try:
            part.drop_from(base)
            # a recovery point past the cut would start the next crash's scan mid-record
            self.service.store.write_recovery_points()
        except (NotifyError, OSError) as e:  # a failed partition refuses the rest
            log.error("%s-%d: taking back refused puts failed: %s", part.topic, part.index, e)
        self.dropped_batches += 1
        self._resync = True
        if self.on_dropped is not None:
            self.on_dropped(part, base)
        later = [k for k in self._held if k[0] == id(part) and k[1] >= base]
        for k in later:  # taken back with it: never acknowledged
            _p, fut = self._held.pop(k)
            if not fut.done():
                fut.set_exception(SyncReplicationError("an earlier batch was refused"))

    def replicate_redo(self, at: Position, frames: bytes) -> asyncio.Future[None]:
        """Push frames the master's redo log wrote at ``at`` (``b""``: segment ``at.file_no``
        was closed at ``at.offset``); the slave answers once they are on its disk."""
        return self._push(TXLOG_STREAM, at.file_no, at.offset, frames, 0)

    def replicate_log(self, stream: str, at: Position, frames: bytes) -> asyncio.Future[None]:
        """The same for another replicated log (``__delaylog``, ``__queuelog``)."""
        return self._push(stream, at.file_no, at.offset, frames, 0)

    def _push(
        self,
        topic: str,
        index: int,
        base: int,
        data: bytes | bytearray | memoryview,
        count: int,
        hook: Callable[[bool], None] | None = None,
    ) -> asyncio.Future[None]:
        loop = self.service.loop
        out: asyncio.Future[None] = loop.create_future()
        link = self.link
        if link is None or not link.is_open:
            self._failed(out, "not connected", hook)
            return out
        payload = bytes(data)
        try:
            sent = link.submit(
                lambda o: encode_msync(topic, index, payload, count, base, o)
            )
        except NotifyError as e:
            self._failed(out, str(e), hook)
            return out
        timer = loop.call_later(self.timeout_s, self._timeout, sent)
        sent.add_done_callback(lambda f: self._answered(f, out, timer, hook))
        self.pushed_batches += 1
        return out

    def _timeout(self, sent: asyncio.Future[Response]) -> None:
        if not sent.done():
            sent.set_exception(TimeoutError(f"no answer within {self.timeout_s}s"))

    def _answered(
        self,
        sent: asyncio.Future[Response],
        out: asyncio.Future[None],
        timer: asyncio.Handle,
        hook: Callable[[bool], None] | None = None,
    ) -> None:
        timer.cancel()
        if sent.cancelled():
            return self._failed(out, "cancelled", hook)
        exc = sent.exception()
        if exc is not None:
            return self._failed(out, str(exc), hook)
        r = sent.result()
        if r.code != 200:
            why = f"slave answered {r.code} {r.body[:120].decode('latin-1')}"
            return self._failed(out, why, hook)
        self.failures = 0
        if not out.done():
            if hook is not None:
                hook(True)
            out.set_result(None)

    def _failed(
        self, out: asyncio.Future[None], why: str, hook: Callable[[bool], None] | None = None
    ) -> None:
        if hook is not None and not out.done():
            hook(False)  # a held batch is taken back before anyone hears of the failure
        self.failures += 1
        self.failed_batches += 1
        self.last_error = why
        if self.policy == "async":
            if not self.degraded or time.monotonic() - self._last_warn > 60:
                log.warning(
                    "synchronous slave %s did not confirm (%s): DEGRADED to asynchronous "
                    "replication until it catches up",
                    self.addr,
                    why,
                )
                self._last_warn = time.monotonic()
            self.degraded = True
            if not out.done():
                out.set_result(None)
            return
        if self.failures >= self.max_failures and not self.refusing:
            self.refusing = True
            log.error(
                "synchronous slave %s failed %d times (%s): refusing puts until it is back",
                self.addr,
                self.failures,
                why,
            )
        if not out.done():
            out.set_exception(SyncReplicationError(f"synchronous slave did not confirm: {why}"))

    # ------------------------------------------------------------------ probing

    async def _probe(self) -> None:
        while True:
            try:
                if self.link is None or not self.link.is_open:
                    self.link = await connect_link(
                        self.addr, self.secret, self.broker_id, self.tls, self.epoch
                    )
                    log.info("connected to synchronous slave %s", self.addr)
                if (
                    self.refusing or self.degraded or self._resync or not self.confirmed
                ) and await self._in_sync(self.link):
                    log.info(
                        "synchronous slave %s is %s",
                        self.addr,
                        "back in sync" if self.confirmed else "in sync",
                    )
                    self.confirmed = True
                    self._resync = False
                    self.refusing = False
                    self.degraded = False
                    self.failures = 0
            except NotifyError as e:
                self.last_error = str(e)
                if time.monotonic() - self._probe_warned > 60:  # once a minute at most
                    self._probe_warned = time.monotonic()
                    log.warning("synchronous slave %s: no link yet (%s)", self.addr, e)
                if self.link is not None:
                    self.link.close()
                self.link = None
            await asyncio.sleep(PROBE_S)

    async def _in_sync(self, link: BrokerLink) -> bool:
        for part in self.service.store.all_partitions():
            if part.memory:
                continue
            r = await link.request(
                functools.partial(encode_offset, part.topic, "sync-probe", part.index, 2**63 - 1),
                timeout_s=self.timeout_s,
            )
            if r.code != 200:
                return False
            slave_end = parse_offset(r.body)
            if slave_end > part.end and self.holds:
                # it kept puts this master refused and took back: cut it back to our end
                t = await link.request(
                    functools.partial(encode_msync, part.topic, part.index, b"", 0, part.end),
                    timeout_s=self.timeout_s,
                )
                log.warning(
                    "synchronous slave %s: %s-%d cut back from %d to %d (%d %s)",
                    self.addr, part.topic, part.index, slave_end, part.end, t.code,
                    t.body[:80].decode("latin-1"),
                )  # fmt: skip
                return False
            if slave_end != part.end:
                return False
        return True

    def stats_items(self) -> list[tuple[str, object]]:
        if self.refusing or self.degraded:
            state = "refusing" if self.refusing else "degraded"
        else:
            state = "in_sync" if self.confirmed else "connecting"

        return [
            ("role", "master"),
            ("sync_slave", self.addr),
            ("sync_slave_state", state),
            ("sync_slave_connected", bool(self.link and self.link.is_open)),
            ("sync_pushed_batches", self.pushed_batches),
            ("sync_failed_batches", self.failed_batches),
            ("sync_refused_taken_back", self.dropped_batches),
            ("sync_refused_kept", self.kept_batches),
            ("sync_last_error", self.last_error or "-"),
        ]
