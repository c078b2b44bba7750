"""The audit itself: Spark DataFrames over the redo log and the partitions, and the findings.

Transactions are the redo records grouped by key. A key may be reused once its transaction
ended, so each run of records from an APPEND_MSG that follows a final record (APPLIED,
ROLLBACK, HEURISTIC, FORGET) to the next such record is one *incarnation* (``inc``). Outcome:
``committed`` (COMMIT or APPLIED), ``rolled_back``, ``heuristic_commit``/``heuristic_rollback``,
``prepared`` (PREPARE and nothing after), ``active`` (messages only), ``unknown``.

Checks (``check``: ``severity``):

* ``committed_missing``: violation. A message of a committed transaction (its id from
  APPEND_MSG) is not in the partition it was put to; with APPLIED, in the byte range the
  placement names, else at or after the COMMIT hint. Not reported when that range lies below
  the partition's oldest segment (retention deleted it).
* ``committed_duplicate``: violation, the message is in its partition more than once.
* ``committed_misplaced``: violation, found once but outside the placement's byte range
  (or before the COMMIT hint when APPLIED is missing).
* ``committed_checksum_differs``: violation, the partition's record under that id has another
  checksum than the one logged at put time (other bytes under the same id).
* ``uncommitted_visible``: violation, a message of a rolled-back, heuristically rolled-back,
  prepared or unfinished transaction is in any partition.
* ``checksum_mismatch``: violation, a record's payload does not match its stored CRC.
* ``segment_corrupt`` (violation) / ``segment_torn_tail`` (warning, newest segment of a
  partition only): a segment's framing breaks before its end.
* ``txlog_corrupt`` (violation) / ``txlog_torn_tail`` (warning, newest redo file) /
  ``txlog_undecodable`` (violation) / ``checkpoint_damaged`` (warning).
* ``stuck_prepared``: violation, prepared and undecided for longer than the timeout
  (``tx_timeout_s``, else the timeout logged with PREPARE); ``detail`` gives the age.
* with a coordinator log, ``heuristic_mismatch`` (violation): the coordinator's decision and
  the broker's outcome differ (commit vs rolled back, rollback vs committed, a commit with no
  decision when the log is complete enough to presume abort, a branch still prepared after
  the coordinator ended phase 2, a decision for a branch never prepared), ``decision_unknown``
  (warning, committed but the log no longer covers it), ``coordinator_heuristic`` (warning, an
  unacknowledged heuristic report in the coordinator's log).

Plain (non-transactional) messages are never violations by themselves.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from notify.audit import formats
from notify.audit.carry import Carried, among, append_blocks, block, carried_findings, select
from notify.audit.coordinator import CoordinatorLog, read_coordinator_log
from notify.audit.findings import (
    FINDING_COLUMNS,
    SEVERITY,
    committed_findings,
    coordinator_findings,
    coordinator_table,
    empty_findings,
    log_findings,
    still_holding,
    stuck_findings,
    stuck_prepared,
    txlog_findings,
    visible_findings,
)
from notify.audit.matching import (
    expected_messages,
    expected_rows,
    match_conditions,
    match_messages,
    message_details,
    partition_messages,
    with_details,
)
from notify.audit.sources import LOG_FORMAT, TXLOG_FORMAT, register_sources
from notify.audit.state import TABLES, AuditState, forget_state, load_state, save_files
from notify.audit.transactions import incarnations, transactions, tx_partitions, tx_records

__all__ = [
    "FINDING_COLUMNS",
    "SEVERITY",
    "AuditInputs",
    "AuditResult",
    "audit",
]

HOUR_MS: Final = 3_600_000

Progress = Callable[[str], None]

#: the columns of ``notify-log`` the audit keeps (cached, and in the incremental state)
LOG_KEPT: Final = (
    "topic",
    "partition",
    "segment_start",
    "offset",
    "msg_id",
    "checksum",
    "checksum_ok",
    "size",
    "time_ms",
    "error",
)


#: the columns of ``notify-txlog`` the audit does not read (rebuilt from numbers, or unused)
TXLOG_DROPPED: Final = ("file", "type", "crc", "offset")


@dataclass
class AuditResult:
    """The audit's DataFrames (lazy until used; the inputs are cached).

    ``findings``: FINDING_COLUMNS, one row per problem. ``transactions``: one row per
    transaction incarnation. ``messages``: one row per message of a transaction, where it was
    expected and where it was found (None in an incremental run: it redoes only some).
    ``stuck_prepared``: prepared transactions past their
    timeout with their age. ``coordinator``: broker XA branches of the coordinator with its
    decision (None without a coordinator log). ``topic_hours`` / ``tx_hours``: counts per
    topic and hour (message-id time) and per hour and outcome. ``txlog``/``log``: the cached
    input rows (all but the columns rebuilt from numbers: file, type, crc, size, offset of the
    redo rows; file, flag, attribute of the messages); in an incremental run only the rows it
    checked again (``_new``: parsed now).
    """

    findings: DataFrame
    transactions: DataFrame
    messages: DataFrame | None
    stuck_prepared: DataFrame
    coordinator: DataFrame | None
    topic_hours: DataFrame
    tx_hours: DataFrame
    txlog: DataFrame
    log: DataFrame
    partitions: DataFrame
    now_ms: int
    tx_timeout_s: float | None
    inputs: dict[str, str | None] = field(default_factory=dict)
    coordinator_log: CoordinatorLog | None = None
    state: AuditState | None = None
    incremental: bool = False
    starts: dict[str, int] = field(default_factory=dict)
    #: per file key, the byte up to which this run read whole records (see ``save_state``)
    read_to: dict[str, int] = field(default_factory=dict)
    #: the redo records by kind (counted in the pass that counts the findings)
    txlog_kinds: dict[str, int] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    #: the message-id blocks this run matched again (None: all of them, a full run)
    blocks: list[int] | None = None
    #: the state's tables of this run (written by :meth:`state_writes`)
    _tables: dict[str, tuple[DataFrame, str | None, int]] = field(default_factory=dict, repr=False)
    _file_kinds: dict[int, dict[str, int]] = field(default_factory=dict, repr=False)
    _redo_nos: set[int] = field(default_factory=set, repr=False)
    _cached: list[DataFrame] = field(default_factory=list, repr=False)
    _state_run: int | None = field(default=None, repr=False)
    _state_written: set[str] = field(default_factory=set, repr=False)

    def read_stats(self) -> dict[str, int]:
        """What this run parsed from the files (rows, bytes) and what it took from the state
        (counted by :func:`audit` in the pass that counts the findings)."""
        return dict(self.stats)

    def state_writes(self) -> list[Callable[[], None]]:
        """The Parquet writes of this run's tables into the state directory (none without
        one; layout in :mod:`notify.audit.state`), to run beside the outputs' jobs
        (``write_outputs(also=...)``); those not run by then, :meth:`save_state` runs. A
        full run drops the earlier state here, ``files.json`` first: a run stopped before
        ``save_state`` leaves no state, and the next run reads everything."""
        st = self.state
        if st is None:
            return []
        if self._state_run is None:
            if not self.incremental:  # a full run starts the state again
                forget_state(st)
                for table in TABLES:  # only the state's own tables: --state may be any dir
                    shutil.rmtree(st.path / table, ignore_errors=True)
                st.runs = 0
            self._state_run = st.runs + 1
        run = self._state_run

        def write(name: str) -> None:
            df, by, files = self._tables[name]
            w = (df.coalesce(files) if files else df).write.mode("overwrite")
            (w.partitionBy(by) if by else w).parquet(str(st.run_dir(name, run)))
            self._state_written.add(name)

        return [partial(write, n) for n in self._tables if n not in self._state_written]

    def save_state(self) -> None:
        """Record this run in the state directory (no-op without one): its tables (unless
        :meth:`state_writes` wrote them already), how far each file was read, and the
        earlier runs' tables this run replaced dropped. Call it once the outputs are
        written."""
        st = self.state
        if st is None:
            return
        for write in self.state_writes():
            write()
        assert self._state_run is not None
        consumed = dict(self.starts) | self.read_to
        txlog_dir, data = self.inputs["txlog"], self.inputs["data"]
        assert txlog_dir is not None and data is not None
        forget_state(st)  # the tables change below: no state until files.json says so
        redone = set(self.blocks or [])
        st.prune(self._state_run, {"log": redone, "keys": redone}, self._redo_nos)
        save_files(st, txlog_dir, data, consumed, self._file_kinds)
        st.runs += 1
        self._state_run = None
        self._state_written.clear()

    def finding_counts(self) -> dict[str, int]:
        """``{check: rows}`` of the findings (checks with no row are left out)."""
        return {
            r["check"]: int(r["count"]) for r in self.findings.groupBy("check").count().collect()
        }

    def violations(self, counts: dict[str, int] | None = None) -> int:
        """Number of findings whose severity is ``violation``."""
        counts = self.finding_counts() if counts is None else counts
        return sum(n for c, n in counts.items() if SEVERITY.get(c) == "violation")

    def unpersist(self) -> None:
        """Drop the cached inputs (and the checkpointed rows of an incremental run)."""
        for df in self._cached:
            plan = df._jdf.queryExecution().analyzed()
            if plan.getClass().getSimpleName() == "LogicalRDD":  # localCheckpoint()
                plan.rdd().unpersist(False)
            else:
                df.unpersist()
        self._cached.clear()


class Cache:
    """What one audit caches (``persist``), to unpersist together (``dfs``); with
    ``enabled`` False, :meth:`keep` returns its argument as it is."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.dfs: list[DataFrame] = []

    def keep(self, df: DataFrame) -> DataFrame:
        """``df`` persisted in memory (deserialized, spilling to disk), when enabled."""
        if self.enabled:
            df = df.persist(StorageLevel.MEMORY_AND_DISK_DESER)
            self.dfs.append(df)
        return df


