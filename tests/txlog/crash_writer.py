"""Crash-test helper: commits records from several threads and prints each acknowledgement.

Usage: ``python crash_writer.py LOGDIR RUN_ID [THREADS]``. Every record body is
``b"<run>:<thread>:<seq>:"`` followed by a deterministic filler of varying size (up to
~300 KiB, so some writes are large enough to be cut by a SIGKILL); the line
``ACK <file_no> <offset> <run>:<thread>:<seq> <size>`` is printed only after ``commit`` (with
``flush_at_commit=1``) returned, i.e. once the record is durable. Runs until killed.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from notify.txlog import TxLog, TxLogConfig


def body_for(key: str, size: int) -> bytes:
    """The body of record ``key``: the key, then ``size`` filler bytes derived from it."""
    head = key.encode() + b":"
    unit = (key.encode() + b"#") * 4
    return head + (unit * (size // len(unit) + 1))[:size]


def size_for(thread: int, seq: int) -> int:
    """Mostly small records, now and then a large one."""
    return 300_000 if (seq * 7 + thread) % 23 == 0 else (seq * 37 + thread * 11) % 2000


def main() -> None:
    logdir, run = sys.argv[1], sys.argv[2]
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    config = TxLogConfig(segment_bytes=1 << 20, flush_at_commit=1)
    log = TxLog.open(logdir, config)
    print(f"OPEN {log.recovery.truncated_bytes}", flush=True)
    out_lock = threading.Lock()

    def worker(t: int) -> None:
        seq = 0
        while True:
            key = f"{run}:{t}:{seq}"
            size = size_for(t, seq)
            pos = log.commit(3, body_for(key, size))
            with out_lock:
                sys.stdout.write(f"ACK {pos.file_no} {pos.offset} {key} {size}\n")
                sys.stdout.flush()
            seq += 1

    for t in range(threads):
        threading.Thread(target=worker, args=(t,), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
