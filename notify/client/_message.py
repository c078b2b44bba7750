"""Value objects shared by producers and consumers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import NamedTuple

from notify.errors import ClientError
from notify.protocol.idgen import split_id
from notify.protocol.properties import (
    FLAG_PROPERTIES,
    HeaderValue,
    Properties,
    decode_attribute,
    encode_attribute,
    flag_for,
)
from notify.protocol.records import Record, make_payload, split_payload

from .core.types import Partition
from .core.types import SendResult as SendResult

Headers = Mapping[str, HeaderValue]
"""Typed message headers: ``{name: str | int | float | bool | bytes}``."""
Key = bytes | str
"""A message key: picks the partition and stays on the message."""
Draft = tuple[str, bytes, str | None, Key | None, Headers | None]
"""A message as the application gave it, handed on inside the client:
``(topic, data, attribute, key, headers)``."""


def build_payload(
    data: bytes | bytearray | memoryview,
    attribute: str | None,
    key: bytes | str | None = None,
    headers: Headers | None = None,
    producer_id: str | None = None,
    sequence: int = -1,
) -> tuple[bytes, int]:
    """``(payload, flag)`` of a message: MetaQ's plain layout unless it has a key, headers
    or a producer id, which go into the attribute block (:mod:`notify.protocol.properties`).
    Raises ClientError for an attribute the block cannot hold, TypeError for header values
    of another type."""
    if key is None and not headers and producer_id is None:
        if attribute is not None and "\x1e" in attribute:
            raise ClientError("an attribute must not contain U+001E (record separator)")
        return make_payload(bytes(data), attribute)
    props = Properties(attribute, key, headers or {}, producer_id, sequence)
    try:
        text = encode_attribute(props)
    except ValueError as e:
        raise ClientError(str(e)) from None
    payload, _ = make_payload(bytes(data), text)
    return payload, flag_for(props)


class PostFailure(NamedTuple):
    """A message of :meth:`AsyncProducer.post` that was not stored (after its retries).

    ``payload`` and ``flag`` are the record as it was sent (with its attribute block when
    ``flag`` says so: ``Message(topic, partition, -1, -1, flag, payload)`` decodes it);
    ``error`` is why.
    """

    topic: str
    partition: Partition | None
    payload: bytes
    flag: int
    error: Exception


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
    def properties(self) -> Properties:
        """Tag, key, headers (and producer id/sequence) from the attribute block; an
        attribute whose properties do not parse is returned whole as the tag."""
        text = split_payload(self.payload, self.flag)[0]
        try:
            return decode_attribute(text, self.flag)
        except ValueError:
            return Properties(text)

    @property
    def attribute(self) -> str | None:
        """The message attribute (MetaQ's string tag), or None."""
        if self.flag & FLAG_PROPERTIES:
            return self.properties.attribute
        return split_payload(self.payload, self.flag)[0]

    @property
    def key(self) -> str | bytes | None:
        """The key the message was sent with (as given: str or bytes), or None."""
        return self.properties.key if self.flag & FLAG_PROPERTIES else None

    @property
    def headers(self) -> dict[str, HeaderValue]:
        """The typed headers the message was sent with ({} when none)."""
        return dict(self.properties.headers) if self.flag & FLAG_PROPERTIES else {}

    @property
    def timestamp(self) -> float:
        """When the broker stored the message (Unix seconds, from the message id, ms
        precision; the master's clock for replicated and delayed messages)."""
        return split_id(self.msg_id)[0] / 1000

    @property
    def datetime(self) -> datetime:
        """:attr:`timestamp` as an aware UTC datetime."""
        return datetime.fromtimestamp(self.timestamp, UTC)

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