# ---------------------------------------------------------------------------- inputs


@dataclass
class AuditInputs:
    """The files an audit reads, listed once on the driver, and how it reads them.

    ``starts``: per file key, the byte an incremental run starts it at (the bytes a
    state recorded as read; empty for a full run). ``incremental``: a usable state is
    read back (its ``why_full`` says why not, when it was not)."""

    txlog_dir: Path
    data: str
    redo_files: list[formats.TxlogFile]
    segments: list[formats.SegmentFile]
    state: AuditState | None
    incremental: bool
    starts: dict[str, int]

    @property
    def newest_redo(self) -> int:
        """The newest redo file's number (-1: none)."""
        return max((f.file_no for f in self.redo_files), default=-1)

    @property
    def redo_paths(self) -> dict[int, str]:
        """Redo file number to file key."""
        return {x.file_no: x.key for x in self.redo_files}

    @property
    def redo_nos(self) -> set[int]:
        """The numbers of the redo files on disk."""
        return {x.file_no for x in self.redo_files}

    @property
    def segment_paths(self) -> dict[tuple[str, int, int], str]:
        """``(topic, partition, segment start)`` to file key."""
        return {(x.topic, x.partition, x.start): x.key for x in self.segments}


def list_inputs(
    txlog: str | Path,
    data: str | Path,
    state: str | Path | None = None,
    full: bool = False,
) -> AuditInputs:
    """List the redo files (``txlog``: the redo log directory, or a dataPath holding
    ``transactions``) and the segments of ``data``, and decide whether the run is
    incremental: with a ``state`` directory that fits these inputs, unless ``full`` or a
    file is now shorter than what an earlier run read (rewritten: the run reads
    everything, and ``state.why_full`` says why)."""
    data_s = str(data)
    txlog_dir = formats.txlog_dir(str(txlog))
    redo_files = formats.find_txlog_files(txlog_dir, checkpoint=False)
    segments = formats.find_segments(data_s)
    st = load_state(state, str(txlog_dir), data_s) if state is not None else None
    sizes = {x.key: x.size for x in redo_files} | {s.key: s.size for s in segments}
    if st is not None and st.usable and not full:
        shrunk = sorted(p for p, c in st.consumed.items() if p in sizes and sizes[p] < c)
        if shrunk:
            st.why_full = f"{shrunk[0]} is shorter than what an earlier run read"
    incremental = st is not None and st.usable and not full
    starts = {p: c for p, c in st.consumed.items() if p in sizes} if st and incremental else {}
    return AuditInputs(txlog_dir, data_s, redo_files, segments, st, incremental, starts)


