"""One mechanism for "intent -> idempotent apply -> done", shared by transaction commits and
delayed-message moves.

The caller first makes an *intent* durable in its own log (a transaction's COMMIT record, a
delay MOVE record) holding the messages (ids already assigned) and, per target partition, the
partition's end when the intent was written (the *hint*). Then :meth:`Applier.apply` appends
each partition's share with one write, all or nothing across partitions, and the caller logs
*done* (APPLIED, MOVED) without forcing it. After a crash the caller runs the same
:meth:`Applier.apply` with ``verify=True``: records already present (matched by message id
from the hint on) are skipped, so each message lands exactly once.

Because the intent log holds the bytes durably, applied shares are appended *covered*
(:meth:`~notify.store.partition.Partition.append_covered`): readers may see them as soon as
everything before them in the partition is visible, without waiting for the partition's own
fsync. Until that fsync, the intent must stay in its log: :meth:`Applier.durable` tells when
placements are on disk in their partitions, so the caller's checkpoints never drop an intent
whose messages a crash could still take from the partition.

A transaction's shares must appear together (a consumer never sees part of it), so commits
use :meth:`Applier.apply_joint`: the shares go under one :class:`~notify.store.gate.Gate`
and are shown in one step once every partition shows what was pending before its share
(no fsync is added: the group-commit round that covers what is pending is one the plain
puts before it need anyway). Delayed-message moves are independent messages and use
:meth:`Applier.apply` (each share shown as soon as its partition allows).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from notify.core.effects import Placement
from notify.errors import NotifyError, StoreError
from notify.protocol import records
from notify.store.gate import Deferred, Gate, retry
from notify.store.idempotent import already_present
from notify.store.memory import MemoryPartition
from notify.store.partition import Partition


class PartitionLookup(Protocol):
    """The store as the core sees it."""

    def get(self, topic: str, partition: int) -> Partition | None: ...


@dataclass(slots=True)
class Share:
    """One partition's part of an intent: whole records in the partition layout."""

    topic: str
    partition: int
    data: bytes
    count: int


def group_shares(batches: Iterable[tuple[str, int, bytes, int]]) -> list[Share]:
    """Join ``(topic, partition, records, count)`` batches per partition, keeping the order in
    which partitions first appear and the order of records within each."""
    chunks: dict[tuple[str, int], list[bytes]] = {}
    counts: dict[tuple[str, int], int] = {}
    for topic, part, data, count in batches:
        k = (topic, part)
        lst = chunks.get(k)
        if lst is None:
            lst = chunks[k] = []
            counts[k] = 0
        lst.append(data)
        counts[k] += count
    return [Share(t, p, b"".join(c), counts[(t, p)]) for (t, p), c in chunks.items()]


def no_crashpoint(_name: str) -> None:
    """The default crash hook: nothing happens."""


@dataclass(slots=True)
class Joint:
    """What :meth:`Applier.apply_joint` did: where the shares placed so far went, and the
    gate they wait behind (None: every share is visible already). Shares deferred to the
    gate's opening are reported by its ``on_placed`` hook."""

    placements: list[Placement]
    gate: Gate | None


