"""Synchronous replication, master side (MetaQ's "samsa"): every batch the master appends is
pushed to the slave (``msync``) and the producers' acknowledgements wait for the slave's.

Pushes are pipelined on one connection, in append order, so the slave appends at the same
offsets. When the slave does not confirm within ``syncSlaveTimeout`` ms (down, slow, or
behind and catching up by pulling), the batch counts as a failure and the configured policy
applies:

* ``refuse`` (default): the put fails with 503; after ``syncSlaveMaxFailures`` consecutive
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
from typing import Protocol

from notify.errors import NotifyError
from notify.protocol.frames import Response, encode_msync, encode_offset
from notify.protocol.replies import parse_offset
from notify.replication.link import BrokerLink, connect_link
from notify.replication.redo import DELAYLOG_STREAM, TXLOG_STREAM
from notify.store.manager import MessageStore
from notify.store.partition import Partition
from txlog import Position


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
        self, part: Partition, base: int, data: bytes | bytearray, count: int
    ) -> asyncio.Future[None] | None:
        """Push a batch the master just appended at ``base``; None when nothing to wait for."""
        return self._push(part.topic, part.index, base, data, count)

    def replicate_redo(self, at: Position, frames: bytes) -> asyncio.Future[None]:
        """Push frames the master's redo log wrote at ``at`` (``b""``: segment ``at.file_no``
        was closed at ``at.offset``); the slave answers once they are on its disk."""
        return self._push(TXLOG_STREAM, at.file_no, at.offset, frames, 0)

    def replicate_delay_log(self, at: Position, frames: bytes) -> asyncio.Future[None]:
        """The same for the delay queue's log (stream ``__delaylog``)."""
        return self._push(DELAYLOG_STREAM, at.file_no, at.offset, frames, 0)

    def _push(
        self, topic: str, index: int, base: int, data: bytes | bytearray, count: int
    ) -> asyncio.Future[None]:
        loop = self.service.loop
        out: asyncio.Future[None] = loop.create_future()
        link = self.link
        if link is None or not link.is_open:
            self._failed(out, "not connected")
            return out
        payload = bytes(data)
        try:
            sent = link.submit(
                lambda o: encode_msync(topic, index, payload, count, base, o)
            )
        except NotifyError as e:
            self._failed(out, str(e))
            return out
        timer = loop.call_later(self.timeout_s, self._timeout, sent)
        sent.add_done_callback(lambda f: self._answered(f, out, timer))
        self.pushed_batches += 1
        return out

    def _timeout(self, sent: asyncio.Future[Response]) -> None:
        if not sent.done():
            sent.set_exception(TimeoutError(f"no answer within {self.timeout_s}s"))

    def _answered(
        self, sent: asyncio.Future[Response], out: asyncio.Future[None], timer: asyncio.Handle
    ) -> None:
        timer.cancel()
        if sent.cancelled():
            return self._failed(out, "cancelled")
        exc = sent.exception()
        if exc is not None:
            return self._failed(out, str(exc))
        r = sent.result()
        if r.code != 200:
            return self._failed(out, f"slave answered {r.code} {r.body[:120].decode('latin-1')}")
        self.failures = 0
        if not out.done():
            out.set_result(None)

    def _failed(self, out: asyncio.Future[None], why: str) -> None:
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
                    self.link = await connect_link(self.addr, self.secret, self.broker_id, self.tls)
                    log.info("connected to synchronous slave %s", self.addr)
                if (self.refusing or self.degraded) and await self._in_sync(self.link):
                    log.info("synchronous slave %s is back in sync", self.addr)
                    self.refusing = False
                    self.degraded = False
                    self.failures = 0
            except NotifyError as e:
                self.last_error = str(e)
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
            if r.code != 200 or parse_offset(r.body) != part.end:
                return False
        return True

    def stats_items(self) -> list[tuple[str, object]]:
        state = "refusing" if self.refusing else ("degraded" if self.degraded else "in_sync")
        return [
            ("role", "master"),
            ("sync_slave", self.addr),
            ("sync_slave_state", state),
            ("sync_slave_connected", bool(self.link and self.link.is_open)),
            ("sync_pushed_batches", self.pushed_batches),
            ("sync_failed_batches", self.failed_batches),
            ("sync_last_error", self.last_error or "-"),
        ]