def partition_table(spark: SparkSession, segments: list[formats.SegmentFile]) -> DataFrame:
    """Partitions on disk from the driver's listing (``segments``): first offset, end,
    segments, bytes and the newest segment's start (``last_start``)."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for seg in segments:
        k = (seg.topic, seg.partition)
        r = rows.setdefault(
            k,
            {
                "topic": seg.topic,
                "partition": seg.partition,
                "min_offset": seg.start,
                "end_offset": 0,
                "segments": 0,
                "bytes": 0,
                "last_start": seg.start,
            },
        )
        r["min_offset"] = min(r["min_offset"], seg.start)
        r["end_offset"] = max(r["end_offset"], seg.start + seg.size)
        r["segments"] += 1
        r["bytes"] += seg.size
        if seg.last:
            r["last_start"] = seg.start
    schema = StructType(
        [
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("min_offset", LongType()),
            StructField("end_offset", LongType()),
            StructField("segments", IntegerType()),
            StructField("bytes", LongType()),
            StructField("last_start", LongType()),
        ]
    )
    return spark.createDataFrame(
        [tuple(r[f.name] for f in schema.fields) for r in rows.values()], schema
    )


def read_rows(spark: SparkSession, inputs: AuditInputs) -> tuple[DataFrame, DataFrame]:
    """The rows parsed now (lazy): the redo rows (all columns but :data:`TXLOG_DROPPED`)
    and the partitions' records (:data:`LOG_KEPT`), each file from its ``starts`` byte."""
    register_sources(spark)
    starts = json.dumps(inputs.starts)
    txlog_kept = [n for n, _t in formats.TXLOG_COLUMNS if n not in TXLOG_DROPPED]
    T_new = (
        spark.read.format(TXLOG_FORMAT)
        .option("starts", starts)
        .option("columns", ",".join(txlog_kept))
        .load(str(inputs.txlog_dir))
    )
    M_new = (
        spark.read.format(LOG_FORMAT)
        .option("starts", starts)
        .option("columns", ",".join(LOG_KEPT))
        .load(inputs.data)
        .select(*LOG_KEPT)
    )
    return T_new, M_new


