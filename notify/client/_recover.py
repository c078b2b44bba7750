"""The consumer's local recover store and dead letters.

A message whose listener still fails after its retries is written here, durably, before the
consumer's offset moves past it; a background job re-delivers it. After
``max_recover_attempts`` failed re-deliveries it becomes a *dead letter*, kept until an
admin replays or purges it. Layout, one file per message::

    <data_dir>/recover/<group>/pending/<topic>+<brokerId>-<part>+<offset>+<msgId>.msg
    <data_dir>/recover/<group>/dead/<same name>.msg

    file = <JSON header, one line>\\n<payload bytes>
    header = {"topic", "partition", "offset", "msg_id", "flag", "attempts",
              "first_failed_at", "last_failed_at", "last_error"}

Each file is written to ``<name>.tmp``, fsynced and renamed (then the directory fsynced),
so a crash leaves the old or the new version; stray ``.tmp`` files are ignored.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from notify.errors import ClientError
from notify.protocol.records import split_payload

from ._message import Message
from ._routing import Partition

if TYPE_CHECKING:
    from ._producer import AsyncProducer

_SUFFIX = ".msg"


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message held by the recover store (pending re-delivery or dead letter)."""

    id: str
    group: str
    topic: str
    partition: str
    offset: int
    msg_id: int
    flag: int
    payload: bytes
    attempts: int
    first_failed_at: float
    last_failed_at: float
    last_error: str

    @property
    def attribute(self) -> str | None:
        """The message attribute, or None."""
        return split_payload(self.payload, self.flag)[0]

    @property
    def data(self) -> bytes:
        """The application bytes."""
        return split_payload(self.payload, self.flag)[1]

    def to_message(self, address: str = "") -> Message:
        """The :class:`Message` to hand to a listener again."""
        return Message(
            self.topic,
            Partition.parse(self.partition, address),
            self.offset,
            self.msg_id,
            self.flag,
            self.payload,
        )


