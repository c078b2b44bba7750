"""The XA coordinator's decision log, read without locking it (the coordinator may be running).

The log is a txlog directory (``redo.<N>`` + ``checkpoint``) whose records are encoded by
:mod:`notify.xa.records` (DECISION, END, HEURISTIC, ACK); its checkpoint holds a snapshot of
the live decisions and unacknowledged heuristics and names the coordinator (id, formatId).

What the audit needs is every decision still known: those in the newest snapshot plus every
DECISION record still present in a redo file (with whether an END followed). ``complete`` says
whether the log still starts at ``redo.0`` with nothing before it: only then does a missing
decision prove "presumed abort" for one of this coordinator's transactions.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from notify.txlog.checkpoint import read_checkpoints
from notify.txlog.records import DEFAULT_MAX_RECORD_BYTES
from notify.txlog.segment import SegmentReader, list_segments, segment_path
from notify.xa import records as xr
from notify.xa.errors import HeuristicKind

__all__ = ["CoordinatorLog", "DecisionRow", "HeuristicRow", "read_coordinator_log"]

_OUTCOME: Final = {xr.Outcome.COMMIT: "commit", xr.Outcome.ROLLBACK: "rollback"}


@dataclass(slots=True)
class DecisionRow:
    gtrid_hex: str
    format_id: int
    outcome: str
    source: str
    decided_at_ms: int
    by: str
    branches: list[tuple[str, str]]  # (name, bqual hex)
    ended: bool = False
    ended_at_ms: int | None = None


@dataclass(slots=True)
class HeuristicRow:
    gtrid_hex: str
    name: str
    bqual_hex: str
    kind: str
    decided: str
    at_ms: int
    message: str
    acknowledged: bool = False


@dataclass(slots=True)
class CoordinatorLog:
    """What a decision log says; ``errors`` lists records that could not be read."""

    path: str
    coordinator_id: str | None
    format_id: int | None
    complete: bool
    decisions: dict[str, DecisionRow] = field(default_factory=dict)
    heuristics: list[HeuristicRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _decision_row(d: xr.Decision) -> DecisionRow:
    return DecisionRow(
        gtrid_hex=d.gtrid.hex(),
        format_id=d.format_id,
        outcome=_OUTCOME.get(d.outcome, "none"),
        source=d.source.name.lower(),
        decided_at_ms=d.decided_at_ms,
        by=d.by,
        branches=[(b.name, b.bqual.hex()) for b in d.branches],
    )


def _heuristic_row(h: xr.HeuristicRecord) -> HeuristicRow:
    kind = h.kind.name.lower() if isinstance(h.kind, HeuristicKind) else str(h.kind)
    return HeuristicRow(
        gtrid_hex=h.gtrid.hex(),
        name=h.name,
        bqual_hex=h.bqual.hex(),
        kind=kind,
        decided=_OUTCOME.get(h.decided, "none"),
        at_ms=h.at_ms,
        message=h.message,
    )


def read_coordinator_log(
    path: str | os.PathLike[str], max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> CoordinatorLog:
    """Read a coordinator decision log directory (FileNotFoundError when it is missing)."""
    d = Path(path)
    if not d.is_dir():
        raise FileNotFoundError(f"coordinator log directory {d} does not exist")
    numbers = list_segments(d)
    log = CoordinatorLog(str(d), None, None, complete=not numbers or numbers[0] == 0)
    checkpoints, damaged = read_checkpoints(d, max_record_bytes + 64)
    if damaged:
        log.errors.append(f"{damaged} damaged checkpoint entries")
    snapshot = next((cp for cp in reversed(checkpoints) if cp.state), None)
    if snapshot is not None:
        try:
            table = xr.DecisionTable.from_snapshot(snapshot.state)
        except Exception as e:  # a foreign or damaged blob: keep reading the records
            log.errors.append(f"checkpoint snapshot: {e}")
        else:
            log.coordinator_id = table.coordinator_id
            log.format_id = table.format_id
            for dec in table.decisions.values():
                log.decisions[dec.gtrid.hex()] = _decision_row(dec)
            for hs in table.heuristics.values():
                log.heuristics.extend(_heuristic_row(h) for h in hs)
    for n in numbers:
        fd = os.open(segment_path(d, n), os.O_RDONLY | os.O_CLOEXEC)
        try:
            reader = SegmentReader(fd, 0, os.fstat(fd).st_size, max_record_bytes)
            for r in reader:
                try:
                    rec = xr.decode(int(r.type), r.body)
                except Exception as e:
                    log.errors.append(f"redo.{n}@{r.offset}: {e}")
                    continue
                _fold(log, rec)
            if reader.error is not None and n != numbers[-1]:
                log.errors.append(f"redo.{n}@{reader.stop}: {reader.error}")
        finally:
            os.close(fd)
    return log


def _fold(log: CoordinatorLog, rec: xr.Record) -> None:
    if isinstance(rec, xr.Decision):
        row = _decision_row(rec)  # records replay in log order: a later decision wins
        log.decisions[row.gtrid_hex] = row
    elif isinstance(rec, xr.EndRecord):
        row2 = log.decisions.get(rec.gtrid.hex())
        if row2 is not None:
            row2.ended = True
            row2.ended_at_ms = rec.at_ms
    elif isinstance(rec, xr.HeuristicRecord):
        h = _heuristic_row(rec)
        if not any(
            x.gtrid_hex == h.gtrid_hex and x.bqual_hex == h.bqual_hex and x.at_ms == h.at_ms
            for x in log.heuristics
        ):
            log.heuristics.append(h)
    else:
        for x in log.heuristics:
            if x.gtrid_hex == rec.gtrid.hex():
                x.acknowledged = True
