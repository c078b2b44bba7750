"""Joint visibility of one transaction's shares across partitions (a *gate*).

A committed transaction's messages are appended *covered* (:meth:`Partition.append_covered`):
the redo log holds them durably, so in a group-commit partition they need no fsync of their
own and may be shown as soon as everything before them is shown. Shown one partition at a
time, though, a transaction would appear in a partition with nothing pending before another
whose share sits behind a plain put still waiting for its group-commit round. A gate makes
the shares appear together:

* every share is placed at once (one synchronous step), each *gated* in its partition: that
  partition shows nothing from the share's start on while the gate is closed;
* a share is *ready* when its partition shows everything before it;
* when every share is ready the gate opens: all shares (and whatever the partitions hold
  after them that is itself showable) become visible in one step, before any reader or
  visibility hook runs.

In a partition without group commit an append is visible at once, so a gated share there
would hold back the plain puts that follow it. Such a share is *deferred* instead: it is
appended only when the placed shares are all ready, in the step that opens the gate (behind
whatever the partition took meanwhile; if that includes puts held for a synchronous slave,
the gate then waits for their confirmation too).

No gate waits, even indirectly, on itself: within a partition gates open in placement order
(a later share is ready only once the earlier one is visible); shares placed at once, in
group-commit partitions, are placed in commit order, a transaction in one step; and a
deferred share is appended only once its gate's other shares are ready, so everything a gate
waits for in a partition without group commit was placed before its deferred share, by a gate
that had got that far earlier.

Opening runs iteratively (a worklist): the partitions of an opened gate may now reach the
next gate's share, and so on, without recursion.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from notify.errors import NotifyError

log = logging.getLogger("notify.store")


class Partition(Protocol):
    """What a gate needs of a partition (:class:`notify.store.partition.Partition`)."""

    topic: str
    index: int
    visible_end: int
    closed: bool

    @property
    def on_visible(self) -> Callable[[Any], None] | None: ...

    def refresh_visible(self) -> bool: ...

    def head_gate(self) -> Gate | None: ...

    def head_gate_start(self) -> int: ...

    def gate_opened(self, gate: Gate) -> None: ...

    def append_covered(
        self, data: bytes | bytearray | memoryview, gate: Gate | None = None
    ) -> int: ...

    def rollback_to(self, offset: int) -> None: ...


@dataclass(slots=True)
class Deferred:
    """A share appended when its gate opens (a partition without group commit)."""

    part: Partition
    data: bytes | bytearray | memoryview
    count: int


class Gate:
    """The joint visibility of one transaction's shares (see the module doc)."""

    __slots__ = (
        "deferred",
        "error",
        "is_open",
        "label",
        "on_open",
        "on_placed",
        "placed",
        "placed_hook",
    )

    def __init__(
        self,
        label: str,
        placed: Callable[[Any, int, bytes | bytearray | memoryview, int], None],
    ) -> None:
        self.label = label
        #: ``(partition, start, end)`` of every share placed so far
        self.placed: list[tuple[Partition, int, int]] = []
        self.deferred: list[Deferred] = []
        self.is_open = False
        #: why the last attempt to append a deferred share failed (retried)
        self.error: str | None = None
        #: told of each deferred share appended: (partition, start, data, count)
        self.placed_hook = placed
        #: called once every share is placed (only when some were deferred), with the
        #: ``(partition, start, end)`` of the shares placed when the gate opened
        self.on_placed: Callable[[list[tuple[Partition, int, int]]], None] | None = None
        #: called when the shares become visible (before any partition's visibility hook)
        self.on_open: Callable[[], None] | None = None

    def __repr__(self) -> str:
        state = "open" if self.is_open else "closed"
        n, d = len(self.placed), len(self.deferred)
        return f"<Gate {self.label} {state} placed={n} deferred={d}>"

    # ------------------------------------------------------------------ readiness

    def _ready(self) -> bool:
        return all(p.visible_end >= start for p, start, _end in self.placed)

    def _place_deferred(self) -> bool:
        """Append the deferred shares (all or none); False when a partition refused."""
        done: list[tuple[Partition, int, int]] = []
        for d in self.deferred:
            if d.part.closed:  # the broker is stopping: recovery places it at the restart
                return self._undo(done)
            try:
                start = d.part.append_covered(d.data, gate=self)
            except (NotifyError, OSError) as e:
                self._undo(done)
                if self.error is None:
                    log.error(
                        "%s: appending its share to %s-%d failed (%s): none of it is visible "
                        "yet; retrying",
                        self.label,
                        d.part.topic,
                        d.part.index,
                        e,
                    )
                self.error = str(e)
                return False
            done.append((d.part, start, start + len(d.data)))
        self.error = None
        for d, (p, start, _end) in zip(self.deferred, done, strict=True):
            self.placed_hook(p, start, d.data, d.count)
        self.deferred = []
        self.placed.extend(done)
        if self.on_placed is not None:
            self.on_placed(done)
        return True

    def _undo(self, done: list[tuple[Partition, int, int]]) -> bool:
        """Take back the deferred shares appended in this attempt (gated: nobody saw them);
        False, for the caller to return."""
        for p, s, _e in reversed(done):
            try:
                p.rollback_to(s)
            except (NotifyError, OSError) as e:  # pragma: no cover - disk trouble
                log.error("%s: taking back a deferred share failed: %s", self.label, e)
        return False

    @property
    def stalled(self) -> bool:
        """A deferred share could not be appended: :func:`retry` tries again."""
        return self.error is not None and not self.is_open


def settle(parts: Iterable[Partition]) -> None:
    """Bring ``parts`` up to date after a change (an fsync, a confirmation, an append, an
    opened gate): recompute what each shows, open every gate whose shares are all ready
    (iteratively), then call the opened gates' ``on_open`` and the visibility hooks of the
    partitions that now show more, in that order."""
    work: deque[Partition] = deque(parts)
    advanced: dict[Partition, None] = {}
    opened: list[Gate] = []
    while work:
        p = work.popleft()
        if p.refresh_visible():
            advanced[p] = None
        g = p.head_gate()
        if g is None or g.is_open or p.visible_end < p.head_gate_start():
            continue
        if not g._ready():
            continue
        if g.deferred and (not g._place_deferred() or not g._ready()):
            continue
        g.is_open = True
        opened.append(g)
        for q, _start, _end in g.placed:
            q.gate_opened(g)
            work.append(q)
    for g in opened:
        if g.on_open is not None:
            g.on_open()
    for p in advanced:
        if p.on_visible is not None:
            p.on_visible(p)


def retry(gate: Gate) -> None:
    """Try a stalled gate's deferred shares again (see :attr:`Gate.stalled`)."""
    if not gate.is_open and gate.placed:
        settle([gate.placed[0][0]])
