"""What an incremental audit keeps between runs, beside its outputs (``<out>/state``).

* ``files.json``: the inputs (txlog and data directories) and, per redo and segment file
  (by key: ``redo.<N>``, ``<topic>-<n>/<start>``, so a segment the retention ``archive``
  policy renamed to ``.arc`` stays the same file), the byte up to which whole records were
  read (``consumed``). A later run starts each file
  there, so only the bytes added since are parsed; a file whose read ended at a broken or
  torn record is read again from that record (its finding is made again, or goes away when
  the record is now whole).
* ``txlog/run-<n>/`` and ``log/run-<n>/``: the parsed rows of each run (Parquet: the same
  columns the checks use, no payloads, no error rows). The next run checks them together
  with the new rows, so its result is the full audit's; rows of files that no longer exist
  (retention deleted them) are left out, as a full audit would not see them.

A state that does not fit (other input directories, a file now shorter than what was
consumed: rewritten or replaced) is ignored and the run reads everything again, as
``--full`` does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = ["STATE_VERSION", "AuditState", "forget_state", "load_state", "save_files"]

STATE_VERSION: Final = 1
FILES: Final = "files.json"


@dataclass
class AuditState:
    """A state directory and what its ``files.json`` says (empty when there is none)."""

    path: Path
    runs: int = 0
    txlog: str | None = None
    data: str | None = None
    consumed: dict[str, int] = field(default_factory=dict)
    why_full: str | None = None  # set when the state cannot be used

    @property
    def usable(self) -> bool:
        return self.runs > 0 and self.why_full is None

    def parts(self, table: str) -> list[str]:
        """The Parquet directories of earlier runs for ``table`` (``txlog`` or ``log``)."""
        d = self.path / table
        if not d.is_dir():
            return []
        return sorted(
            str(p)
            for p in d.iterdir()
            if p.is_dir() and p.name.startswith("run-") and int(p.name[4:]) <= self.runs
        )


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
    if (st.txlog, st.data) != (txlog, data):
        st.why_full = f"the state is for txlog {st.txlog} and data {st.data}"
    return st


def forget_state(st: AuditState) -> None:
    """Make the state unusable (remove ``files.json``) before its tables are replaced."""
    (st.path / FILES).unlink(missing_ok=True)


def save_files(st: AuditState, txlog: str, data: str, consumed: dict[str, int]) -> None:
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
            },
            indent=1,
        )
        + "\n"
    )
    os.replace(tmp, st.path / FILES)