def choose_rows(
    spark: SparkSession,
    inputs: AuditInputs,
    T_new: DataFrame,
    M_new: DataFrame,
    cache: Cache,
    say: Progress,
) -> tuple[DataFrame, DataFrame, Carried | None]:
    """The redo rows and records this run checks, with ``_new`` (parsed now), and what an
    incremental run carries (:func:`notify.audit.carry.select`; None in a full run).

    The redo rows are cached partitioned by transaction key (one shuffle as they are read):
    every aggregate and join of the transactions is keyed by ``tx_key`` (and more), so with
    co-partitioning on the key alone they need no further exchange; this sets
    ``spark.sql.requireAllClusterKeysForCoPartition=false`` on ``spark``."""
    carried: Carried | None = None
    st = inputs.state
    if inputs.incremental and st is not None:
        # the rows parsed now (cached: the selection reads them, then the checks), the
        # earlier rows of the keys and blocks they touch, and what the rest carries
        say("choosing what to check again")
        seg_keys = spark.createDataFrame(
            [(s.topic, s.partition, s.start) for s in inputs.segments],
            "topic string, partition int, segment_start long",
        )
        keep = cache.keep
        carried = select(spark, st, keep(T_new), keep(M_new), inputs.redo_nos, seg_keys)
        cache.dfs += carried.cached
        say(
            f"checking again {carried.stats['keys_redone']:,} transaction keys "
            f"({carried.stats['keys_changed']:,} changed) and {len(carried.blocks)} id blocks"
        )
        T_new, M_new = carried.T, carried.M
    else:
        T_new = T_new.withColumn("_new", F.lit(True))
        M_new = M_new.withColumn("_new", F.lit(True))
    spark.conf.set("spark.sql.requireAllClusterKeysForCoPartition", "false")
    if carried is not None and cache.enabled:
        # an incremental run's rows come from a deep plan (the state's tables, the keys and
        # blocks chosen): checkpointed, every query below starts from a leaf rather than
        # analyzing that plan again (a small audit's driver spent 20 s on it)
        ck = StorageLevel.MEMORY_AND_DISK
        T = T_new.repartition("tx_key").localCheckpoint(True, ck)
        M = M_new.localCheckpoint(True, ck)
        cache.dfs += [T, M]
        return T, M, carried
    return cache.keep(T_new.repartition("tx_key")), cache.keep(M_new), carried


