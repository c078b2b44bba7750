"""Redo-log replication: the master's transaction state on its slaves.

The master's redo log (:class:`txlog.TxLog`, ``<dataLogPath>/transactions``) is shipped to
its slaves *at the same positions* (segment number and offset), so a slave's log is the
master's, byte for byte, up to where it has caught up. Two ways, as for partitions:

* the synchronous master pushes every write of its log (``msync __txlog <fileNo> <len> 0
  <offset>``, on the same pipelined link as the partitions' batches, so a COMMIT reaches the
  slave before the messages it applies) and, at a redo-log force, waits for the slave's
  answer, which comes after the slave forced the frames to its own disk;
* every slave pulls what it is missing (``get __txlog <group> <fileNo> <offset> <maxSize>``;
  301 = continue at the start of segment ``fileNo + 1``).

The names ``__txlog`` are reserved internal "topics" (``__`` prefix): served to, and
accepted from, replica links only.

A slave runs no transaction engine: it only appends. :class:`ReplicaRedo` follows the
records to know which transactions are still live (not rolled back or forgotten, or applied
with messages not yet on disk in the slave's own partitions) and checkpoints its log like the
master would, so the log stays bounded and recovery after ``promote`` scans only what it
needs. ``promote`` then runs the broker's ordinary transaction recovery on this log: prepared
XA branches and half messages come back, committed-but-unapplied transactions are applied
(idempotently: message ids already replicated are skipped), open ones are rolled back.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from notify.errors import TxLogError
from notify.protocol import logrecords as lr
from notify.store.partition import Partition
from notify.txlog import Position, TxLog
from notify.txlog.records import decode

#: The internal stream name of the transactions' redo log.
TXLOG_STREAM = "__txlog"
#: The internal stream name of the delay queue's log (notify.broker.delay), same mechanism.
DELAYLOG_STREAM = "__delaylog"
#: The internal stream name of the queue-subscription log (notify.broker.queues).
QUEUELOG_STREAM = "__queuelog"
#: Every replicated log stream.
LOG_STREAMS = (TXLOG_STREAM, DELAYLOG_STREAM, QUEUELOG_STREAM)


class RedoBehindError(TxLogError):
    """The frames start after this replica's end: it must pull what is missing first."""

    retriable = True


class _Partitions(Protocol):
    def get(self, topic: str, partition: int) -> Partition | None: ...


@dataclass
class _Live:
    first: Position
    placements: tuple[tuple[str, int, int, int, int], ...] | None = None


class ReplicaRedo:
    """A slave's copy of its master's redo log: appends at the master's positions and
    tracks live transactions for checkpoints."""

    def __init__(self, log: TxLog, store: _Partitions):
        self.log = log
        self.store = store
        self.live: dict[str, _Live] = {}
        for pos, rtype, body in log.replay():
            self._track(pos, rtype, body)

    @property
    def end(self) -> Position:
        """Where the next frames of the master must start."""
        return self.log.end_position

    def append(self, at: Position, data: bytes) -> Position:
        """Append the master's frames written at ``at`` (not forced). Frames already here
        (a push and a pull crossing) are accepted when identical. Raises TxLogError when
        they do not continue this log."""
        end = self.log.end_position
        if not data:  # the master closed segment at.file_no at at.offset
            if at == end:
                self.log.append_frames(Position(at.file_no + 1, 0), b"")
            elif at.file_no >= end.file_no:
                raise RedoBehindError(f"at {end}, the master rolled at {at}")
            return self.log.end_position
        if at > end:
            raise RedoBehindError(f"at {end}, the master's frames start at {at}")
        if at < end and at.file_no == end.file_no and at.offset + len(data) <= end.offset:
            have, _next = self.log.read_frames(at, len(data))
            if have == data:
                return end
            raise TxLogError(f"redo log diverges from the master's at {at}")
        self.log.append_frames(at, data)
        # follow the records for checkpoints (positions as on the master)
        target = self.log.end_position
        base = target.offset - len(data)
        result = decode(data)
        for rec in result.records:
            self._track(Position(target.file_no, base + rec.offset), rec.type, rec.body)
        return target

    def skip_to(self, file_no: int) -> None:
        """Continue at the start of segment ``file_no`` (the master has nothing more before
        it: it closed or already deleted the segments in between)."""
        if file_no > self.log.end_position.file_no:
            self.log.append_frames(Position(file_no, 0), b"")

    def _track(self, pos: Position, rtype: int, body: bytes) -> None:
        try:
            key = lr.key_of(body)
        except (ValueError, IndexError, struct.error):  # not a transaction record
            return
        if rtype in (lr.ROLLBACK, lr.FORGET):
            self.live.pop(key, None)
            return
        ent = self.live.get(key)
        if ent is None:
            ent = self.live[key] = _Live(pos)
        if rtype == lr.APPLIED:
            ent.placements = lr.Applied.decode(body).placements

    def checkpoint_position(self) -> Position:
        """The oldest record recovery may still need: of a transaction not finished, or
        applied with messages not yet durable in this broker's partitions."""
        done = [k for k, e in self.live.items() if e.placements is not None and self._durable(e)]
        for k in done:
            del self.live[k]
        return min((e.first for e in self.live.values()), default=self.log.end_position)

    def _durable(self, ent: _Live) -> bool:
        assert ent.placements is not None
        for topic, pidx, off, _n, nbytes in ent.placements:
            part = self.store.get(topic, pidx)
            if part is not None and not part.memory and part.flushed_end < off + nbytes:
                return False
        return True

    def checkpoint_plan(self) -> tuple[Position, bytes] | None:
        """``(position, state)`` of the next checkpoint of this copy (None: not yet)."""
        return self.checkpoint_position(), b""

    def checkpointed(self) -> None:
        """Called after a checkpoint of :meth:`checkpoint_plan` was written."""

    def checkpoint(self) -> None:
        """Checkpoint the replica log (fsyncs it; old segments go)."""
        self.log.checkpoint(self.checkpoint_position())
