"""Value objects shared by producers and consumers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from notify.protocol.records import Record, split_payload

from ._routing import Partition


@dataclass(frozen=True, slots=True)
class SendResult:
    """Outcome of one send (MetaQ's SendResult).

    ``success`` False carries the ``error`` (a :class:`~notify.errors.ClientError`) and
    leaves ``offset``/``msg_id`` at -1. A message written to the ordered producer's local
    spool (its partition was unavailable) is ``success`` with ``spooled`` True and offset -1:
    it will be delivered when the partition comes back.
    """

    success: bool
    partition: Partition | None
    offset: int = -1
    msg_id: int = -1
    error: Exception | None = None
    spooled: bool = False

    def raise_for_error(self) -> SendResult:
        """Raise ``error`` when the send failed; return self otherwise."""
        if not self.success and self.error is not None:
            raise self.error
        return self


@dataclass(frozen=True, slots=True)
class BatchSendResult:
    """Outcome of one :meth:`~notify.client.AsyncProducer.send_batch` (one object per batch,
    not per message).

    ``success`` True: every message is stored, ``msg_ids[i]`` and ``offsets[i]`` belong to
    the i-th message (offsets -1 when the broker does not report them, e.g. spooled).
    ``success`` False carries the ``error``; a batch larger than one ``mput`` frame goes as
    several frames, and ``msg_ids``/``offsets`` then list the messages of the frames that
    were stored (the error says how many), not aligned with the input.
    """

    success: bool
    partition: Partition | None
    msg_ids: Sequence[int] = ()
    offsets: Sequence[int] = ()
    error: Exception | None = None
    spooled: bool = False

    def __len__(self) -> int:
        return len(self.msg_ids)

    def raise_for_error(self) -> BatchSendResult:
        """Raise ``error`` when the batch failed; return self otherwise."""
        if not self.success and self.error is not None:
            raise self.error
        return self

    def results(self) -> list[SendResult]:
        """One :class:`SendResult` per stored message (convenience; costs an object each)."""
        if not self.success:
            return [SendResult(False, self.partition, error=self.error)]
        return [
            SendResult(True, self.partition, off, mid, spooled=self.spooled)
            for mid, off in zip(self.msg_ids, self.offsets, strict=True)
        ]


class Message(NamedTuple):
    """A consumed message. ``offset`` is the byte offset of its record in the partition."""

    topic: str
    partition: Partition
    offset: int
    msg_id: int
    flag: int
    payload: bytes

    @property
    def attribute(self) -> str | None:
        """The message attribute (MetaQ's string tag), or None."""
        return split_payload(self.payload, self.flag)[0]

    @property
    def data(self) -> bytes:
        """The application bytes."""
        return split_payload(self.payload, self.flag)[1]

    @property
    def next_offset(self) -> int:
        """Offset of the record after this one."""
        return self.offset + 20 + len(self.payload)

    @classmethod
    def from_record(cls, topic: str, partition: Partition, rec: Record) -> Message:
        """The message of a decoded record."""
        return cls(topic, partition, rec.offset, rec.msg_id, rec.flag, rec.payload)