# ---------------------------------------------------------------------------- counting

Counted = tuple[dict[str, int], dict[str, int], list[Row]]


def count_rows(
    name: str, src: DataFrame, conds: dict[str, Column], keys: list[str], place: str
) -> Counted:
    """One pass over ``src``: how many rows each of ``conds`` holds, what this run parsed
    and took from the state (``name`` ``txlog``/``log``: ``<name>_rows_read``,
    ``<name>_bytes_read``, ``<name>_rows_from_state``) and, per ``keys`` (a file), how far
    this run's rows reach: the first broken record (``_bad``) or the end of the last whole
    one (``_end``), at ``place`` (the consumed bytes the state records). Returns
    ``(found, read, rows)``, ``rows`` the per-``keys`` rows."""
    extra = []
    if name:
        new_row = F.col("_new")
        broken = F.col("kind") == "CORRUPT" if name == "txlog" else F.col("error").isNotNull()
        extra = [
            F.count(F.when(new_row, 1)).alias("_rows_read"),
            F.coalesce(F.sum(F.when(new_row, F.col("size"))), F.lit(0)).alias("_bytes_read"),
            F.count(F.when(~new_row, 1)).alias("_rows_from_state"),
            F.min(F.when(new_row & broken, F.col(place))).alias("_bad"),
            F.max(F.when(new_row & ~broken, F.col(place) + F.col("size"))).alias("_end"),
        ]
    aggs = [F.count(F.when(c, 1)).alias(k) for k, c in conds.items()]
    rows = src.groupBy(*keys).agg(*aggs, *extra).collect()
    read = ("_rows_read", "_bytes_read", "_rows_from_state") if name else ()
    found = {k: sum(int(r[k]) for r in rows) for k in conds}
    return found, {name + k: sum(int(r[k]) for r in rows) for k in read}, rows


def log_conditions() -> dict[str, Column]:
    """What the partitions' counting pass counts: ``checksum_mismatch`` (a record parsed
    now whose payload does not match its CRC: the rows read back from the state carry
    their findings) and ``segment_error`` (framing errors)."""
    return {
        "checksum_mismatch": F.col("_new") & F.col("msg_id").isNotNull() & ~F.col("checksum_ok"),
        "segment_error": F.col("error").isNotNull(),
    }


def txlog_conditions() -> dict[str, Column]:
    """What the redo rows' counting pass counts: ``corrupt`` (CORRUPT rows) and
    ``txlog_undecodable`` (a record parsed now whose body did not decode)."""
    return {
        "corrupt": F.col("kind") == "CORRUPT",
        "txlog_undecodable": F.col("_new")
        & (F.col("kind") != "CORRUPT")
        & F.col("error").isNotNull(),
    }


def start_log_pass(M: DataFrame) -> Future[Counted]:
    """The partitions' counting pass (:func:`log_conditions`, per segment), started in a
    thread now: it does not depend on the transactions, and its tasks fill the cores (and
    cache ``M``) while the driver plans the rest."""
    early = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-log")
    log_pass = early.submit(
        count_rows, "log", M, log_conditions(), ["topic", "partition", "segment_start"], "offset"
    )
    early.shutdown(wait=False)
    return log_pass


@dataclass
class Counts:
    """The counting passes' results: rows per check (``found``), what was read (``stats``),
    and the per-file rows of the redo and partition passes."""

    found: dict[str, int]
    stats: dict[str, int]
    txlog_rows: list[Row]
    log_rows: list[Row]


