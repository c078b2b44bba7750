"""Configuration of a :class:`~txlog.log.TxLog`."""

from __future__ import annotations

import math
from dataclasses import dataclass

from notify.errors import ConfigError

__all__ = ["FLUSH_NEVER", "FLUSH_ON_COMMIT", "FLUSH_PERIODIC", "TxLogConfig"]

#: ``flush_at_commit`` values, with MetaQ's meaning.
FLUSH_NEVER = 0  # never fsync explicitly; the OS writes back when it likes
FLUSH_ON_COMMIT = 1  # every commit()/commit_async() returns only after its record is fsynced
FLUSH_PERIODIC = 2  # a background thread fsyncs every flush_interval_s; commit() does not wait

_MIN_SEGMENT = 64
_MAX_RECORD_LIMIT = 2**32 - 2  # the length field is a u32 that also counts the type byte


@dataclass(frozen=True, slots=True)
class TxLogConfig:
    """Tuning of a transaction log; every field is validated on construction.

    ``segment_bytes``
        size at which a ``redo.<N>`` file is closed and the next one started (a single
        append or append_many batch that does not fit is written whole into a fresh file).
    ``flush_at_commit``
        0, 1 or 2 (see :data:`FLUSH_NEVER`, :data:`FLUSH_ON_COMMIT`, :data:`FLUSH_PERIODIC`).
    ``flush_interval_s``
        period of the background fsync when ``flush_at_commit == 2``.
    ``max_checkpoints``
        number of checkpoints kept in the ``checkpoint`` file (older ones are dropped).
    ``max_record_bytes``
        largest accepted record body; also the bound used to tell a garbage length from a
        real one during recovery.

    Raises :class:`~notify.errors.ConfigError` naming the bad field.
    """

    segment_bytes: int = 64 * 2**20
    flush_at_commit: int = FLUSH_ON_COMMIT
    flush_interval_s: float = 1.0
    max_checkpoints: int = 3
    max_record_bytes: int = 16 * 2**20

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> ConfigError:
            return ConfigError(f"txlog.{field}: {why} (got {getattr(self, field)!r})")

        for name in ("segment_bytes", "flush_at_commit", "max_checkpoints", "max_record_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise bad(name, "must be an integer")
        if self.segment_bytes < _MIN_SEGMENT:
            raise bad("segment_bytes", f"must be at least {_MIN_SEGMENT}")
        if self.flush_at_commit not in (FLUSH_NEVER, FLUSH_ON_COMMIT, FLUSH_PERIODIC):
            raise bad("flush_at_commit", "must be 0, 1 or 2")
        interval = self.flush_interval_s
        if (
            not isinstance(interval, int | float)
            or isinstance(interval, bool)
            or not math.isfinite(interval)
            or interval <= 0
        ):
            raise bad("flush_interval_s", "must be a positive number of seconds")
        if self.max_checkpoints < 1:
            raise bad("max_checkpoints", "must be at least 1")
        if not 0 <= self.max_record_bytes <= _MAX_RECORD_LIMIT:
            raise bad("max_record_bytes", f"must be in 0..{_MAX_RECORD_LIMIT}")
