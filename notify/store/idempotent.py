"""Idempotent re-apply: how much of a batch of records already reached a partition.

Transaction commits and delayed-message moves write a durable intent (with the partition's
end at that moment as a hint) before appending a batch, and on recovery must append only
what is missing. A batch is appended with one write, so what a crash left behind is a prefix
of it (the store cuts torn tails); records are matched by message id, which the broker
assigned before the intent was logged.
"""

from __future__ import annotations

from notify.protocol import records
from notify.store.partition import Partition


def already_present(
    part: Partition, hint: int, data: bytes, exact: bool = False
) -> tuple[int, int]:
    """``(bytes, offset)``: how many leading bytes of ``data`` (whole records) are already
    in ``part`` at or after ``hint``, and the offset they start at (-1 when none are).
    ``exact``: ``hint`` is a record boundary known to survive (a segment's end), and
    records before it must not match (a delay re-put: the originals carry the same ids)."""
    want, _ = records.decode_all(data, verify=False)
    if not want:
        return 0, -1
    ids = [r.msg_id for r in want]
    # the hint is a record boundary only in data that was durable before the crash; past
    # the partition's checked start, scan from that known boundary instead
    off = max(hint if exact else min(hint, part.scan_start), part.min_offset)
    # nor always then: puts held for a synchronous slave and taken back after the intent
    # was logged leave the hint inside what was appended since; then scan from the start
    # of the hint's segment (a record boundary)
    retry = not exact
    found_at = -1
    matched = 0
    done = False
    while not done and off < part.end:
        try:
            recs, used = records.decode_all(part.read_raw(off, 1 << 20), off)
        except records.CorruptRecordError:
            if not retry:
                raise
            recs, used = [], 0
        if not recs and retry and part.segment_start(off) < off:
            off = part.segment_start(off)
            retry = False
            continue
        retry = False
        if not recs:
            break
        for r in recs:
            if found_at < 0:
                if r.msg_id == ids[0]:
                    found_at, matched = r.offset, 1
            elif r.msg_id == ids[matched]:
                matched += 1
            else:
                done = True
            if matched == len(ids):
                done = True
            if done:
                break
        off += used
    if found_at < 0:
        return 0, -1
    return sum(r.size for r in want[:matched]), found_at
