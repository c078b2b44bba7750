"""Quartz cron expressions (MetaQ's ``deleteWhen``) as APScheduler triggers.

Below :mod:`notify.config` (which validates ``deleteWhen`` with it) and
:mod:`notify.store.retention` (which schedules with it).
"""

from __future__ import annotations

from typing import Final

from apscheduler.triggers.cron import CronTrigger

from notify.errors import ConfigError

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
