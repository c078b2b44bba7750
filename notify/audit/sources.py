"""PySpark 4 Python Data Sources over the broker's files (``pyspark.sql.datasource``).

Register once per session, then read::

    from notify.audit.sources import register_sources
    register_sources(spark)
    log = spark.read.format("notify-log").load("/var/notify/data")            # messages
    txlog = spark.read.format("notify-txlog").load("/var/notify/data")        # redo records

``notify-log`` (one row per record of the partition segments; columns
:data:`~notify.audit.formats.LOG_COLUMNS`): ``topic, partition, file, segment_start, offset``
(partition byte offset), ``msg_id, flag, checksum`` (stored), ``checksum_ok`` (payload CRC
matches), ``attribute, size`` (header + payload bytes), ``time_ms`` (from the message id),
``error`` (set on the one row that ends an unreadable file; its other fields are null but the
place). Options: ``payload`` (``true`` adds a ``payload`` binary column), ``topics`` (comma
separated names to read), ``starts`` (JSON ``{file key: byte}``: begin those files there,
at a record boundary; used by the incremental audit), ``columns`` (comma separated: only
these columns, in the schema's order; Spark cannot prune a Python data source's columns,
and every column handed over costs the JVM a conversion per row).

``notify-txlog`` (one row per redo record; columns :data:`~notify.audit.formats.TXLOG_COLUMNS`):
``file, file_no, position, type, kind`` (APPEND_MSG, PREPARE, COMMIT, ROLLBACK, APPLIED,
HEURISTIC, FORGET, CHECKPOINT, CORRUPT, TYPE_<n>), ``tx_key, time_ms`` (PREPARE/COMMIT time,
APPEND_MSG: time of its first message id), ``topic, partition, offset`` (APPEND_MSG's
partition; the single placement of an APPLIED or hint of a COMMIT; for CHECKPOINT rows the
replay start: redo file number in ``partition``, byte in ``offset``), ``msg_count, msg_ids,
checksums, sizes`` (APPEND_MSG's records), ``placements`` (APPLIED), ``hints`` (COMMIT),
``timeout_s, producer_group`` (PREPARE), ``reason`` (ROLLBACK; HEURISTIC: who), ``outcome``
(HEURISTIC), ``crc, size`` (frame), ``error``. The path may be the ``transactions`` directory
or a broker's dataLogPath/dataPath holding it. Option ``checkpoint`` (default true) adds the
checkpoint file's entries; ``starts`` and ``columns`` as for ``notify-log`` (the checkpoint
is always read whole).

Both are partitioned by file: one Spark input partition per segment or redo file, largest
first. Rows come as Arrow record batches (pyarrow and numpy are required on the executors, and the
``notify`` package must be importable there).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from notify.audit import bulk, formats

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LOG_FORMAT", "TXLOG_FORMAT", "NotifyLogSource", "NotifyTxlogSource", "register_sources"]

LOG_FORMAT: Final = "notify-log"
TXLOG_FORMAT: Final = "notify-txlog"


def _ddl(columns: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"`{n}` {t}" for n, t in columns)


def _truthy(v: str | None, default: bool = False) -> bool:
    if v is None:
        return default
    return v.strip().lower() in ("1", "true", "yes", "on")


_arrow_schema = bulk.arrow_schema


class FilePartition(InputPartition):
    """One input partition: one file, read from byte ``start``."""

    def __init__(self, value: formats.SegmentFile | formats.TxlogFile, start: int = 0):
        super().__init__(value)
        self.file = value
        self.start = start


def _starts(options: dict[str, str]) -> dict[str, int]:
    """Option ``starts``: JSON ``{file key: byte}`` to begin each file at (files at their
    end are skipped; keys: ``<topic>-<n>/<start>`` and ``redo.<N>``, see ``key`` of
    :class:`~notify.audit.formats.SegmentFile`); the incremental audit passes what earlier
    runs consumed."""
    raw = options.get("starts")
    return {str(k): int(v) for k, v in json.loads(raw).items()} if raw else {}


def _columns(options: dict[str, str], all_columns: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Option ``columns``: the named columns of ``all_columns``, in their order (all of them
    without the option); ValueError naming an unknown column."""
    raw = options.get("columns")
    if not raw:
        return all_columns
    want = [c.strip() for c in raw.split(",") if c.strip()]
    known = {n for n, _t in all_columns}
    unknown = [c for c in want if c not in known]
    if unknown:
        raise ValueError(
            f"option columns: no column {', '.join(unknown)} (columns: {', '.join(sorted(known))})"
        )
    return [(n, t) for n, t in all_columns if n in want]


