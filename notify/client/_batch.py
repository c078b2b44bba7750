"""What the producer queues: one message, one ``send_batch`` chunk, or a run of posts, and
how a batch of them is encoded into one ``mput`` body.

Each queued item knows its records (``(flag, payload)`` pairs, in order), its size on disk
(:data:`~notify.protocol.records.HEADER_SIZE` per record plus the payloads) and how to
express its outcome as the result its caller waits for (:class:`SendResult` per message,
:class:`BatchSendResult` per chunk, nothing per post: posts are counted). Pure data and
encoding; the queues live in :mod:`._accumulator`, the sending in :mod:`._sender`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections import deque
from collections.abc import Sequence

from notify.errors import ClientError
from notify.protocol import records as rec

from ._message import BatchSendResult
from .core.types import Partition, SendResult
from .core.wire import Ack


class Item:
    """One queued message (``send_nowait``; ``future`` None for a post)."""

    __slots__ = ("flag", "future", "nbytes", "payload", "topic")
    count = 1
    topic: str  # set for posts only (their failures name it)

    def __init__(
        self,
        payload: bytes,
        flag: int,
        future: asyncio.Future[SendResult] | concurrent.futures.Future[SendResult] | None,
    ):
        self.payload = payload
        self.flag = flag
        self.future = future
        self.nbytes = len(payload) + rec.HEADER_SIZE

    def records(self) -> list[tuple[int, bytes]]:
        return [(self.flag, self.payload)]

    def acked(self, part: Partition, mid: int, off: int) -> SendResult:
        return SendResult(True, part, off, mid)

    def acked_each(self, part: Partition, acks: Sequence[Ack]) -> SendResult:
        return SendResult(True, part, acks[0][1], acks[0][0])

    def failed(self, part: Partition | None, err: Exception) -> SendResult:
        return SendResult(False, part, error=err)

    def spooled(self, part: Partition) -> SendResult:
        return SendResult(True, part, spooled=True)


class BatchItem:
    """Queued messages of one ``send_batch`` chunk: one object and one future for all
    (they share a partition and a flag, and go in one ``mput``)."""

    __slots__ = ("count", "flag", "future", "nbytes", "payloads")

    def __init__(
        self, payloads: list[bytes], flag: int, future: asyncio.Future[BatchSendResult]
    ):
        self.payloads = payloads
        self.flag = flag
        self.future = future
        self.count = len(payloads)
        self.nbytes = sum(map(len, payloads)) + rec.HEADER_SIZE * len(payloads)

    @property
    def payload(self) -> bytes:  # what a selector sees of the batch
        return self.payloads[0] if self.payloads else b""

    def records(self) -> list[tuple[int, bytes]]:
        flag = self.flag
        return [(flag, p) for p in self.payloads]

    def acked(self, part: Partition, mid: int, off: int) -> BatchSendResult:
        n = len(self.payloads)
        offs = rec.record_offsets(off, self.payloads) if off >= 0 else [-1] * n
        return BatchSendResult(True, part, range(mid, mid + n), offs)

    def acked_each(self, part: Partition, acks: Sequence[Ack]) -> BatchSendResult:
        return BatchSendResult(True, part, [a[0] for a in acks], [a[1] for a in acks])

    def failed(self, part: Partition | None, err: Exception) -> BatchSendResult:
        return BatchSendResult(False, part, error=err)

    def spooled(self, part: Partition) -> BatchSendResult:
        n = len(self.payloads)
        return BatchSendResult(True, part, [-1] * n, [-1] * n, spooled=True)


class PostRun(BatchItem):
    """Messages of :meth:`AsyncProducer.post` queued back to back for one partition, with
    one flag: a list of payloads and no future, filled while it is the queue's last item
    (so a message posted one at a time costs a list append, not an object and a future).
    Results are counted by the producer; failures kept as :class:`PostFailure`."""

    __slots__ = ("queue", "topic")

    def __init__(self, topic: str, payload: bytes, flag: int, queue: deque[Queued]):
        self.topic = topic
        self.queue = queue  # its partition's queue: open while it is that queue's tail
        self.payloads = [payload]
        self.flag = flag
        self.future = None  # type: ignore[assignment]
        self.count = 1
        self.nbytes = len(payload) + rec.HEADER_SIZE


Queued = Item | BatchItem


def mput_body(items: Sequence[Queued]) -> bytes:
    """The records of ``items`` back to back (runs of one flag encoded in one go)."""
    out: list[bytes] = []
    run: list[bytes] = []
    run_flag = 0
    encode_batch = rec.encode_batch
    for it in items:
        if isinstance(it, BatchItem):
            if run:
                out.append(encode_batch(run, run_flag))
                run = []
            out.append(encode_batch(it.payloads, it.flag))
            continue
        if it.flag != run_flag and run:
            out.append(encode_batch(run, run_flag))
            run = []
        run_flag = it.flag
        run.append(it.payload)
    if run:
        out.append(encode_batch(run, run_flag))
    return out[0] if len(out) == 1 else b"".join(out)


def chunks(payloads: list[bytes], max_count: int, max_bytes: int) -> list[list[bytes]]:
    """``payloads`` cut into pieces that each fit one mput frame."""
    if len(payloads) <= max_count and (
        sum(map(len, payloads)) + rec.HEADER_SIZE * len(payloads) <= max_bytes
    ):
        return [payloads]
    out: list[list[bytes]] = []
    cur: list[bytes] = []
    size = 0
    for p in payloads:
        n = len(p) + rec.HEADER_SIZE
        if cur and (size + n > max_bytes or len(cur) >= max_count):
            out.append(cur)
            cur = []
            size = 0
        cur.append(p)
        size += n
    out.append(cur)
    return out


def merge_results(
    results: Sequence[SendResult | BatchSendResult | BaseException],
    total: int,
    per_message: bool = False,
) -> BatchSendResult:
    """One :class:`BatchSendResult` for the results (or errors) of a batch that went as
    several frames, or (``per_message``) message by message in a transaction; a failure
    names how many of the ``total`` messages were stored."""
    ids: list[int] = []
    offs: list[int] = []
    errs: list[Exception] = []
    part: Partition | None = None
    for r in results:
        if isinstance(r, BaseException):
            errs.append(r if isinstance(r, Exception) else ClientError(str(r)))
            continue
        part = part or r.partition
        if not r.success:
            errs.append(r.error or ClientError("not stored"))
        elif isinstance(r, SendResult):
            ids.append(r.msg_id)
            offs.append(r.offset)
        else:
            ids += r.msg_ids
            offs += r.offsets
    if not errs:
        spooled = bool(results) and all(getattr(r, "spooled", False) for r in results)
        return BatchSendResult(True, part, ids, offs, spooled=spooled)
    err = errs[0]
    if not per_message:
        err = ClientError(f"{len(ids)} of {total} messages stored; first error: {err}")
    return BatchSendResult(False, part, ids, offs, error=err)
