"""Consistent cuts: what a slave shows its readers.

A slave pulls each partition on its own, so left alone it would show a transaction's share in
one partition before another puller brought its share in the next. A master shows a committed
transaction in all its partitions at once (:mod:`notify.store.gate`), so the visible ends of
all its partitions *at one instant* form a *consistent cut*: every transaction is wholly
before it or wholly after it. A slave shows its readers only such cuts:

* it asks its master for cuts on a replica link: ``get __cut <group> 0 0 <maxSize> <opaque>
  <maxWaitMs>`` (a long poll). The master answers with the visible end of every partition
  (memory and internal ``__`` topics aside) that changed since its last answer on this
  connection (all of them first), ``<topic> <partition> <end>`` per line, taken in one step
  of its event loop after whatever made them visible (so never half-way through a
  transaction's appearance); an empty body when the wait ends with nothing new;
* a slave applies a cut once every one of its partitions the cut names holds the cut's
  bytes (flushed, under group commit): it caps each partition's visible end at the cut's
  value, all in one step (:meth:`CutFollower.try_apply`), and keeps later cuts queued;
* a slave remembers the last cut it applied (``<dataPath>/replica-cut``, rewritten at most
  once a second) and starts from it after a restart (a partition the remembered cut does not
  name starts with nothing shown). Promotion lifts every cap (the slave shows what it holds,
  then recovery re-applies committed transactions in the same step) and forgets the
  remembered cut. Without a remembered cut, a partition that holds nothing starts with
  nothing shown (a new slave), one that holds data (a slave promoted once, or started by an
  older version) shows all it holds until its master's first cut.

A master that does not know ``__cut`` (an older version) answers 404, and one that refuses the
replica handshake (MetaQ's, whose ``sync`` pushes a notify slave takes): the slave then shows
what it holds as it arrives (no cut) and asks again every 30 s.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from notify.fs import OS_FS, FileSystem, write_file_atomically
from notify.store.gate import settle
from notify.store.manager import encode_checked, read_checked
from notify.store.partition import Partition

log = logging.getLogger("notify.replication")

#: The internal stream name of consistent cuts (served to replica links only).
CUT_STREAM: Final = "__cut"
CUT_FILE: Final = "replica-cut"
_MAGIC: Final = "notify-replica-cut 1"
#: cuts queued beyond this are merged (a later cut contains every earlier one)
MAX_PENDING: Final = 256

Key = tuple[str, int]


def cut_member(part: Partition) -> bool:
    """Whether a partition takes part in cuts (not in memory, not an internal topic)."""
    return not part.memory and not part.topic.startswith("__")


def encode_cut(entries: Iterable[tuple[str, int, int]]) -> bytes:
    """The body of a cut: ``<topic> <partition> <end>`` per line."""
    return "".join(f"{t} {p} {e}\n" for t, p, e in entries).encode()


def parse_cut(body: bytes) -> dict[Key, int]:
    """A cut's entries (ValueError on a malformed line)."""
    out: dict[Key, int] = {}
    for line in body.decode("utf-8").splitlines():
        if not line:
            continue
        t, p, e = line.split(" ")
        out[(t, int(p))] = int(e)
    return out


def set_cuts(caps: Iterable[tuple[Partition, int | None]]) -> None:
    """Cap several partitions at once (None lifts a cap), then show what that allows, with
    every visibility hook run after all of them changed (one step for readers)."""
    parts = []
    for part, cut in caps:
        part.cut = cut
        part.set_limit()
        if cut is not None and part.visible_end > cut:
            part.visible_end = max(cut, part.min_offset)
        parts.append(part)
    settle(parts)


