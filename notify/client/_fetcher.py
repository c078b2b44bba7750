"""The consumer's fetcher (aiokafka's ``consumer/fetcher.py``): ``get`` requests, their
replies decoded into messages, the pull API's concurrent polling, offset look-ups.

Replies to ``get``: ``404`` = nothing new (idle backoff ``idle_backoff_min_s`` doubling to
``idle_backoff_max_s``, or a long poll when ``long_poll_ms`` > 0); ``301`` = continue at the
offset in the body; a window without a whole record grows ``maxSize`` (see
:class:`~notify.client._fetchsize.FetchSizer`); a corrupt record is fetched again a few
times, then skipped (logged and counted). Connection failures back off and resume from
the in-memory offset once the pool has reconnected.

Duplicates: a bounded window of ``(partition, msgId)`` (:class:`DuplicateWindow`) drops a
message delivered already (a re-fetch, a rebalance); its keys are ``tag << 64 | msgId``
with a small tag per partition (:meth:`Fetcher.dedup_base`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Hashable
from typing import Any, Final

from notify.errors import BrokerError, ClientError, ConnectionLostError, ProtocolError
from notify.protocol.frames import Response, encode_get, encode_offset
from notify.protocol.idgen import split_id
from notify.protocol.records import (
    CorruptRecordError,
    Record,
    decode_all,
    decode_as,
    first_record_size,
)
from notify.protocol.replies import parse_offset

from ._config import MAX_OFFSET
from ._connection import ConnectionPool
from ._dedup import DuplicateWindow
from ._message import Message
from ._routing import Partition
from ._subscription import ConsumerContext, ConsumerPart, Cursor, Subscription
from .transport import AsyncConnection

log = logging.getLogger("notify.client")

#: Fetches of a window starting with a corrupt record before the record is skipped.
CORRUPT_REFETCHES: Final = 3

#: What the pull API hands out: ``(cursor, messages, end offset)``.
Batch = tuple[Cursor, list[Message], int]


class Fetcher(ConsumerPart):
    """The ``get`` side of one consumer (see the module docstring)."""

    def __init__(self, ctx: ConsumerContext, pool: ConnectionPool):
        super().__init__(ctx)
        self.pool = pool
        self.dedup = DuplicateWindow(ctx.config.dedup_window)
        #: (broker id, partition) -> its tag in the duplicate window's keys (dedup_base)
        self._dedup_tags: dict[tuple[int, int], int] = {}

    # -- duplicates

    def dedup_base(self, part: Partition) -> int:
        """The duplicate window's key of a message is ``base | msg_id``: ints hash and
        compare several times cheaper than (broker, partition, id) tuples. ``base`` is a
        small per-partition tag above the 64 bits of the id."""
        bp = (part.broker_id, part.partition)
        tag = self._dedup_tags.get(bp)
        if tag is None:
            tag = self._dedup_tags[bp] = len(self._dedup_tags) + 1
        return tag << 64

    def forget(self, part: Partition) -> None:
        """Drop ``part``'s messages from the duplicate window (a seek delivers them again)."""
        tag = self.dedup_base(part) >> 64
        self.dedup.forget(lambda k: _of_tag(k, tag))

    def accepted(self, sub: Subscription, msgs: list[Message]) -> list[Message]:
        """The messages of ``msgs`` to hand out: the filter's and not delivered before."""
        out = []
        st = self.stats
        for m in msgs:
            st.messages += 1
            if sub.accept is not None and not sub.accept(m):
                st.filtered += 1
                continue
            key = self.dedup_base(m.partition) | m.msg_id
            if self.dedup.seen(key):
                st.duplicates += 1
                continue
            self.dedup.add(key)
            st.delivered += 1
            out.append(m)
        return out

    # -- the pull API

    async def take(
        self, sub: Subscription, cursors: list[Cursor], max_wait_s: float
    ) -> Batch | None:
        """The next delivered batch of one partition of ``sub``'s topic within
        ``max_wait_s``, or None. Every cursor has a fetch in flight (kept between calls),
        looked at round robin."""
        topic = sub.topic
        rr = self.state.manual_rr
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, max_wait_s)
        while not self.life.stopping:
            n = len(cursors)
            start = rr.get(topic, 0)
            running: list[asyncio.Task[list[Message]]] = []
            for i in range(n):
                cur = cursors[(start + i) % n]
                if cur.paused or cur.stopped:
                    continue
                task = cur.pending
                if task is None:
                    task = cur.pending = _spawn_fetch(self.poll_one(cur))
                if not task.done():
                    running.append(task)
                    continue
                cur.pending = None
                if task.cancelled() or not (msgs := task.result()):
                    continue
                rr[topic] = (start + i + 1) % n
                cur.position = msgs[-1].next_offset
                cur.msg_id = msgs[-1].msg_id
                out = self.accepted(sub, msgs)
                if out:
                    return cur, out, cur.position
                cur.acked = cur.position  # all filtered or duplicates: handled
            remaining = deadline - loop.time()
            if remaining <= 0 or not running:
                if remaining > 0:  # every partition paused
                    await self.life.sleep(min(remaining, 0.05))
                    continue
                return None
            await asyncio.wait(running, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        return None

    async def poll_one(self, cur: Cursor) -> list[Message]:
        """Fetch at ``cur.position`` until messages arrive (pull API; one per partition):
        long-polled, or with the idle backoff when the broker answers at once."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        idle = err_backoff = cfg.idle_backoff_min_s
        held_s = cfg.long_poll_ms / 2000
        while not self.life.stopping:
            issued = loop.time()
            try:
                msgs = await self.fetch_window(cur)
            except (ClientError, OSError) as e:
                self.stats.fetch_errors += 1
                log.debug("fetch %s %s: %s", cur.topic, cur.partition, e)
                await self.life.sleep(err_backoff)
                err_backoff = min(err_backoff * 2, self.client_config.reconnect_backoff_max_s)
                continue
            if msgs:
                return msgs
            err_backoff = cfg.idle_backoff_min_s
            if cfg.long_poll_ms <= 0 or loop.time() - issued < held_s:
                await self.life.sleep(idle)
                idle = min(idle * 2, cfg.idle_backoff_max_s)
        return []

    async def fetch_window(self, cur: Cursor) -> list[Message]:
        """Fetch at ``cur.position`` until messages, 404 or an error."""
        for _ in range(64):
            offset = cur.position
            msgs = self.decode(cur, offset, await self.get(cur, offset, cur.sizer.current))
            if msgs is not None:
                return msgs
        return []

    # -- get and its replies

    async def get(self, cur: Cursor, offset: int, max_size: int) -> Response:
        """One ``get`` of ``cur``'s partition at ``offset`` (long-polled when configured)."""
        conn = await self.pool.get(cur.partition.address)
        wait_ms = self.config.long_poll_ms
        timeout = self.client_config.request_timeout_s + wait_ms / 1000
        topic, group, part = cur.topic, self.group, cur.partition.partition
        self.stats.fetches += 1
        try:
            r = await conn.request(
                lambda o: encode_get(topic, group, part, offset, max_size, o, max_wait_ms=wait_ms),
                timeout,
            )
            if r.code == 404 and cur.end_checked != offset:
                r = await self._past_end(conn, cur, offset, r)
            return r
        except ConnectionLostError:
            self.pool.discard(conn)
            raise

    async def _past_end(
        self, conn: AsyncConnection, cur: Cursor, offset: int, miss: Response
    ) -> Response:
        """MetaQ answers a get beyond the end of a partition with the same 404 as "nothing
        new yet" (301 only with ``updateConsumerOffsets``). Once per position, ask ``offset``:
        an end below our position (the partition was emptied or recreated, or the stored
        offset is wrong) is treated as MetaQ's 301 to that end."""
        cur.end_checked = offset
        topic, group, part = cur.topic, self.group, cur.partition.partition
        # ``offset`` at Long.MAX_VALUE answers the visible end (at ``offset`` itself it would
        # answer the start of the segment holding it once new data has arrived meanwhile,
        # which is not an end and would rewind us)
        r = await conn.request(
            lambda o: encode_offset(topic, group, part, MAX_OFFSET, o),
            self.client_config.request_timeout_s,
        )
        if r.code == 200:
            try:
                end = int(r.body.split()[0])
            except (IndexError, ValueError):
                return miss
            if end < offset:
                return Response("result", 301, miss.opaque, b"%d" % end)
        return miss

    def decode(self, cur: Cursor, offset: int, r: Response) -> list[Message] | None:
        """Messages of a reply to a get at ``offset``; None: ask again at ``cur.position``."""
        if r.code == 404:
            self.stats.empty_fetches += 1
            return []
        if r.code == 301:
            try:
                cur.position = parse_offset(r.body)
            except ProtocolError as e:
                raise ClientError(str(e)) from None
            self.stats.redirects += 1
            log.info("%s %s: offset %d moved to %d", cur.topic, cur.partition, offset, cur.position)
            if cur.done < 0 or cur.done == offset:
                cur.done = cur.position
                cur.dirty = True
            return None
        if r.code != 200:
            raise BrokerError(r.code, r.body.decode("utf-8", "replace"))
        body = r.body
        if not body:
            self.stats.empty_fetches += 1
            return []
        topic, part = cur.topic, cur.partition
        try:
            recs, _ = decode_as(body, offset, Message, topic, part)
            cur.corrupt = 0
        except CorruptRecordError as e:
            good = memoryview(body)[: e.position - offset]
            recs, _ = decode_as(good, offset, Message, topic, part)
            if not recs:
                self._corrupt(cur, offset, body)
                return None
        if not recs:
            if cur.sizer.exhausted:
                log.error(
                    "%s %s: record at offset %d does not fit %d bytes (max_fetch_bytes)",
                    cur.topic,
                    cur.partition,
                    offset,
                    cur.sizer.current,
                )
                raise ClientError(f"record at offset {offset} exceeds max_fetch_bytes")
            cur.sizer.no_whole_record(body)
            self.stats.fetch_growths += 1
            return None
        cur.sizer.got_records()
        return recs

    def _corrupt(self, cur: Cursor, offset: int, body: bytes) -> None:
        """A window starting with a corrupt record: fetch it again, a few times, then skip
        the record (its length as its header says, at least a header's)."""
        cur.corrupt += 1
        if cur.corrupt < CORRUPT_REFETCHES:
            return
        size = first_record_size(body[:4]) or 0
        log.error(
            "%s %s: skipping corrupt record at offset %d (%d bytes)",
            cur.topic,
            cur.partition,
            offset,
            size,
        )
        self.stats.corrupt_skipped += 1
        cur.corrupt = 0
        cur.position = offset + max(size, 20)

    # -- offsets (positioning and seeking)

    async def ask_offset(self, topic: str, part: Partition, value: int) -> int:
        """The broker's answer to ``offset`` at ``value`` (0: first offset, MAX: end)."""
        conn = await self.pool.get(part.address)
        try:
            r = await conn.request(
                lambda o: encode_offset(topic, self.group, part.partition, value, o),
                self.client_config.request_timeout_s,
            )
        except ConnectionLostError:
            self.pool.discard(conn)
            raise
        if r.code != 200:
            raise BrokerError(r.code, r.body.decode("utf-8", "replace"))
        try:
            return parse_offset(r.body)
        except ProtocolError as e:
            raise ClientError(str(e)) from None

    async def read_at(self, topic: str, part: Partition, offset: int, size: int) -> list[Record]:
        """Whole records of one window at ``offset`` (no long poll; [] at the end)."""
        conn = await self.pool.get(part.address)
        while True:
            try:
                r = await conn.request(
                    functools.partial(encode_get, topic, self.group, part.partition, offset, size),
                    self.client_config.request_timeout_s,
                )
            except ConnectionLostError:
                self.pool.discard(conn)
                raise
            if r.code in (404, 301):
                return []
            if r.code != 200:
                raise BrokerError(r.code, r.body.decode("utf-8", "replace"))
            recs, _ = decode_all(r.body, offset)
            if recs or not r.body:
                return recs
            need = first_record_size(r.body[:4]) or size * 2
            if size >= self.config.max_fetch_bytes:
                raise ClientError(f"record at offset {offset} exceeds max_fetch_bytes")
            size = min(max(need, size * 2), self.config.max_fetch_bytes)

    async def offset_for_time(self, topic: str, part: Partition, ts: float) -> int:
        """Offset of the first record of ``part`` whose id time is >= ``ts`` (else the end).

        Segment starts (``offset`` answers the start of the segment holding a position)
        are bisected on their first record's time; the segment found is then read forward.
        """
        target_ms = int(ts * 1000)
        first = await self.ask_offset(topic, part, 0)
        end = await self.ask_offset(topic, part, MAX_OFFSET)
        best, lo, hi = first, first, end
        while lo < hi:
            mid = (lo + hi) // 2
            seg = await self.ask_offset(topic, part, mid)
            if seg <= best:
                lo = mid + 1
                continue
            recs = await self.read_at(topic, part, seg, 4096)
            if recs and split_id(recs[0].msg_id)[0] < target_ms:
                best, lo = seg, mid + 1
            else:
                hi = seg
        pos = best
        while pos < end:
            recs = await self.read_at(topic, part, pos, 1 << 20)
            if not recs:
                break
            for r in recs:
                if split_id(r.msg_id)[0] >= target_ms:
                    return r.offset
            pos = recs[-1].offset + recs[-1].size
        return max(pos, end)


def _of_tag(key: Hashable, tag: int) -> bool:
    """A duplicate window's key of the partition tagged ``tag`` (see ``dedup_base``)."""
    return isinstance(key, int) and key >> 64 == tag


def _spawn_fetch(coro: Awaitable[list[Message]]) -> asyncio.Task[list[Message]]:
    task: asyncio.Task[list[Message]] = asyncio.ensure_future(coro)
    task.add_done_callback(swallow)
    return task


def swallow(t: asyncio.Future[Any]) -> None:
    """Done callback: retrieve a task's exception (it is reported elsewhere, or moot)."""
    if not t.cancelled():
        t.exception()