def count_findings(
    matched: DataFrame, m_conds: dict[str, Column], T: DataFrame, log_pass: Future[Counted]
) -> Counts:
    """Count what each check would find: the matched messages (``m_conds``) and the redo
    rows ``T`` (:func:`txlog_conditions`, per file and kind) in two jobs submitted at once,
    then the partitions' pass started earlier (``log_pass``). Only checks with something
    to report are built after this: a clean audit does no more scans, and no second join
    with the partitions."""
    found: dict[str, int] = {}
    stats: dict[str, int] = {}
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="audit-count") as pool:
        m_pass = pool.submit(count_rows, "", matched, m_conds, [], "")
        t_pass = pool.submit(
            count_rows, "txlog", T, txlog_conditions(), ["file_no", "kind"], "position"
        )
        for done in (m_pass, t_pass, log_pass):
            n, read_now, _rows = done.result()
            found.update(n)
            stats.update(read_now)
    return Counts(found, stats, t_pass.result()[2], log_pass.result()[2])


@dataclass
class Reach:
    """How far this run read each file (``read_to``: file key to the first broken record,
    else the end of the last whole one), and the redo records by kind: all of them
    (``kinds``, for the summary) and per redo file (``file_kinds``, for the state)."""

    read_to: dict[str, int]
    kinds: dict[str, int]
    file_kinds: dict[int, dict[str, int]]


def read_reach(
    txlog_rows: list[Any],
    log_rows: list[Any],
    inputs: AuditInputs,
    carried_kinds: dict[int, dict[str, int]] | None = None,
) -> Reach:
    """The :class:`Reach` of the counting passes' per-file rows (``txlog_rows``: per
    ``file_no, kind`` with ``_rows_read``, ``_bad``, ``_end`` at redo positions;
    ``log_rows``: per ``topic, partition, segment_start``, at partition offsets), with the
    per-file kinds an incremental run carries (``carried_kinds``). CORRUPT rows and the
    checkpoint's are parsed again every run: counted in ``kinds`` but not per file."""
    reach: dict[str, tuple[int | None, int | None]] = {}

    def reached(path: str | None, bad: int | None, end: int | None, base: int = 0) -> None:
        if path is None:
            return
        b0, e0 = reach.get(path, (None, None))
        if bad is not None:
            b0 = bad - base if b0 is None else min(b0, bad - base)
        if end is not None:
            e0 = end - base if e0 is None else max(e0, end - base)
        reach[path] = (b0, e0)

    redo_paths, seg_paths = inputs.redo_paths, inputs.segment_paths
    kinds: dict[str, int] = {}
    file_kinds = {k: dict(v) for k, v in (carried_kinds or {}).items()}
    for r in txlog_rows:
        kind, n = r["kind"], int(r["_rows_read"])
        if r["file_no"] >= 0 and kind != "CORRUPT":
            fk = file_kinds.setdefault(int(r["file_no"]), {})
            fk[kind] = fk.get(kind, 0) + n
        else:
            kinds[kind] = kinds.get(kind, 0) + n
        if r["file_no"] >= 0:
            reached(redo_paths.get(int(r["file_no"])), r["_bad"], r["_end"])
    for fk in file_kinds.values():
        for kind, n in fk.items():
            kinds[kind] = kinds.get(kind, 0) + n
    for r in log_rows:
        at = (r["topic"], r["partition"], r["segment_start"])
        reached(seg_paths.get(at), r["_bad"], r["_end"], int(r["segment_start"]))
    read_to = {p: b if b is not None else e for p, (b, e) in reach.items()}
    return Reach({p: at for p, at in read_to.items() if at is not None}, kinds, file_kinds)


# ---------------------------------------------------------------------------- counts


def segment_hours(M: DataFrame, carried: DataFrame | None = None) -> DataFrame:
    """Messages per segment, hour (of the message id's time) and id block, with bytes and
    first/last time; ``carried``: an incremental run's rows of the blocks it does not
    redo."""
    rows = (
        M.filter(F.col("msg_id").isNotNull())
        .groupBy(
            "topic",
            "partition",
            "segment_start",
            (F.floor(F.col("time_ms") / HOUR_MS) * HOUR_MS).alias("hour_ms"),
            block("msg_id").alias("blk"),
        )
        .agg(
            F.count("*").alias("messages"),
            F.sum("size").alias("bytes"),
            F.min("time_ms").alias("first_ms"),
            F.max("time_ms").alias("last_ms"),
        )
    )
    return rows if carried is None else rows.unionByName(carried)


