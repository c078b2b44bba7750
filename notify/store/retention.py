"""Retention: MetaQ's ``deletePolicy`` and ``deleteWhen`` applied to closed segments.

``deletePolicy``: ``delete,N`` removes closed segments last written more than N hours ago
(``s``/``m``/``h`` suffixes allowed); ``archive,N`` renames them to ``<name>.arc`` and
``archive,N,zip`` compresses them to ``<name>.zip`` instead. The active (last) segment is
never touched. Unless the topic sets ``retentionIgnoresConsumers=true``, a segment holding an
offset that a consumer fetched within the last ``LIVE_CONSUMER_S`` seconds, or any segment
after it, is kept: a live consumer never loses messages it has not read yet.
Queue groups (README "Queues") are held for too, bounded: :func:`hold_for_queues` keeps
expired segments a queue group has not finished, at most ``queueRetentionHoldBytes`` per
partition (0: not held).

``deleteWhen`` is Quartz cron (``sec min hour day-of-month month day-of-week [year]``,
e.g. ``0 0 6,18 * * ?``), converted to an APScheduler CronTrigger by :func:`quartz_trigger`.
"""

from __future__ import annotations

import logging
import os
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from notify.config import DeletePolicy
from notify.cron import quartz_trigger as quartz_trigger  # re-exported: notify.broker.app
from notify.store.partition import Partition

log = logging.getLogger("notify.retention")

LIVE_CONSUMER_S: Final = 600.0
@dataclass(frozen=True)
class RetentionResult:
    topic: str
    partition: int
    removed: tuple[str, ...]
    action: str
    kept_for_consumers: int


def plan_cut(
    part: Partition,
    policy: DeletePolicy,
    consumer_offsets: list[int],
    ignore_consumers: bool = False,
    now: float | None = None,
) -> tuple[int, int]:
    """``(cut, kept)``: segments ending at or before ``cut`` are expired and may go;
    ``kept`` counts expired segments kept because a live consumer has not read past them.

    Only closed segments are considered, oldest first; ``consumer_offsets`` are the offsets
    live consumers fetched recently (ignored when ``ignore_consumers``).
    """
    now = time.time() if now is None else now
    floor = None if ignore_consumers or not consumer_offsets else min(consumer_offsets)
    cut = part.min_offset
    kept = 0
    for seg in part.segments[:-1]:
        try:
            mtime = os.stat(seg.path).st_mtime
        except OSError:
            break
        if now - mtime < policy.max_age_s:
            break  # segments are in write order: the rest are younger
        if floor is not None and seg.end > floor:
            kept += 1
            break
        cut = seg.end
    return cut, kept


def hold_for_queues(part: Partition, cut: int, floor: int | None, max_hold: int) -> int:
    """The cut once expired segments a queue group still needs are kept: those ending
    after ``floor`` (the lowest offset a queue group may still read; None: none), as long
    as the expired bytes kept stay within ``max_hold`` (older ones go anyway)."""
    if floor is None or floor >= cut or max_hold <= 0:
        return cut
    new = part.min_offset
    for seg in part.segments[:-1]:
        if seg.end > cut:
            break
        if seg.end > floor and cut - seg.start <= max_hold:
            break  # this one and the younger ones are kept
        new = seg.end
    return new


def zip_segments(paths: list[Path]) -> None:
    """``<segment>.zip`` next to each segment (slow: run it off the event loop)."""
    for path in paths:
        target = path.with_name(path.name + ".zip")
        tmp = target.with_name(target.name + ".tmp")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.write(path, arcname=path.name)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)


def remove_before(part: Partition, cut: int, policy: DeletePolicy, kept: int) -> RetentionResult:
    """Drop the segments ending at or before ``cut`` (``archive`` keeps a ``.arc`` hard link
    unless they were zipped already)."""
    if policy.action == "archive" and not policy.compress:
        for seg in part.segments[:-1]:
            if seg.end > cut:
                break
            target = seg.path.with_name(seg.path.name + ".arc")
            if not target.exists():
                os.link(seg.path, target)
    removed = tuple(p.name for p in part.delete_segments_before(cut))
    if removed:
        log.info(
            "retention %s-%d: %s %d segment(s) up to offset %d: %s",
            part.topic,
            part.index,
            "archived" if policy.action == "archive" else "deleted",
            len(removed),
            cut,
            ", ".join(removed),
        )
    return RetentionResult(part.topic, part.index, removed, policy.action, kept)