def _select(batches: Iterator[Any], names: list[str] | None) -> Iterator[Any]:
    if names is None:
        yield from batches
        return
    for b in batches:
        yield b.select(names)


def _partitions(files: Sequence[Any], starts: dict[str, int]) -> list[InputPartition]:
    out: list[InputPartition] = []
    for f in files:
        at = starts.get(f.key, 0) if getattr(f, "file_no", 0) >= 0 else 0
        if at and at >= f.size:
            continue
        out.append(FilePartition(f, at))
    return out


# ---------------------------------------------------------------------------- notify-log


def _all_log_columns(options: dict[str, str]) -> list[tuple[str, str]]:
    cols = list(formats.LOG_COLUMNS)
    if _truthy(options.get("payload")):
        cols.append(("payload", "binary"))
    return cols


def _log_columns(options: dict[str, str]) -> list[tuple[str, str]]:
    return _columns(options, _all_log_columns(options))


class NotifyLogSource(DataSource):
    """``spark.read.format("notify-log").load(dataPath)``: the messages of partition files."""

    @classmethod
    def name(cls) -> str:
        return LOG_FORMAT

    def schema(self) -> str:
        return _ddl(_log_columns(dict(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        return NotifyLogReader(dict(self.options))


class NotifyLogReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        path = options.get("path") or options.get("paths")
        if not path:
            raise ValueError("notify-log: load(path) needs the broker's dataPath")
        self.path: str = path
        self.payload = _truthy(options.get("payload"))
        topics = options.get("topics")
        self.topics = {t.strip() for t in topics.split(",") if t.strip()} if topics else None
        self.all_columns = _all_log_columns(options)
        self.columns = _log_columns(options)
        self.names = None if self.columns == self.all_columns else [n for n, _t in self.columns]
        self.starts = _starts(options)

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(formats.find_segments(self.path, self.topics), self.starts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, FilePartition):
            return  # no file left to read: Spark reads one InputPartition(None)
        seg = partition.file
        assert isinstance(seg, formats.SegmentFile)
        yield from _select(
            bulk.read_segment_batches(
                seg,
                _arrow_schema(self.all_columns),
                with_payload=self.payload,
                start=partition.start,
            ),
            self.names,
        )


# ---------------------------------------------------------------------------- notify-txlog


class NotifyTxlogSource(DataSource):
    """``spark.read.format("notify-txlog").load(dir)``: the broker's redo-log records."""

    @classmethod
    def name(cls) -> str:
        return TXLOG_FORMAT

    def schema(self) -> str:
        return _ddl(_columns(dict(self.options), formats.TXLOG_COLUMNS))

    def reader(self, schema: StructType) -> DataSourceReader:
        return NotifyTxlogReader(dict(self.options))


class NotifyTxlogReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        path = options.get("path") or options.get("paths")
        if not path:
            raise ValueError("notify-txlog: load(path) needs the transaction log directory")
        self.path: str = path
        self.checkpoint = _truthy(options.get("checkpoint"), True)
        self.max_record_bytes = int(
            options.get("max_record_bytes", formats.DEFAULT_MAX_RECORD_BYTES)
        )
        self.starts = _starts(options)
        cols = _columns(options, formats.TXLOG_COLUMNS)
        self.names = None if cols == formats.TXLOG_COLUMNS else [n for n, _t in cols]

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(formats.find_txlog_files(self.path, self.checkpoint), self.starts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, FilePartition):
            return  # no file left to read: Spark reads one InputPartition(None)
        f = partition.file
        assert isinstance(f, formats.TxlogFile)
        yield from _select(
            bulk.read_txlog_batches(f, self.max_record_bytes, start=partition.start), self.names
        )


#: kept for callers of the earlier name
txlog_batch = bulk.txlog_batch


def register_sources(spark: SparkSession) -> None:
    """Register ``notify-log`` and ``notify-txlog`` with ``spark`` (idempotent)."""
    spark.dataSource.register(NotifyLogSource)
    spark.dataSource.register(NotifyTxlogSource)