class CutFollower:
    """A slave's queue of its master's cuts, applied as its partitions reach them."""

    def __init__(self, partitions: dict[Key, Partition]) -> None:
        #: the store's partitions by key (read each time: topics may be added)
        self.partitions = partitions
        self.pending: deque[dict[Key, int]] = deque()
        self.applied = 0
        self.received = 0
        #: the last cut applied, every partition's value (what ``replica-cut`` keeps)
        self.current: dict[Key, int] = {}
        #: whether readers see cuts only (a cut was remembered or applied)
        self.capping = False
        self._saved: dict[Key, int] = {}

    def received_cut(self, delta: dict[Key, int]) -> None:
        """A cut from the master (the partitions that changed since its previous one)."""
        if not delta:
            return
        self.received += 1
        self.pending.append(delta)
        if len(self.pending) > MAX_PENDING:  # keep the newest: merge the last two
            last = self.pending.pop()
            self.pending[-1].update(last)
        self.try_apply()

    def _ready(self, delta: dict[Key, int]) -> bool:
        parts = self.partitions
        for key, end in delta.items():
            p = parts.get(key)
            if p is None or not cut_member(p):
                continue  # not replicated here: nobody reads it on this slave
            if (p.flushed_end if p.group_commit else p.end) < end:
                return False
        return True

    def try_apply(self) -> int:
        """Apply every queued cut this slave's partitions have reached (the newest of them
        once, in one step); the number applied."""
        n = 0
        merged: dict[Key, int] = {}
        pending = self.pending
        while pending and self._ready(pending[0]):
            merged.update(pending.popleft())
            n += 1
        if not n:
            return 0
        self.applied += n
        self.capping = True
        self.current.update(merged)
        parts = self.partitions
        set_cuts(
            (p, end)
            for key, end in merged.items()
            if (p := parts.get(key)) is not None and cut_member(p)
        )
        return n

    def reset(self) -> None:
        """A new link: what was queued from the old one is dropped (its next answer is a
        whole cut)."""
        self.pending.clear()

    def to_save(self) -> dict[Key, int] | None:
        """A copy of the cut applied last when it changed since the last call (written by
        :func:`save_cut` off the loop), else None."""
        if self.current == self._saved:
            return None
        self._saved = dict(self.current)
        return self._saved


def save_cut(data_path: Path, cut: dict[Key, int], fs: FileSystem = OS_FS) -> None:
    """Remember the cut a slave applied last (atomic replace)."""
    lines = [f"{t} {p} {e}" for (t, p), e in sorted(cut.items())]
    write_file_atomically(fs, data_path / CUT_FILE, encode_checked(_MAGIC, lines))


def load_cut(data_path: Path, fs: FileSystem = OS_FS) -> dict[Key, int]:
    """The cut a slave applied last (empty when none, or the file is damaged)."""
    instead = "showing nothing until the first cut"
    lines = read_checked(fs, data_path / CUT_FILE, _MAGIC, instead)
    try:
        return parse_cut("\n".join(lines).encode()) if lines is not None else {}
    except ValueError:
        log.warning("%s is damaged: %s", data_path / CUT_FILE, instead)
        return {}


def forget_cut(data_path: Path, fs: FileSystem = OS_FS) -> None:
    """A promoted slave shows all it holds: its remembered cut must not cap it again if it
    ever follows a master once more."""
    try:
        fs.unlink(data_path / CUT_FILE)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("cannot remove %s: %s", data_path / CUT_FILE, e)


def start_caps(partitions: Iterable[Partition], remembered: dict[Key, int]) -> bool:
    """A slave starting: cap every member partition at the remembered cut (nothing shown
    where it names none). Without one, an empty partition shows nothing until the master's
    first cut (it has nothing to hide yet: a new slave is consistent from its first byte),
    and one that holds data (a slave promoted once, or started by an older version) shows
    all it holds until then. Whether any partition was capped."""
    caps = [
        (p, remembered.get((p.topic, p.index), p.min_offset))
        for p in partitions
        if cut_member(p) and (remembered or p.end == p.min_offset)
    ]
    set_cuts(caps)
    return bool(caps)
