"""What an incremental audit keeps between runs, beside its outputs (``<out>/state``).

Message ids carry their millisecond (``ms << 22``), so ``msg_id >> 44`` (:data:`BLOCK_SHIFT`)
cuts them into *blocks* of about 70 minutes of ids. Matching an expected message with the
partitions' records is a join by id, so it can be redone block by block; a run redoes only
the blocks something happened in and carries the rest. Transactions are short-lived: a run
aggregates again only the keys with new records (or records in deleted redo files) and the
keys with a message in a block it redoes, reading their earlier rows from the few redo files
they lie in.

Layout (Parquet tables under ``run=<n>`` directories, ``n`` the run that wrote them; a
directory of a run above ``files.json``'s ``runs`` is left over from a stopped run and
ignored)::

    files.json                    inputs; per file key (``redo.<N>``, ``<topic>-<n>/<start>``,
                                  so an ``.arc`` segment stays the same file) the byte up to
                                  which whole records were read (``consumed``); per redo file
                                  its records by kind (``kinds``)
    txlog/run=<n>/file_no=<k>/    the redo rows of file k parsed in run n (the checks'
                                  columns; no CORRUPT or CHECKPOINT rows)
    log/run=<n>/blk=<b>/          every record of block b (id, partition, offset, checksum):
                                  rewritten whole by the last run that redid the block
    keys/run=<n>/blk=<b>/         the transaction keys with a message in block b (same)
    tx/run=<n>/                   the transactions table of run n (+ ``_last_file_no``)
    hours/run=<n>/                records per segment, hour and block (topic_hours' source)
    findings/run=<n>/             the findings a later run may carry: message matches (by
                                  block), checksum mismatches (by segment), undecodable redo
                                  records (by file)

A later run starts each file at its consumed byte, so only the bytes added since are parsed;
a file whose read ended at a broken or torn record is read again from that record (its
finding is made again, or goes away when the record is now whole). Files that no longer
exist (retention, checkpoints) drop their rows, counts and findings; their blocks and keys
are redone. A state that does not fit (other input directories, a file now shorter than what
was consumed: rewritten or replaced, another version) is ignored and the run reads everything
again, as ``--full`` does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = [
    "BLOCK_SHIFT",
    "STATE_VERSION",
    "TABLES",
    "AuditState",
    "forget_state",
    "load_state",
    "save_files",
]

STATE_VERSION: Final = 2
FILES: Final = "files.json"
#: ``msg_id >> BLOCK_SHIFT``: a block of ids (2^22 ms, about 70 minutes)
BLOCK_SHIFT: Final = 44
#: the state's tables (directories under the state)
TABLES: Final = ("txlog", "log", "keys", "tx", "hours", "findings")
_RUN = re.compile(r"^run=(\d+)$")


@dataclass
class AuditState:
    """A state directory and what its ``files.json`` says (empty when there is none)."""

    path: Path
    runs: int = 0
    txlog: str | None = None
    data: str | None = None
    consumed: dict[str, int] = field(default_factory=dict)
    #: per redo file number, its stored records by kind
    kinds: dict[int, dict[str, int]] = field(default_factory=dict)
    why_full: str | None = None  # set when the state cannot be used

    @property
    def usable(self) -> bool:
        return self.runs > 0 and self.why_full is None

    def _runs(self, table: str) -> list[tuple[int, Path]]:
        d = self.path / table
        if not d.is_dir():
            return []
        out = []
        for p in d.iterdir():
            m = _RUN.match(p.name)
            if m and p.is_dir() and int(m.group(1)) <= self.runs:
                out.append((int(m.group(1)), p))
        return sorted(out)

    def latest(self, table: str) -> str | None:
        """The newest recorded run's directory of a whole-table ``table`` (tx, hours,
        findings), or None."""
        runs = self._runs(table)
        return str(runs[-1][1]) if runs else None

    def parts(self, table: str, column: str) -> dict[int, list[str]]:
        """``{value: [directories]}`` of a table split by ``column`` (txlog by ``file_no``,
        log and keys by ``blk``), over the recorded runs."""
        out: dict[int, list[str]] = {}
        for _n, run in self._runs(table):
            for p in run.iterdir():
                if p.is_dir() and p.name.startswith(column + "="):
                    out.setdefault(int(p.name.split("=", 1)[1]), []).append(str(p))
        return out

    def run_dir(self, table: str, run: int) -> Path:
        return self.path / table / f"run={run}"

    def prune(self, run: int, redone: dict[str, set[int]], files: set[int]) -> None:
        """After run ``run`` wrote its tables: drop what it replaced. Whole tables keep only
        ``run``; in ``redone`` (``{table: values}``, log and keys by block) the older runs'
        directories of those values go; txlog keeps the files in ``files``."""
        for table in TABLES:
            d = self.path / table
            if not d.is_dir():
                continue
            for p in d.iterdir():
                m = _RUN.match(p.name)
                if not m:
                    continue
                n = int(m.group(1))
                # above run: left over from a stopped run; whole tables keep only run
                if n > run or (n < run and table in ("tx", "hours", "findings")):
                    shutil.rmtree(p, ignore_errors=True)
                elif table in ("log", "keys") and n < run:
                    for q in p.glob("blk=*"):
                        if int(q.name[4:]) in redone.get(table, set()):
                            shutil.rmtree(q, ignore_errors=True)
                elif table == "txlog":
                    for q in p.glob("file_no=*"):
                        if int(q.name[8:]) not in files:
                            shutil.rmtree(q, ignore_errors=True)
                if p.is_dir() and not any(x.is_dir() for x in p.iterdir()) and n != run:
                    shutil.rmtree(p, ignore_errors=True)


def load_state(path: str | os.PathLike[str], txlog: str, data: str) -> AuditState:
    """Read ``files.json`` under ``path``; ``why_full`` says why it cannot be used."""
    st = AuditState(Path(path))
    f = st.path / FILES
    if not f.is_file():
        return st
    try:
        raw: dict[str, Any] = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        st.why_full = f"unreadable {f}: {e}"
        return st
    if raw.get("version") != STATE_VERSION:
        st.why_full = f"state version {raw.get('version')} is not {STATE_VERSION}"
        return st
    st.runs = int(raw.get("runs", 0))
    st.txlog, st.data = raw.get("txlog"), raw.get("data")
    st.consumed = {str(k): int(v) for k, v in raw.get("consumed", {}).items()}
    st.kinds = {
        int(k): {str(kind): int(n) for kind, n in v.items()}
        for k, v in raw.get("kinds", {}).items()
    }
    if (st.txlog, st.data) != (txlog, data):
        st.why_full = f"the state is for txlog {st.txlog} and data {st.data}"
    return st


def forget_state(st: AuditState) -> None:
    """Make the state unusable (remove ``files.json``) before its tables are replaced."""
    (st.path / FILES).unlink(missing_ok=True)


def save_files(
    st: AuditState,
    txlog: str,
    data: str,
    consumed: dict[str, int],
    kinds: dict[int, dict[str, int]],
) -> None:
    """Write ``files.json`` (atomically) for one more run."""
    st.path.mkdir(parents=True, exist_ok=True)
    tmp = st.path / (FILES + ".tmp")
    tmp.write_text(
        json.dumps(
            {
                "version": STATE_VERSION,
                "runs": st.runs + 1,
                "txlog": txlog,
                "data": data,
                "consumed": dict(sorted(consumed.items())),
                "kinds": {str(k): dict(sorted(v.items())) for k, v in sorted(kinds.items())},
            },
            indent=1,
        )
        + "\n"
    )
    os.replace(tmp, st.path / FILES)
