"""The ordered producer's local spool: messages of an unavailable partition, kept in order.

One spool per global partition, replayed in order when the partition is back::

    <spool_dir>/<topic>/<brokerId>-<part>.spool   records in the on-disk layout
                                                  (records.py), msgId 0, appended
    <spool_dir>/<topic>/<brokerId>-<part>.pos     decimal byte position already replayed,
                                                  replaced atomically

An append is one write plus one fsync (a spooled send is acknowledged to the application).
A torn tail (crash during an append) is cut at the last whole, checksum-correct record on
open. When everything is replayed both files are deleted.

:class:`Spool` is the file; :class:`PartitionSpool` is what an ordered producer's partition
does with it: the messages of a partition that stayed unavailable after the retries go to
its spool, and later messages follow them there until a background task has replayed the
spool, in order, to the partition (whose address it learns again after a restart).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from notify.errors import ClientError
from notify.protocol.records import decode_all, encode, scan
from notify.protocol.replies import MultiPutAck

from ._batch import Item, Queued
from ._config import ProducerConfig
from ._files import write_all
from .core.types import Partition

if TYPE_CHECKING:
    from .core.wire import Ack

log = logging.getLogger("notify.client")


class Spool:
    """One partition's spool file and its replay position."""

    def __init__(self, path: Path):
        self.path = path
        self.pos_path = path.with_suffix(".pos")
        self._pos = 0
        self._size = 0
        self._open()

    def _open(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self._pos = self._size = 0
            return
        except OSError as e:
            raise ClientError(f"cannot read spool {self.path}: {e}") from e
        valid, _reason = scan(data, reject_zero_id=False)
        if valid < len(data):
            with open(self.path, "r+b") as f:
                f.truncate(valid)
                self._fsync(f.fileno())
        self._size = valid
        try:
            self._pos = min(int(self.pos_path.read_text().strip() or 0), valid)
        except FileNotFoundError:
            self._pos = 0
        except (OSError, ValueError) as e:
            raise ClientError(f"cannot read spool position {self.pos_path}: {e}") from e

    @property
    def empty(self) -> bool:
        return self._pos >= self._size

    @property
    def pending_bytes(self) -> int:
        return self._size - self._pos

    def append(self, messages: Sequence[tuple[int, bytes]]) -> None:
        """Durably append ``(flag, payload)`` messages."""
        data = b"".join(encode(0, flag, payload) for flag, payload in messages)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                write_all(fd, data)
                self._fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise ClientError(f"cannot append to spool {self.path}: {e}") from e
        self._size += len(data)

    def peek(self, max_count: int, max_bytes: int) -> tuple[list[tuple[int, bytes]], int]:
        """Up to ``max_count`` messages from the replay position; returns them and the end."""
        if self.empty:
            return [], self._pos
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                buf = f.read(max(max_bytes, 1))
        except OSError as e:
            raise ClientError(f"cannot read spool {self.path}: {e}") from e
        recs = decode_all(buf)[0]
        if not recs:  # one record larger than max_bytes
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                buf = f.read(self._size - self._pos)
            recs = decode_all(buf)[0][:1]
        recs = recs[:max_count]
        end = self._pos + sum(r.size for r in recs)
        return [(r.flag, r.payload) for r in recs], end

    def advance(self, end: int) -> None:
        """Mark everything before ``end`` as replayed; delete the files when all is."""
        self._pos = end
        try:
            if self._pos >= self._size:
                self.pos_path.unlink(missing_ok=True)
                self.path.unlink(missing_ok=True)
                self._pos = self._size = 0
                return
            tmp = self.pos_path.with_name(self.pos_path.name + ".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, str(end).encode())
                self._fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.pos_path)
        except OSError as e:
            raise ClientError(f"cannot update spool {self.path}: {e}") from e

    def _fsync(self, fd: int) -> None:
        """The one durability call (replace in tests to inject faults)."""
        os.fsync(fd)


def existing_spools(spool_dir: Path) -> Iterator[tuple[str, str, Path]]:
    """``(topic, "<brokerId>-<part>", path)`` of every spool file left under ``spool_dir``."""
    if not spool_dir.is_dir():
        return
    for tdir in sorted(spool_dir.iterdir()):
        if tdir.is_dir():
            for f in sorted(tdir.glob("*.spool")):
                yield tdir.name, f.stem, f


class SpoolOwner(Protocol):
    """What a :class:`PartitionSpool` needs of its partition's sender."""

    topic: str
    partition: Partition
    queue: deque[Queued]

    @property
    def config(self) -> ProducerConfig: ...

    @property
    def closing(self) -> bool: ...

    def pump(self) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...

    def resolve(self, item: Queued, result: Any) -> None: ...

    def fail(self, items: Sequence[Queued], err: Exception) -> None: ...

    def replayed(self, count: int) -> None: ...

    async def partitions(self) -> list[Partition]: ...

    async def transmit(self, items: Sequence[Queued]) -> MultiPutAck | list[Ack | Exception]: ...


class PartitionSpool:
    """The spool of one partition of an ordered producer and its replay."""

    def __init__(self, owner: SpoolOwner, spool: Spool):
        self.owner = owner
        self.file = spool
        self._replay: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, owner: SpoolOwner) -> PartitionSpool:
        """The spool under ``spool_dir/<topic>/<brokerId>-<part>.spool``."""
        spool_dir = owner.config.spool_dir
        assert spool_dir is not None
        return cls(owner, Spool(Path(spool_dir) / owner.topic / f"{owner.partition}.spool"))

    @property
    def empty(self) -> bool:
        return self.file.empty

    def spool(self, items: Sequence[Queued]) -> None:
        """Append ``items`` (acknowledged to their callers as spooled), start the replay."""
        try:
            self.file.append([r for it in items for r in it.records()])
        except ClientError as e:
            self.owner.fail(items, e)
            return
        for it in items:
            self.owner.resolve(it, it.spooled(self.owner.partition))
        self.start_replay()

    def take_queue(self) -> None:
        """Messages queued while the spool is not empty follow the spooled ones."""
        queue = self.owner.queue
        items = list(queue)
        queue.clear()
        if items:
            self.spool(items)

    def start_replay(self) -> None:
        if self._replay is None or self._replay.done():
            self._replay = self.owner.spawn(self._run())

    async def _resolve_address(self) -> None:
        owner = self.owner
        interval = owner.config.spool_replay_interval_s
        while not owner.partition.address and not owner.closing:
            try:
                parts = await owner.partitions()
            except ClientError as e:
                log.warning("cannot route spool of %s %s yet: %s", owner.topic, owner.partition, e)
                await asyncio.sleep(interval)
                continue
            match = [p for p in parts if p == owner.partition]
            if match:
                owner.partition = match[0]
                return
            log.error("%s has no partition %s: its spool waits", owner.topic, owner.partition)
            await asyncio.sleep(max(1.0, interval))

    async def _run(self) -> None:
        owner = self.owner
        cfg = owner.config
        spool = self.file
        await self._resolve_address()
        while not spool.empty and not owner.closing:
            msgs, end = spool.peek(cfg.batch_max_count, cfg.batch_max_bytes)
            items: list[Queued] = [Item(payload, flag, None) for flag, payload in msgs]
            results: MultiPutAck | list[Ack | Exception] | list[Exception]
            try:
                results = await owner.transmit(items)
            except (ClientError, OSError) as e:
                err: Exception = e
                results = [err] * len(items)
            ok = 0
            if isinstance(results, MultiPutAck):
                ok = len(items)
            else:
                for res in results:
                    if not isinstance(res, tuple):
                        break
                    ok += 1
            if ok == len(items):
                spool.advance(end)
                owner.replayed(ok)
                continue
            if ok:  # advance past the prefix that went through
                _, part_end = spool.peek(ok, cfg.batch_max_bytes)
                spool.advance(part_end)
                owner.replayed(ok)
            await asyncio.sleep(cfg.spool_replay_interval_s)
        if spool.empty and owner.queue:
            owner.pump()
