"""The client's value objects that its core produces: a global partition and a send's result.

Pure data, no I/O; :mod:`notify.client` re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True, slots=True, order=True)
class Partition:
    """A global partition: broker ``broker_id`` at ``address``, broker-local ``partition``."""

    broker_id: int
    partition: int
    address: str = field(compare=False)

    def __str__(self) -> str:
        return f"{self.broker_id}-{self.partition}"

    @classmethod
    def parse(cls, text: str, address: str) -> Partition:
        """Inverse of ``str()``: ``"<brokerId>-<part>"``."""
        b, sep, p = text.partition("-")
        if not sep:
            raise ValueError(f"not a partition id: {text!r}")
        return cls(int(b), int(p), address)


class SendResult(NamedTuple):
    """Outcome of one send (MetaQ's SendResult).

    ``success`` False carries the ``error`` (a :class:`~notify.errors.ClientError`) and
    leaves ``offset``/``msg_id`` at -1. A message written to the ordered producer's local
    spool (its partition was unavailable) is ``success`` with ``spooled`` True and offset -1:
    it will be delivered when the partition comes back. A send of a transaction has offset
    -1 (the message gets its offset when the transaction commits).

    Immutable; a named tuple (one per message: about 5x cheaper to build than a frozen
    dataclass, the largest per-message cost of ``send_nowait`` before).
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
