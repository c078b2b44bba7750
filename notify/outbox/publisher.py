"""How the relay reaches the broker: the narrow :class:`Publisher` Protocol.

The outbox never imports the client. A publisher sends batches of prepared records, each to
one topic partition, under a stable, named idempotent-producer identity with explicit
sequence numbers, and answers with one acknowledgement per batch. The client implements it
(``session.publisher()``, :mod:`notify.client._publisher`); a test can implement it too.

The contract the relay's exactly-once rests on:

* ``publish(identity, batches)`` sends each :class:`Batch` to its partition (the identity
  claimed on the way) and returns once every one is answered (in the batches' order).
  A batch's records are stored with sequences ``first_seq, first_seq + 1, ...`` for
  ``identity`` in that partition, in that order, all or nothing. Sent again with the same
  identity, partition and sequences (the relay does after a crash, a lost
  acknowledgement or a broker restart) it is not stored twice: the broker answers with
  the acknowledgement of what it stored.
* at most one batch per (identity, partition) is in flight: one call holds at most one
  batch per partition, and the relay sends the next only after the answer.
* ``claim(identity, topics)`` makes this process the identity's publisher at its epoch:
  the brokers refuse later batches of an older epoch (a :class:`PublishError` with
  ``fenced``). It answers the last sequence the brokers of ``topics`` stored per (topic,
  partition) for the identity (the new leader checks them against its records), or None
  when they cannot tell. A connection opened later is claimed before its first batch.

Records are ``(flag, payload)`` pairs exactly as the outbox stores them
(:mod:`notify.outbox.rows`); the publisher adds the identity and sequence numbers in
whatever form the broker expects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .rows import OutboxError

__all__ = ["Batch", "Identity", "PublishAck", "PublishError", "Publisher"]


@dataclass(frozen=True, slots=True)
class Identity:
    """A relay shard's named idempotent-producer identity: ``name`` and ``secret`` (kept
    in ``notify_outbox_relay``) make the producer id ``<name>~<tag>``
    (:mod:`notify.protocol.identity`); ``epoch`` is the shard's leadership epoch, so the
    newest leader holds the identity and the broker fences the older ones."""

    name: str
    secret: str
    epoch: int

    def __repr__(self) -> str:  # never the secret
        return f"Identity({self.name!r}, epoch={self.epoch})"


@dataclass(frozen=True, slots=True)
class Batch:
    """Records for one partition: ``(flag, payload)`` pairs as the outbox stores them,
    to be stored with sequences from ``first_seq``."""

    topic: str
    partition: str
    records: Sequence[tuple[int, bytes]]
    first_seq: int


@dataclass(frozen=True, slots=True)
class PublishAck:
    """The broker stored a batch: the first record's message id and byte offset, and how
    many records the acknowledgement covers."""

    first_msg_id: int
    first_offset: int
    count: int


class PublishError(OutboxError):
    """A batch was not (known to be) stored.

    ``retriable``: sending the same batch again may succeed (connection lost, timeout,
    broker busy or down). ``fenced``: another process claimed the identity (stop
    publishing under it). Otherwise the broker refused the batch itself (``code``: the
    broker's reply code, e.g. 400 a record it does not take, 403 a topic closed to
    publishing, 404 an unknown topic or partition)."""

    def __init__(
        self, message: str, *, code: int = 0, retriable: bool = False, fenced: bool = False
    ):
        super().__init__(message)
        self.code = code
        self.retriable = retriable
        self.fenced = fenced


@runtime_checkable
class Publisher(Protocol):
    """Publishes the relay's batches (see the module doc for the contract)."""

    def partitions(self, topic: str) -> Sequence[str]:
        """The topic's partitions as ``"<brokerId>-<partition>"``, in the order the
        client's by-key selector indexes them. Raises :class:`PublishError` (code 404)
        when the broker does not know the topic, a retriable one when it cannot tell."""
        ...

    def claim(
        self, identity: Identity, topics: Sequence[str]
    ) -> Mapping[tuple[str, str], int] | None:
        """Claim ``identity`` (fencing older epochs) on the brokers of ``topics``; the last
        stored sequence per (topic, partition), or None when they cannot tell."""
        ...

    def publish(
        self, identity: Identity, batches: Sequence[Batch]
    ) -> list[PublishAck | PublishError]:
        """Send ``batches`` (at most one per partition) under ``identity``; for each, its
        acknowledgement or the :class:`PublishError` saying why it is not (known to be)
        stored. Blocks until every batch is answered or timed out."""
        ...

    def close(self) -> None:
        """Release what the publisher holds (not the session it came from)."""
        ...
