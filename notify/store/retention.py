"""Retention: MetaQ's ``deletePolicy`` and ``deleteWhen`` applied to closed segments.

``deletePolicy``: ``delete,N`` removes closed segments last written more than N hours ago
(``s``/``m``/``h`` suffixes allowed); ``archive,N`` renames them to ``<name>.arc`` and
``archive,N,zip`` compresses them to ``<name>.zip`` instead. The active (last) segment is
never touched. Unless the topic sets ``retentionIgnoresConsumers=true``, a segment holding an
offset that a consumer fetched within the last ``LIVE_CONSUMER_S`` seconds, or any segment
after it, is kept: a live consumer never loses messages it has not read yet.

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

from apscheduler.triggers.cron import CronTrigger

from notify.config import DeletePolicy
from notify.errors import ConfigError
from notify.store.partition import Partition

log = logging.getLogger("notify.retention")

LIVE_CONSUMER_S: Final = 600.0
_QUARTZ_DOW: Final = {
    "1": "sun",
    "2": "mon",
    "3": "tue",
    "4": "wed",
    "5": "thu",
    "6": "fri",
    "7": "sat",
}


def _dow(field: str) -> str:
    out = []
    for part in field.split(","):
        bounds = part.split("-")
        conv = []
        for b in bounds:
            b2 = b.strip().lower()
            if b2 in _QUARTZ_DOW:
                conv.append(_QUARTZ_DOW[b2])
            elif b2[:3] in ("sun", "mon", "tue", "wed", "thu", "fri", "sat") and len(b2) == 3:
                conv.append(b2)
            else:
                raise ValueError(f"day-of-week {b!r} not supported")
        out.append("-".join(conv))
    return ",".join(out)


def quartz_trigger(expr: str, timezone: str | None = None) -> CronTrigger:
    """Convert a Quartz cron expression to an APScheduler CronTrigger.

    Supported: numbers, lists, ranges, ``*``, ``/`` steps, ``?``, ``L`` as day of month,
    day-of-week numbers (1 = Sunday, as Quartz) or names. ``W`` and ``#`` are rejected with
    a clear error rather than silently misread.
    """
    fields = expr.split()
    if len(fields) not in (6, 7):
        raise ConfigError(
            f"deleteWhen {expr!r}: Quartz cron needs 6 or 7 fields "
            "(sec min hour day-of-month month day-of-week [year])"
        )
    sec, minute, hour, dom, month, dow = fields[:6]
    year = fields[6] if len(fields) == 7 else None
    try:
        if any(c in expr for c in "W#"):
            raise ValueError("W and # are not supported")
        day = "*" if dom == "?" else ("last" if dom == "L" else dom)
        day_of_week = "*" if dow in ("?", "*") else _dow(dow)
        return CronTrigger(
            second=sec,
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=day_of_week,
            year=year,
            timezone=timezone,
        )
    except ValueError as e:
        raise ConfigError(f"deleteWhen {expr!r}: {e}") from None


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