class Applier:
    """Appends shares exactly once and tracks when they are durable in their partitions."""

    def __init__(
        self,
        store: PartitionLookup,
        after_append: Callable[[Partition, int], None],
        crashpoint: Callable[[str], None] = no_crashpoint,
    ) -> None:
        self.store = store
        self.after_append = after_append
        self.crashpoint = crashpoint
        #: told of every share appended, at its offset (a synchronous master pushes it to its
        #: slave, in append order like any batch, so the slave's partition keeps in step)
        self.on_covered: Callable[[Partition, int, bytes | bytearray | memoryview, int], None] | (
            None
        ) = None

    def placed(
        self, part: Partition, start: int, data: bytes | bytearray | memoryview, count: int
    ) -> None:
        """A share of ``count`` records was appended at ``start``: ask for its flush and tell
        :attr:`on_covered`."""
        self.after_append(part, count)
        if self.on_covered is not None:
            self.on_covered(part, start, data, count)

    def apply(
        self,
        shares: Sequence[Share],
        hints: Mapping[tuple[str, int], int],
        *,
        verify: bool,
        what: str,
        on_missing: Callable[[Share], None] | None = None,
        between: str = "mid_apply",
        exact: bool = False,
    ) -> list[Placement]:
        """Append every share (``verify``: only what is not already there, matched by message
        id from the hint on). All or nothing: when one partition refuses, the shares appended
        in this call are taken back and StoreError is raised. A share whose partition no
        longer exists is reported to ``on_missing`` and skipped. ``between`` names the crash
        point reached between two partitions' appends. ``exact``: the hints are where the
        shares went (a done record's placements), so a share that ends at or before its
        partition's first offset was applied and its segment deleted since (retention, or
        ``__delay`` past its watermark): it counts as present, never appended again."""
        return self._apply_parts(
            self._resolve(shares, on_missing), hints, verify, what, between, exact
        )

    def _apply_parts(
        self,
        parts: list[tuple[Share, Partition]],
        hints: Mapping[tuple[str, int], int],
        verify: bool,
        what: str,
        between: str = "mid_apply",
        exact: bool = False,
    ) -> list[Placement]:
        """:meth:`apply` of shares whose partitions were looked up."""
        placements: list[Placement] = []
        done: list[tuple[Partition, int]] = []
        appended: list[tuple[Partition, int, bytes, int]] = []
        first = True
        for sh, part in parts:
            data = sh.data
            start = -1
            if verify:
                hint = hints.get((sh.topic, sh.partition), 0)
                if exact and (sh.topic, sh.partition) in hints and hint + len(data) <= (
                    part.min_offset
                ):
                    placements.append(Placement(sh.topic, sh.partition, hint, sh.count, len(data)))
                    continue
                present, at = already_present(part, hint, data)
                if present:
                    start = at
                if present == len(data):
                    placements.append(Placement(sh.topic, sh.partition, at, sh.count, len(data)))
                    continue
                data = data[present:]
            if not first:
                self.crashpoint(between)
            first = False
            off = self._append(sh, part, data, None, done, what)
            count = sh.count if start < 0 else len(records.decode_all(data, verify=False)[0])
            appended.append((part, off, data, count))
            placements.append(
                Placement(
                    sh.topic, sh.partition, off if start < 0 else start, sh.count, len(sh.data)
                )
            )
        for part, off, data, count in appended:
            self.placed(part, off, data, count)
        return placements

    def apply_joint(
        self, shares: Sequence[Share], hints: Mapping[tuple[str, int], int], *, verify: bool,
        what: str, on_missing: Callable[[Share], None] | None = None,
    ) -> Joint:  # fmt: skip
        """Append a transaction's shares so that readers see all of them or none (see the
        module doc). When every partition already shows all it holds, the shares are
        appended and visible at once (no gate). Otherwise they go behind one gate: a share of
        a group-commit partition is appended now; a share of a partition without group commit
        is appended when the others are all showable (so the plain puts that partition takes
        meanwhile are not held back). All or nothing as :meth:`apply` (StoreError).

        Why never now in a partition without group commit, even one with puts pending (held
        for a synchronous slave): gates in a group-commit partition open in the order the
        transactions were applied, and a deferred share is appended only once its gate's
        other shares are all showable, so whatever a gate waits for was placed before it.
        A share placed now behind a pending put there could precede the deferred share of a
        transaction applied earlier, which in turn precedes it in a group-commit partition:
        each would wait for the other."""
        if not verify and len(shares) == 1:  # the usual commit: one share, nothing to verify
            sh = shares[0]
            part = self.store.get(sh.topic, sh.partition)
            if part is not None and part.settled:  # shown at once: no gate
                off = self._append(sh, part, sh.data, None, [], what)
                self.placed(part, off, sh.data, sh.count)
                return Joint([Placement(sh.topic, sh.partition, off, sh.count, len(sh.data))], None)
        parts = self._resolve(shares, on_missing)
        for _sh, part in parts:
            if not part.settled:
                break
        else:
            if not verify:
                return Joint(self._append_all(parts, what), None)
            return Joint(self._apply_parts(parts, hints, verify, what), None)
        gate = Gate(what, self.placed)
        now: list[tuple[Share, Partition, bytes]] = []
        placements: list[Placement] = []
        for sh, part in parts:
            data = sh.data
            if verify:
                present, at = already_present(part, hints.get((sh.topic, sh.partition), 0), data)
                if present == len(data):
                    placements.append(Placement(sh.topic, sh.partition, at, sh.count, len(data)))
                    continue
                if present:  # a failed apply not taken back whole: complete it as it lies
                    return Joint(self.apply(shares, hints, verify=True, what=what), None)
            if not part.group_commit:
                self._check_room(part, len(data), what)
                gate.deferred.append(Deferred(part, data, sh.count))
            else:
                now.append((sh, part, data))
        done: list[tuple[Partition, int]] = []
        for i, (sh, part, data) in enumerate(now):
            if i:
                self.crashpoint("mid_apply")
            off = self._append(sh, part, data, gate, done, what)
            gate.placed.append((part, off, off + len(data)))
            placements.append(Placement(sh.topic, sh.partition, off, sh.count, len(data)))
        for (sh, part, data), (_p, off) in zip(now, done, strict=True):
            self.placed(part, off, data, sh.count)
        if not gate.placed:  # nothing to wait for after all (every share already present)
            if gate.deferred:
                raise StoreError(f"{what}: nothing to place before its deferred shares")
            return Joint(placements, None)
        return Joint(placements, gate)

    def _append_all(self, parts: list[tuple[Share, Partition]], what: str) -> list[Placement]:
        """Append every share as it is (nothing to verify), all or nothing; placements."""
        placements: list[Placement] = []
        done: list[tuple[Partition, int]] = []
        for sh, part in parts:
            if done:
                self.crashpoint("mid_apply")
            off = self._append(sh, part, sh.data, None, done, what)
            placements.append(Placement(sh.topic, sh.partition, off, sh.count, len(sh.data)))
        for (sh, part), pl in zip(parts, placements, strict=True):
            self.placed(part, pl.offset, sh.data, sh.count)
        return placements

    def _resolve(
        self, shares: Sequence[Share], on_missing: Callable[[Share], None] | None
    ) -> list[tuple[Share, Partition]]:
        """Each share with its partition; one whose partition is gone goes to ``on_missing``."""
        out = []
        for sh in shares:
            part = self.store.get(sh.topic, sh.partition)
            if part is not None:
                out.append((sh, part))
            elif on_missing is not None:
                on_missing(sh)
        return out

    @staticmethod
    def _append(
        sh: Share,
        part: Partition,
        data: bytes,
        gate: Gate | None,
        done: list[tuple[Partition, int]],
        what: str,
    ) -> int:
        """Append one share covered (behind ``gate``); its offset. When the partition refuses,
        the shares appended before in this call (``done``: partition, offset) are taken back
        and StoreError is raised (the caller retries the whole apply with ``verify``)."""
        try:
            off = part.append_covered(data, gate=gate)
        except NotifyError as e:
            for p, before in reversed(done):
                with contextlib.suppress(NotifyError, OSError):
                    p.rollback_to(before)
            raise StoreError(f"{what}: appending to {sh.topic}-{sh.partition} failed: {e}") from e
        done.append((part, off))
        return off

    @staticmethod
    def _check_room(part: Partition, nbytes: int, what: str) -> None:
        """Refuse now what the partition would refuse when the gate opens (a read-only
        partition, a full memory topic that refuses), so nothing waits on a share that
        cannot be placed."""
        if part.failed:
            raise StoreError(f"{what}: {part.topic}-{part.index}: {part.failed}")
        if isinstance(part, MemoryPartition) and not part.drop_oldest and (
            part.size_bytes + nbytes > part.max_bytes
        ):
            raise StoreError(
                f"{what}: memory topic {part.topic} is full ({part.size_bytes} of "
                f"{part.max_bytes} bytes) and memoryFullPolicy=refuse"
            )

    @staticmethod
    def retry_stalled(gates: Iterable[Gate]) -> None:
        """Try again the deferred shares a partition refused when their gate was ready."""
        for g in gates:
            if g.stalled:
                retry(g)

    def durable(self, placements: Iterable[Placement]) -> bool:
        """Whether every placement is on disk in its partition (or its partition is gone, or
        lives in memory and is lost on restart by design)."""
        for pl in placements:
            part = self.store.get(pl.topic, pl.partition)
            if part is None or part.memory:
                continue
            if part.flushed_end < pl.end:
                return False
        return True

    def visible(self, placements: Iterable[Placement]) -> list[tuple[Partition, int]]:
        """The ``(partition, end)`` pairs readers cannot see yet."""
        out: list[tuple[Partition, int]] = []
        for pl in placements:
            part = self.store.get(pl.topic, pl.partition)
            if part is not None and part.visible_end < pl.end:
                out.append((part, pl.end))
        return out