def _fsync(fd: int) -> None:
    os.fsync(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        _fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(d: Path) -> None:
    dfd = os.open(d, os.O_RDONLY)
    try:
        _fsync(dfd)
    finally:
        os.close(dfd)


def _encode(m: StoredMessage) -> bytes:
    head = {
        "topic": m.topic,
        "partition": m.partition,
        "offset": m.offset,
        "msg_id": m.msg_id,
        "flag": m.flag,
        "attempts": m.attempts,
        "first_failed_at": m.first_failed_at,
        "last_failed_at": m.last_failed_at,
        "last_error": m.last_error,
    }
    return json.dumps(head).encode() + b"\n" + m.payload


def _decode(path: Path, group: str) -> StoredMessage:
    raw = path.read_bytes()
    nl = raw.find(b"\n")
    if nl < 0:
        raise ClientError(f"recover file {path} has no header")
    try:
        h: Any = json.loads(raw[:nl])
        return StoredMessage(
            id=path.name.removesuffix(_SUFFIX),
            group=group,
            topic=str(h["topic"]),
            partition=str(h["partition"]),
            offset=int(h["offset"]),
            msg_id=int(h["msg_id"]),
            flag=int(h["flag"]),
            payload=raw[nl + 1 :],
            attempts=int(h["attempts"]),
            first_failed_at=float(h["first_failed_at"]),
            last_failed_at=float(h["last_failed_at"]),
            last_error=str(h["last_error"]),
        )
    except (ValueError, KeyError, TypeError) as e:
        raise ClientError(f"recover file {path} is not readable: {e}") from e


class RecoverStore:
    """Pending re-deliveries and dead letters of one consumer group, on local disk."""

    def __init__(self, data_dir: Path | str, group: str):
        if not group or any(c in group for c in "/\\\0") or group in (".", ".."):
            raise ClientError(f"invalid group name {group!r}")
        self.group = group
        self.root = Path(data_dir) / "recover" / group
        self.pending_dir = self.root / "pending"
        self.dead_dir = self.root / "dead"
        self._lock = threading.Lock()

    def _ensure(self) -> None:
        self.pending_dir.mkdir(parents=True, exist_ok=True)
        self.dead_dir.mkdir(parents=True, exist_ok=True)

    def add(self, msg: Message, error: str, attempts: int = 0) -> StoredMessage:
        """Durably keep a message for background re-delivery (idempotent per message)."""
        now = time.time()
        sm = StoredMessage(
            id=f"{msg.topic}+{msg.partition}+{msg.offset}+{msg.msg_id}",
            group=self.group,
            topic=msg.topic,
            partition=str(msg.partition),
            offset=msg.offset,
            msg_id=msg.msg_id,
            flag=msg.flag,
            payload=msg.payload,
            attempts=attempts,
            first_failed_at=now,
            last_failed_at=now,
            last_error=error[:2000],
        )
        with self._lock:
            try:
                self._ensure()
                _write_atomic(self.pending_dir / (sm.id + _SUFFIX), _encode(sm))
            except OSError as e:
                raise ClientError(f"cannot write recover store {self.root}: {e}") from e
        return sm

    def _list(self, d: Path) -> list[StoredMessage]:
        try:
            names = sorted(p for p in d.iterdir() if p.name.endswith(_SUFFIX))
        except FileNotFoundError:
            return []
        out = []
        for p in names:
            try:
                out.append(_decode(p, self.group))
            except FileNotFoundError:
                continue
        out.sort(key=lambda m: (m.topic, m.partition, m.offset))
        return out

    def pending(self) -> list[StoredMessage]:
        """Messages waiting for re-delivery, by topic, partition and offset."""
        with self._lock:
            return self._list(self.pending_dir)

    def dead(self) -> list[StoredMessage]:
        """Dead letters, by topic, partition and offset."""
        with self._lock:
            return self._list(self.dead_dir)

    def remove(self, sm: StoredMessage) -> None:
        """Forget a pending message (re-delivered successfully)."""
        with self._lock:
            try:
                (self.pending_dir / (sm.id + _SUFFIX)).unlink()
                _fsync_dir(self.pending_dir)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise ClientError(f"cannot update recover store {self.root}: {e}") from e

    def failed(self, sm: StoredMessage, error: str, max_attempts: int) -> bool:
        """Count a failed re-delivery; returns True when the message became a dead letter."""
        upd = replace(
            sm, attempts=sm.attempts + 1, last_failed_at=time.time(), last_error=error[:2000]
        )
        dead = upd.attempts >= max_attempts
        with self._lock:
            try:
                self._ensure()
                src = self.pending_dir / (sm.id + _SUFFIX)
                if dead:
                    _write_atomic(self.dead_dir / (sm.id + _SUFFIX), _encode(upd))
                    src.unlink(missing_ok=True)
                    _fsync_dir(self.pending_dir)
                else:
                    _write_atomic(src, _encode(upd))
            except OSError as e:
                raise ClientError(f"cannot update recover store {self.root}: {e}") from e
        return dead

    def replay_dead(self, ids: Collection[str] | None = None) -> list[StoredMessage]:
        """Move dead letters (all, or those with the given ids) back to pending, attempts 0."""
        moved: list[StoredMessage] = []
        with self._lock:
            for sm in self._list(self.dead_dir):
                if ids is not None and sm.id not in ids:
                    continue
                self._ensure()
                upd = replace(sm, attempts=0)
                _write_atomic(self.pending_dir / (sm.id + _SUFFIX), _encode(upd))
                (self.dead_dir / (sm.id + _SUFFIX)).unlink(missing_ok=True)
                moved.append(upd)
            if moved:
                _fsync_dir(self.dead_dir)
        return moved

    def purge_dead(self, ids: Collection[str] | None = None) -> int:
        """Delete dead letters (all, or those with the given ids); returns how many."""
        n = 0
        with self._lock:
            for sm in self._list(self.dead_dir):
                if ids is None or sm.id in ids:
                    (self.dead_dir / (sm.id + _SUFFIX)).unlink(missing_ok=True)
                    n += 1
        return n


def _groups(data_dir: Path, group: str | None) -> Iterable[str]:
    if group is not None:
        return [group]
    try:
        return sorted(p.name for p in (data_dir / "recover").iterdir() if p.is_dir())
    except FileNotFoundError:
        return []


def list_dead_letters(data_dir: Path | str, group: str | None = None) -> list[StoredMessage]:
    """Dead letters kept under a consumer's ``data_dir`` (one group, or all groups)."""
    return _collect(Path(data_dir), group, RecoverStore.dead)


def list_pending_recovery(data_dir: Path | str, group: str | None = None) -> list[StoredMessage]:
    """Messages waiting for background re-delivery under ``data_dir``."""
    return _collect(Path(data_dir), group, RecoverStore.pending)


def _collect(
    d: Path, group: str | None, read: Callable[[RecoverStore], list[StoredMessage]]
) -> list[StoredMessage]:
    """``read`` of the store of one group, or of every group under ``d``."""
    return [m for g in _groups(d, group) for m in read(RecoverStore(d, g))]


def replay_dead_letters(
    data_dir: Path | str,
    group: str | None = None,
    ids: Collection[str] | None = None,
) -> int:
    """Hand dead letters back to the recover store for re-delivery to the group's listener.

    The running (or next started) consumer of the group re-delivers them on its next
    recover round, with a fresh attempt count. Returns the number of messages replayed.
    To re-publish them to the topic instead (every group sees them again), use
    :func:`republish_dead_letters`.
    """
    d = Path(data_dir)
    return sum(len(RecoverStore(d, g).replay_dead(ids)) for g in _groups(d, group))


async def republish_dead_letters(
    producer: AsyncProducer,
    data_dir: Path | str,
    group: str,
    ids: Collection[str] | None = None,
) -> int:
    """Send dead letters to their topic again through ``producer``; those sent are purged."""
    store = RecoverStore(Path(data_dir), group)
    sent: list[str] = []
    for sm in store.dead():
        if ids is not None and sm.id not in ids:
            continue
        res = await producer.send(sm.topic, sm.data, attribute=sm.attribute)
        if res.success:
            sent.append(sm.id)
    if sent:
        store.purge_dead(sent)
    return len(sent)
