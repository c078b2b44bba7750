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
at a record boundary; used by the incremental audit).

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
checkpoint file's entries; ``starts`` as for ``notify-log`` (the checkpoint is always read
whole).

Both are partitioned by file: one Spark input partition per segment or redo file, largest
first. Rows come as Arrow record batches (pyarrow is required on the executors, and the
``notify`` package must be importable there).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from notify.audit import formats

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


def _arrow_schema(columns: Sequence[tuple[str, str]]) -> Any:
    import pyarrow as pa  # type: ignore[import-untyped]

    place = pa.struct(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("count", pa.int32()),
            ("bytes", pa.int64()),
        ]
    )
    hint = pa.struct([("topic", pa.string()), ("partition", pa.int32()), ("hint", pa.int64())])
    simple = {
        "string": pa.string(),
        "int": pa.int32(),
        "long": pa.int64(),
        "boolean": pa.bool_(),
        "binary": pa.binary(),
        "array<long>": pa.list_(pa.int64()),
        "array<int>": pa.list_(pa.int32()),
    }
    fields = []
    for name, t in columns:
        if t in simple:
            fields.append(pa.field(name, simple[t]))
        elif t.startswith("array<struct<topic:string,partition:int,offset"):
            fields.append(pa.field(name, pa.list_(place)))
        else:
            fields.append(pa.field(name, pa.list_(hint)))
    return pa.schema(fields)


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


def _partitions(files: Sequence[Any], starts: dict[str, int]) -> list[InputPartition]:
    out: list[InputPartition] = []
    for f in files:
        at = starts.get(f.key, 0) if getattr(f, "file_no", 0) >= 0 else 0
        if at and at >= f.size:
            continue
        out.append(FilePartition(f, at))
    return out


# ---------------------------------------------------------------------------- notify-log


def _log_columns(options: dict[str, str]) -> list[tuple[str, str]]:
    cols = list(formats.LOG_COLUMNS)
    if _truthy(options.get("payload")):
        cols.append(("payload", "binary"))
    return cols


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
        self.columns = _log_columns(options)
        self.starts = _starts(options)

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(formats.find_segments(self.path, self.topics), self.starts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa

        assert isinstance(partition, FilePartition)
        seg = partition.file
        assert isinstance(seg, formats.SegmentFile)
        schema = _arrow_schema(self.columns)
        for cols in formats.read_segment(seg, with_payload=self.payload, start=partition.start):
            arrays = [pa.array(cols[f.name], f.type) for f in schema]
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)


# ---------------------------------------------------------------------------- notify-txlog


class NotifyTxlogSource(DataSource):
    """``spark.read.format("notify-txlog").load(dir)``: the broker's redo-log records."""

    @classmethod
    def name(cls) -> str:
        return TXLOG_FORMAT

    def schema(self) -> str:
        return _ddl(formats.TXLOG_COLUMNS)

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

    def partitions(self) -> Sequence[InputPartition]:
        return _partitions(formats.find_txlog_files(self.path, self.checkpoint), self.starts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, FilePartition)
        f = partition.file
        assert isinstance(f, formats.TxlogFile)
        schema = _arrow_schema(formats.TXLOG_COLUMNS)
        for cols in formats.read_txlog_file(f, self.max_record_bytes, start=partition.start):
            yield txlog_batch(cols, schema)


def txlog_batch(cols: formats.TxlogColumns, schema: Any) -> Any:
    """An Arrow record batch of :data:`~notify.audit.formats.TXLOG_COLUMNS` from columns."""
    import pyarrow as pa

    n = cols.rows
    nulls = {w: pa.array(cols.invalid(w), pa.bool_()) for w in (0, 1, 2)}

    def lists(offsets: list[int], which: int, values: Any) -> Any:
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values, mask=nulls[which])

    arrays: list[Any] = []
    scalars = cols.columns()
    for fl in schema:
        name = fl.name
        if name == "file":
            arrays.append(pa.repeat(pa.scalar(cols.file.path, pa.string()), n))
        elif name == "file_no":
            arrays.append(pa.repeat(pa.scalar(cols.file.file_no, pa.int64()), n))
        elif name in ("msg_ids", "checksums", "sizes"):
            vals = {"msg_ids": cols.ids, "checksums": cols.crcs, "sizes": cols.sizes}[name]
            arrays.append(lists(cols.ids_off, 0, pa.array(vals, fl.type.value_type)))
        elif name == "placements":
            st = fl.type.value_type
            values = pa.StructArray.from_arrays(
                [pa.array(v, st.field(i).type) for i, v in enumerate(cols.pl)], fields=list(st)
            )
            arrays.append(lists(cols.pl_off, 1, values))
        elif name == "hints":
            st = fl.type.value_type
            values = pa.StructArray.from_arrays(
                [pa.array(v, st.field(i).type) for i, v in enumerate(cols.h)], fields=list(st)
            )
            arrays.append(lists(cols.h_off, 2, values))
        else:
            arrays.append(pa.array(scalars[name], fl.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def register_sources(spark: SparkSession) -> None:
    """Register ``notify-log`` and ``notify-txlog`` with ``spark`` (idempotent)."""
    spark.dataSource.register(NotifyLogSource)
    spark.dataSource.register(NotifyTxlogSource)