def topic_hours(seg_hours: DataFrame) -> DataFrame:
    """Messages and bytes per topic and hour (of :func:`segment_hours`)."""
    return seg_hours.groupBy("topic", "hour_ms").agg(
        F.sum("messages").alias("messages"),
        F.sum("bytes").alias("bytes"),
        F.min("first_ms").alias("first_ms"),
        F.max("last_ms").alias("last_ms"),
    )


def tx_hours(tx: DataFrame) -> DataFrame:
    """Transactions and their messages per hour (decided, else first message) and
    outcome."""
    return (
        tx.withColumn(
            "hour_ms",
            F.floor(F.coalesce("decided_at_ms", "first_msg_ms") / HOUR_MS) * HOUR_MS,
        )
        .groupBy("hour_ms", "outcome")
        .agg(F.count("*").alias("transactions"), F.sum("messages").alias("messages"))
    )


def state_tables(
    T: DataFrame,
    M: DataFrame,
    tx_state: DataFrame,
    seg_hours: DataFrame,
    findings: DataFrame,
    blocks: list[int] | None,
) -> dict[str, tuple[DataFrame, str | None, int]]:
    """The state's tables of this run, ``{name: (rows, partitioned by, files)}`` (written
    by :meth:`AuditResult.state_writes`; layout in :mod:`notify.audit.state`): the redo
    rows parsed now by file, every record of the blocks matched now (``blocks``; None: all)
    and their keys by block, and the whole tables a later run carries."""
    keys = append_blocks(T, "tx_key")
    if blocks is not None:
        keys = keys.filter(among(F.col("blk"), blocks))
    return {
        "txlog": (
            T.filter(
                F.col("_new")
                & (F.col("file_no") >= 0)
                & ~F.col("kind").isin("CORRUPT", "CHECKPOINT")
            ).drop("_new"),
            "file_no",
            0,
        ),
        "log": (
            M.filter(F.col("msg_id").isNotNull() & F.col("error").isNull())
            .drop("_new")
            .withColumn("blk", block("msg_id")),
            "blk",
            0,
        ),
        "keys": (keys.distinct(), "blk", 0),
        "tx": (tx_state, None, 4),
        "hours": (seg_hours, None, 1),
        "findings": (carried_findings(findings), None, 1),
    }


def _union(dfs: list[DataFrame]) -> DataFrame:
    out = dfs[0]
    for df in dfs[1:]:
        out = out.unionByName(df)
    return out


# ---------------------------------------------------------------------------- the audit


