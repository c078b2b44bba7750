"""txlog: an append-only, segmented redo transaction log with group commit.

Used by the broker (asyncio) and the 2PC coordinator (threads). Records are opaque
``(type, body)`` pairs framed with a length and a CRC (:mod:`txlog.records`); the log lives in
``redo.<N>`` segment files plus a ``checkpoint`` file in one directory (:mod:`txlog.log`).

Quick use::

    with TxLog.open("data/txlog", TxLogConfig(flush_at_commit=1)) as log:
        pos = log.commit(RecordType.PREPARE, body)       # durable on return
        for position, rtype, body in log.replay():
            ...
        log.checkpoint(oldest_live=log.end_position, state=b"...")
"""

from notify.errors import ConfigError, TxLogCorruptError, TxLogError
from notify.txlog.checkpoint import Checkpoint
from notify.txlog.config import FLUSH_NEVER, FLUSH_ON_COMMIT, FLUSH_PERIODIC, TxLogConfig
from notify.txlog.log import LogRecord, RecoveryReport, TxLog, cut_log
from notify.txlog.position import Position
from notify.txlog.records import (
    CorruptReason,
    DecodeResult,
    Record,
    RecordType,
    decode,
    encode,
    encode_many,
    record_type,
)

__all__ = [
    "FLUSH_NEVER",
    "FLUSH_ON_COMMIT",
    "FLUSH_PERIODIC",
    "Checkpoint",
    "ConfigError",
    "CorruptReason",
    "DecodeResult",
    "LogRecord",
    "Position",
    "Record",
    "RecordType",
    "RecoveryReport",
    "TxLog",
    "TxLogConfig",
    "TxLogCorruptError",
    "TxLogError",
    "cut_log",
    "decode",
    "encode",
    "encode_many",
    "record_type",
]