def audit(
    spark: SparkSession,
    txlog: str | Path,
    data: str | Path,
    coordinator_log: str | Path | None = None,
    tx_timeout_s: float | None = None,
    now_ms: int | None = None,
    progress: Progress | None = None,
    cache: bool = True,
    state: str | Path | None = None,
    full: bool = False,
) -> AuditResult:
    """Audit a broker's committed transactions against its partitions.

    ``txlog``: the redo log directory (or the dataLogPath/dataPath holding ``transactions``);
    ``data``: the broker's dataPath; ``coordinator_log``: an XA coordinator's decision log;
    ``tx_timeout_s``: how long a transaction may stay prepared (default: the timeout logged
    with its PREPARE); ``now_ms``: the audit's clock (default: now). Returns lazy DataFrames
    over cached inputs; nothing is computed until they are used. Sets
    ``spark.sql.requireAllClusterKeysForCoPartition=false`` on ``spark``: the redo rows are
    cached partitioned by transaction key and the per-transaction joins rely on it.

    ``state``: a directory (:mod:`notify.audit.state`) making the audit incremental: only the
    bytes added to the files since the runs recorded there are parsed, the earlier runs'
    rows are read back from it; :meth:`AuditResult.save_state` records this run. ``full``
    ignores what the state holds (and ``save_state`` starts it again).

    The stages: the inputs (:func:`list_inputs`, :func:`read_rows`, :func:`choose_rows`),
    the transactions (:mod:`notify.audit.transactions`), the message matching
    (:mod:`notify.audit.matching`), the counting passes (:func:`count_findings`,
    :func:`read_reach`), the findings (:mod:`notify.audit.findings`), the counts per hour
    and the state's tables (:func:`state_tables`).
    """
    say = progress or (lambda _m: None)
    now = int(time.time() * 1000) if now_ms is None else int(now_ms)
    cached = Cache(cache)
    keep = cached.keep
    say("listing files")
    inputs = list_inputs(txlog, data, state, full)
    parts = partition_table(spark, inputs.segments)
    st = inputs.state
    if inputs.incremental:
        say(f"incremental: {len(inputs.starts)} files read before, {st.runs if st else 0} runs")
    T_new, M_new = read_rows(spark, inputs)
    T, M, carried = choose_rows(spark, inputs, T_new, M_new, cached, say)
    log_pass = start_log_pass(M)

    # transactions, then the messages each one logged matched with the partitions' records
    base = tx_records(T)
    agg, base_i = incarnations(base, keep, say)
    tp = keep(tx_partitions(base_i))
    tx = keep(transactions(agg, tp))
    # every transaction: the ones aggregated now, and those an incremental run carries
    # (``_last_file_no``: the newest redo file of the key, for a later run's reading)
    tx_state = tx
    if carried is not None and carried.tx is not None:
        tx_state = keep(tx.unionByName(carried.tx))
    tx_all = tx_state.drop("_last_file_no")
    say("matching transaction messages")
    E_rows = expected_rows(base_i, tp, tx, parts)
    narrow = expected_messages(E_rows, None if carried is None else carried.blocks)
    A = partition_messages(M)
    matched = keep(match_messages(narrow, A))
    details = message_details(E_rows)
    messages = None if carried is not None else with_details(details, matched, small=False)

    say("collecting findings")
    m_conds = match_conditions()
    say("counting findings")
    counts = count_findings(matched, m_conds, T, log_pass)
    probe = counts.found
    reach = read_reach(
        counts.txlog_rows, counts.log_rows, inputs, carried.kinds if carried else None
    )
    f_list = committed_findings(matched, details, m_conds, probe)
    f_list += visible_findings(
        matched, details, A, m_conds["uncommitted_visible"], probe["uncommitted_visible"]
    )
    f_list += log_findings(
        M,
        parts,
        str(Path(inputs.data)),
        log_conditions()["checksum_mismatch"],
        probe["checksum_mismatch"],
        probe["segment_error"],
    )
    f_list += txlog_findings(
        T,
        str(inputs.txlog_dir),
        inputs.newest_redo,
        txlog_conditions()["txlog_undecodable"],
        probe["corrupt"],
        probe["txlog_undecodable"],
    )
    stuck = stuck_prepared(tx_all, now, tx_timeout_s)
    f_list.append(stuck_findings(stuck))
    coord_df: DataFrame | None = None
    clog: CoordinatorLog | None = None
    if coordinator_log is not None:
        say("reading the coordinator log")
        clog = read_coordinator_log(coordinator_log)
        coord_df = coordinator_table(spark, clog, tx_all)
        f_list += coordinator_findings(spark, clog, coord_df)
    if carried is not None and carried.findings is not None:
        f_list.append(still_holding(carried.findings, parts))
    findings = keep(_union([empty_findings(spark), *f_list]))

    # small tables, written and summarized: kept once computed
    seg_hours = keep(segment_hours(M, carried.hours if carried else None))
    tables = {}
    if st is not None:
        blocks = None if carried is None else carried.blocks
        tables = state_tables(T, M, tx_state, seg_hours, findings, blocks)
    return AuditResult(
        findings=findings,
        transactions=tx_all,
        messages=messages,
        stuck_prepared=stuck,
        coordinator=coord_df,
        topic_hours=keep(topic_hours(seg_hours)),
        tx_hours=keep(tx_hours(tx_all)),
        txlog=T,
        log=M,
        partitions=parts,
        now_ms=now,
        tx_timeout_s=tx_timeout_s,
        inputs={
            "txlog": str(inputs.txlog_dir),
            "data": inputs.data,
            "coordinator_log": None if coordinator_log is None else str(coordinator_log),
        },
        coordinator_log=clog,
        state=st,
        incremental=inputs.incremental,
        starts=inputs.starts,
        read_to=reach.read_to,
        txlog_kinds=reach.kinds,
        stats=counts.stats | (carried.stats if carried else {}),
        blocks=None if carried is None else carried.blocks,
        _tables=tables,
        _file_kinds=reach.file_kinds,
        _redo_nos=inputs.redo_nos,
        _cached=cached.dfs,
    )
