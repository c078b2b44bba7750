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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from notify.audit import formats
from notify.audit.carry import (
    Carried,
    among,
    append_blocks,
    block,
    carried_findings,
    select,
)
from notify.audit.coordinator import CoordinatorLog, read_coordinator_log
from notify.audit.sources import LOG_FORMAT, TXLOG_FORMAT, register_sources
from notify.audit.state import TABLES, AuditState, forget_state, load_state, save_files

__all__ = [
    "FINDING_COLUMNS",
    "SEVERITY",
    "AuditResult",
    "audit",
]

HOUR_MS: Final = 3_600_000
TX_KINDS: Final = ("APPEND_MSG", "PREPARE", "COMMIT", "ROLLBACK", "APPLIED", "HEURISTIC", "FORGET")
FINAL_KINDS: Final = ("APPLIED", "ROLLBACK", "HEURISTIC", "FORGET")
#: the kinds whose string columns the transactions table takes (aggregated apart)
NAMED_KINDS: Final = ("HEURISTIC", "PREPARE", "ROLLBACK")
UNCOMMITTED: Final = ("rolled_back", "heuristic_rollback", "prepared", "active")

#: severity of every check
SEVERITY: Final[dict[str, str]] = {
    "committed_missing": "violation",
    "committed_duplicate": "violation",
    "committed_misplaced": "violation",
    "committed_checksum_differs": "violation",
    "uncommitted_visible": "violation",
    "checksum_mismatch": "violation",
    "segment_corrupt": "violation",
    "segment_torn_tail": "warning",
    "txlog_corrupt": "violation",
    "txlog_torn_tail": "warning",
    "txlog_undecodable": "violation",
    "checkpoint_damaged": "warning",
    "stuck_prepared": "violation",
    "heuristic_mismatch": "violation",
    "decision_unknown": "warning",
    "coordinator_heuristic": "warning",
    "coordinator_log_corrupt": "warning",
}

FINDING_COLUMNS: Final[list[tuple[str, Any]]] = [
    ("check", StringType()),
    ("severity", StringType()),
    ("tx_key", StringType()),
    ("topic", StringType()),
    ("partition", IntegerType()),
    ("offset", LongType()),
    ("msg_id", LongType()),
    ("file", StringType()),
    ("position", LongType()),
    ("detail", StringType()),
]

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


def _lit(v: Any, t: Any) -> Column:
    return F.lit(v).cast(t)


def _findings(df: DataFrame, check: str, **cols: Column) -> DataFrame:
    out = [F.lit(check).alias("check"), F.lit(SEVERITY[check]).alias("severity")]
    for name, t in FINDING_COLUMNS[2:]:
        c = cols.get(name)
        out.append((c if c is not None else _lit(None, t)).cast(t).alias(name))
    return df.select(*out)


def _empty_findings(spark: SparkSession) -> DataFrame:
    schema = StructType([StructField(n, t) for n, t in FINDING_COLUMNS])
    return spark.createDataFrame([], schema)


def _union_cond(conds: list[Column]) -> Column:
    out = conds[0]
    for c in conds[1:]:
        out = out | c
    return out


def _union(dfs: list[DataFrame]) -> DataFrame:
    out = dfs[0]
    for df in dfs[1:]:
        out = out.unionByName(df)
    return out


def _partition_table(spark: SparkSession, data: str) -> DataFrame:
    """Partitions on disk from a driver-side listing: first offset, end and newest file."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for seg in formats.find_segments(data):
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
    """
    say = progress or (lambda _m: None)
    now = int(time.time() * 1000) if now_ms is None else int(now_ms)
    register_sources(spark)
    txlog_s, data_s = str(txlog), str(data)
    cached: list[DataFrame] = []

    def keep(df: DataFrame) -> DataFrame:
        if cache:
            df = df.persist(StorageLevel.MEMORY_AND_DISK_DESER)
            cached.append(df)
        return df

    say("listing files")
    txlog_dir = formats.txlog_dir(txlog_s)
    redo_files = formats.find_txlog_files(txlog_dir, checkpoint=False)
    newest_redo = max((f.file_no for f in redo_files), default=-1)
    redo_paths = {x.file_no: x.key for x in redo_files}
    parts = _partition_table(spark, data_s)

    # raw rows (lazy), and the columns the checks use, cached: file names are rebuilt from
    # numbers rather than cached once per row
    seg_files = formats.find_segments(data_s)
    seg_paths = {(x.topic, x.partition, x.start): x.key for x in seg_files}
    st = load_state(state, str(txlog_dir), data_s) if state is not None else None
    sizes = {x.key: x.size for x in redo_files} | {s.key: s.size for s in seg_files}
    if st is not None and st.usable and not full:
        shrunk = sorted(p for p, c in st.consumed.items() if p in sizes and sizes[p] < c)
        if shrunk:
            st.why_full = f"{shrunk[0]} is shorter than what an earlier run read"
    incremental = st is not None and st.usable and not full
    starts = {p: c for p, c in st.consumed.items() if p in sizes} if st and incremental else {}
    if incremental:
        say(f"incremental: {len(starts)} files read before, {st.runs if st else 0} runs")
    txlog_kept = [n for n, _t in formats.TXLOG_COLUMNS if n not in TXLOG_DROPPED]
    T_new = (
        spark.read.format(TXLOG_FORMAT)
        .option("starts", json.dumps(starts))
        .option("columns", ",".join(txlog_kept))
        .load(str(txlog_dir))
    )
    M_new = (
        spark.read.format(LOG_FORMAT)
        .option("starts", json.dumps(starts))
        .option("columns", ",".join(LOG_KEPT))
        .load(data_s)
        .select(*LOG_KEPT)
    )
    redo_nos = {x.file_no for x in redo_files}
    carried: Carried | None = None
    if incremental and st is not None:
        # the rows parsed now (cached: the selection reads them, then the checks), the
        # earlier rows of the keys and blocks they touch, and what the rest carries
        say("choosing what to check again")
        seg_keys = spark.createDataFrame(
            [(s.topic, s.partition, s.start) for s in seg_files],
            "topic string, partition int, segment_start long",
        )
        carried = select(spark, st, keep(T_new), keep(M_new), redo_nos, seg_keys)
        cached += carried.cached
        say(
            f"checking again {carried.stats['keys_redone']:,} transaction keys "
            f"({carried.stats['keys_changed']:,} changed) and {len(carried.blocks)} id blocks"
        )
        T_new, M_new = carried.T, carried.M
    else:
        T_new = T_new.withColumn("_new", F.lit(True))
        M_new = M_new.withColumn("_new", F.lit(True))
    # the redo rows are cached partitioned by transaction key (one shuffle as they are read):
    # every aggregate and join of the transactions below is keyed by tx_key (and more), so
    # with co-partitioning on the key alone they need no further exchange
    spark.conf.set("spark.sql.requireAllClusterKeysForCoPartition", "false")
    if carried is not None and cache:
        # an incremental run's rows come from a deep plan (the state's tables, the keys and
        # blocks chosen): checkpointed, every query below starts from a leaf rather than
        # analyzing that plan again (a small audit's driver spent 20 s on it)
        ck = StorageLevel.MEMORY_AND_DISK
        T = T_new.repartition("tx_key").localCheckpoint(True, ck)
        M = M_new.localCheckpoint(True, ck)
        cached += [T, M]
    else:
        T = keep(T_new.repartition("tx_key"))
        M = keep(M_new)

    def count(
        name: str, src: DataFrame, conds: dict[str, Column], keys: list[str], place: str
    ) -> tuple[dict[str, int], dict[str, int], list[Any]]:
        """One pass over ``src``: how many rows each of ``conds`` holds, what this run parsed
        and took from the state (``name`` ``txlog``/``log``) and, per ``keys`` (a file), how
        far this run's rows reach: the first broken record (``bad``) or the end of the last
        whole one (``end``), at ``place`` (the consumed bytes the state records)."""
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

    log_conds = {
        # row by row: the rows read back from the state carry their findings
        "checksum_mismatch": F.col("_new") & F.col("msg_id").isNotNull() & ~F.col("checksum_ok"),
        "segment_error": F.col("error").isNotNull(),
    }
    # the partitions' rows do not depend on the transactions: their counting pass (which
    # caches them) starts now, and its tasks fill the cores while the driver plans the rest
    early = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-log")
    log_pass = early.submit(
        count, "log", M, log_conds, ["topic", "partition", "segment_start"], "offset"
    )
    early.shutdown(wait=False)
    redo_file = F.when(
        F.col("file_no") >= 0,
        F.concat(F.lit(str(txlog_dir) + "/redo."), F.col("file_no").cast("string")),
    ).otherwise(F.lit(str(txlog_dir) + "/checkpoint"))
    seg_file = F.format_string(
        "%s/%s-%d/%020d.meta",
        F.lit(str(Path(data_s))),
        F.col("topic"),
        F.col("partition"),
        F.col("segment_start"),
    )

    # ---------------------------------------------------------------- transactions
    # incarnations: an APPEND_MSG right after a final record starts a new one. Almost every
    # key has one incarnation: it is aggregated by key alone, with fixed-width buffers only
    # (hash aggregation, combined map-side; no lists of messages carried through the
    # shuffle); only keys with an APPEND_MSG after a final record are redone over a window.
    # The messages are exploded from the APPEND_MSG rows themselves, joined with what the
    # transaction and its placements say.
    base = T.filter(F.col("kind").isin(*TX_KINDS) & F.col("tx_key").isNotNull()).select(
        "tx_key",
        "file_no",
        "position",
        "kind",
        "time_ms",
        "topic",
        "partition",
        "msg_count",
        "msg_ids",
        "checksums",
        "sizes",
        "placements",
        "hints",
        "timeout_s",
        "producer_group",
        "reason",
        "outcome",
    )
    pos_code = F.col("file_no") * F.lit(1 << 40) + F.col("position")

    def when_kind(kind: str, c: str | Column) -> Column:
        return F.when(F.col("kind") == kind, F.col(c) if isinstance(c, str) else c)

    def has(kind: str) -> Column:
        return F.coalesce(F.max(F.col("kind") == kind), F.lit(False))

    sizes_sum = F.aggregate("sizes", F.lit(0).cast("long"), lambda a, x: a + x)
    placed_sum = F.aggregate(
        "placements", F.lit(0).cast("long"), lambda acc, p: acc + p["count"].cast("long")
    )
    # fixed-width buffers only (a string max would make the whole aggregate sort-based):
    # the string columns come from the few PREPARE/ROLLBACK/HEURISTIC rows, aggregated
    # apart and joined back
    fixed_aggs = [
        has("COMMIT").alias("has_commit"),
        has("APPLIED").alias("has_applied"),
        has("ROLLBACK").alias("has_rollback"),
        has("PREPARE").alias("has_prepare"),
        has("APPEND_MSG").alias("has_append"),
        F.min(pos_code).alias("_first"),
        F.max("file_no").alias("_last_file_no"),
        F.min(when_kind("APPEND_MSG", "time_ms")).alias("first_msg_ms"),
        F.max(when_kind("PREPARE", "time_ms")).alias("prepared_at_ms"),
        F.max(when_kind("PREPARE", "timeout_s")).alias("timeout_s"),
        F.max(when_kind("COMMIT", "time_ms")).alias("committed_at_ms"),
        F.coalesce(F.sum(when_kind("APPEND_MSG", F.size("msg_ids"))), F.lit(0))
        .cast("long")
        .alias("n_ids"),
        F.coalesce(F.sum(when_kind("APPEND_MSG", "msg_count")), F.lit(0))
        .cast("long")
        .alias("messages"),
        F.coalesce(F.sum(when_kind("APPEND_MSG", sizes_sum)), F.lit(0)).cast("long").alias("bytes"),
        F.count("*").alias("records"),
        F.coalesce(F.sum(when_kind("APPLIED", placed_sum)), F.lit(0)).cast("long").alias("_placed"),
    ]
    string_aggs = [
        F.max(when_kind("HEURISTIC", "outcome")).alias("heuristic"),
        F.max(when_kind("PREPARE", "producer_group")).alias("producer_group"),
        F.max(when_kind("ROLLBACK", "reason")).alias("rollback_reason"),
    ]
    agg_order = [
        "has_commit",
        "has_applied",
        "has_rollback",
        "has_prepare",
        "has_append",
        "heuristic",
        "_first",
        "_last_file_no",
        "first_msg_ms",
        "prepared_at_ms",
        "timeout_s",
        "producer_group",
        "committed_at_ms",
        "rollback_reason",
        "n_ids",
        "messages",
        "bytes",
        "records",
        "_placed",
    ]

    def tx_aggregate(rows: DataFrame, keys: list[str], *more: Column) -> DataFrame:
        fixed = rows.groupBy(*keys).agg(*fixed_aggs, *more)
        named = rows.filter(F.col("kind").isin(*NAMED_KINDS))
        strings = named.groupBy(*keys).agg(*string_aggs)
        extra = ["_reused"] if more else []
        return fixed.join(strings, keys, "left").select(*keys, *agg_order, *extra)

    reused = (
        F.max(when_kind("APPEND_MSG", pos_code))
        > F.min(F.when(F.col("kind").isin(*FINAL_KINDS), pos_code))
    ).alias("_reused")
    agg0 = tx_aggregate(base, ["tx_key"], F.coalesce(reused, F.lit(False)).alias("_reused"))
    agg0 = keep(agg0.withColumn("inc", F.lit(0)))
    say("looking for reused transaction keys")
    n_reused = agg0.filter("_reused").count()
    if n_reused:
        keys = agg0.filter("_reused").select("tx_key")
        if n_reused <= 200_000:
            keys = F.broadcast(keys)
        by_key = Window.partitionBy("tx_key").orderBy("file_no", "position")
        t1 = (
            base.join(keys, "tx_key")
            .withColumn(
                "_start",
                F.when(
                    (F.col("kind") == "APPEND_MSG") & F.lag("kind").over(by_key).isin(*FINAL_KINDS),
                    1,
                ).otherwise(0),
            )
            .withColumn(
                "inc",
                F.sum("_start").over(by_key.rowsBetween(Window.unboundedPreceding, 0)).cast("int"),
            )
            .drop("_start")
        )
        # every record with its incarnation: 0 for the keys used once
        base_i = base.join(keys, "tx_key", "left_anti").withColumn("inc", F.lit(0)).unionByName(t1)
        again = tx_aggregate(t1, ["tx_key", "inc"]).withColumn("_reused", F.lit(False))
        agg0 = agg0.filter(~F.col("_reused")).unionByName(again)
    else:
        base_i = base.withColumn("inc", F.lit(0))

    # per transaction and partition: the bytes put there, the APPLIED placement's end and
    # the COMMIT hint (the first of each in log order)
    ord_code = pos_code * F.lit(4096)
    tp_cols = ["tx_key", "inc", "topic", "partition", "total", "pl_end", "pl_ord", "hint", "h_ord"]
    none_l = F.lit(None).cast("long")
    tp_rows = (
        base_i.filter(F.col("kind") == "APPEND_MSG")
        .select(
            "tx_key",
            "inc",
            "topic",
            "partition",
            sizes_sum.alias("total"),
            none_l.alias("pl_end"),
            none_l.alias("pl_ord"),
            none_l.alias("hint"),
            none_l.alias("h_ord"),
        )
        .unionByName(
            base_i.filter(F.col("kind") == "APPLIED")
            .select("tx_key", "inc", ord_code.alias("_o"), F.posexplode("placements"))
            .select(
                "tx_key",
                "inc",
                F.col("col.topic").alias("topic"),
                F.col("col.partition").alias("partition"),
                none_l.alias("total"),
                (F.col("col.offset") + F.col("col.bytes")).alias("pl_end"),
                (F.col("_o") + F.col("pos")).alias("pl_ord"),
                none_l.alias("hint"),
                none_l.alias("h_ord"),
            )
        )
        .unionByName(
            base_i.filter(F.col("kind") == "COMMIT")
            .select("tx_key", "inc", ord_code.alias("_o"), F.posexplode("hints"))
            .select(
                "tx_key",
                "inc",
                F.col("col.topic").alias("topic"),
                F.col("col.partition").alias("partition"),
                none_l.alias("total"),
                none_l.alias("pl_end"),
                none_l.alias("pl_ord"),
                F.col("col.hint").alias("hint"),
                (F.col("_o") + F.col("pos")).alias("h_ord"),
            )
        )
        .select(*tp_cols)
    )
    tp = keep(
        tp_rows.groupBy("tx_key", "inc", "topic", "partition").agg(
            F.sum("total").alias("total"),
            F.min_by("pl_end", "pl_ord").alias("exp_end"),
            F.min_by("hint", "h_ord").alias("hint"),
        )
    )
    n_parts = (
        tp.filter(F.col("total").isNotNull())
        .groupBy("tx_key", "inc")
        .agg(F.count("*").cast("int").alias("partitions"))
    )
    outcome = (
        F.when(F.col("has_commit") | F.col("has_applied"), "committed")
        .when(F.col("has_rollback"), "rolled_back")
        .when(F.col("heuristic") == "commit", "heuristic_commit")
        .when(F.col("heuristic") == "rollback", "heuristic_rollback")
        .when(F.col("has_prepare"), "prepared")
        .when(F.col("has_append"), "active")
        .otherwise("unknown")
    )
    tx = keep(
        agg0.drop("_reused")
        .join(n_parts, ["tx_key", "inc"], "left")
        .withColumn("partitions", F.coalesce(F.col("partitions"), F.lit(0)))
        .withColumn("outcome", outcome)
        .withColumn(
            "history_complete",
            F.col("has_append") & (~F.col("has_applied") | (F.col("n_ids") == F.col("_placed"))),
        )
        .withColumn("first_file_no", F.shiftright(F.col("_first"), 40))
        .withColumn("first_position", F.col("_first").bitwiseAND((1 << 40) - 1))
        .drop("_first", "_placed")
        .withColumn("xa", F.col("tx_key").startswith("XID:"))
        .withColumn("duration_ms", F.col("committed_at_ms") - F.col("first_msg_ms"))
        .withColumn("in_doubt_ms", F.col("committed_at_ms") - F.col("prepared_at_ms"))
        .withColumn("decided_at_ms", F.coalesce(F.col("committed_at_ms"), F.col("prepared_at_ms")))
    )
    # every transaction: the ones aggregated now, and those an incremental run carries
    # (``_last_file_no``: the newest redo file of the key, for a later run's reading)
    tx_state = tx
    if carried is not None and carried.tx is not None:
        tx_state = keep(tx.unionByName(carried.tx))
    tx_all = tx_state.drop("_last_file_no")

    # ---------------------------------------------------------------- expected messages
    say("matching transaction messages")
    # one row per APPEND_MSG of a checkable transaction, with its partition's placement,
    # hint and total bytes; exploded to one row per message. Only narrow fixed-width columns
    # go through the join with the partitions' messages (the bounds a message must lie in,
    # computed before); the transaction's details are joined back to the few rows a check
    # reports, or to all of them for the optional messages table.
    checkable = tx.filter(
        F.col("history_complete") & F.col("outcome").isin("committed", *UNCOMMITTED)
    ).select("tx_key", "inc", F.col("outcome").alias("tx_outcome"), "has_applied")
    E_rows = (
        base_i.filter(F.col("kind") == "APPEND_MSG")
        .select(
            "tx_key",
            "inc",
            "topic",
            "partition",
            "file_no",
            "position",
            "msg_ids",
            "checksums",
            "sizes",
        )
        # every APPEND_MSG has its row in tp: one join (the wide rows shuffled once)
        .join(
            tp.select("tx_key", "inc", "topic", "partition", "total", "exp_end", "hint").join(
                checkable, ["tx_key", "inc"]
            ),
            ["tx_key", "inc", "topic", "partition"],
        )
        .withColumn("exp_start", F.col("exp_end") - F.col("total"))
        .join(
            F.broadcast(parts.select("topic", "partition", "min_offset")),
            ["topic", "partition"],
            "left",
        )
    )
    in_range = F.col("has_applied") & F.col("exp_start").isNotNull()
    lower = F.when(in_range, F.col("exp_start")).otherwise(F.col("hint"))
    expired = F.col("min_offset").isNotNull() & lower.isNotNull() & (lower < F.col("min_offset"))
    zipped = F.posexplode(F.arrays_zip("msg_ids", "checksums", "sizes")).alias("idx", "z")
    narrow = E_rows.select(
        "file_no",
        "position",
        "topic",
        "partition",
        (F.col("tx_outcome") == "committed").alias("_committed"),
        lower.alias("_lower"),
        F.when(in_range, F.col("exp_end")).alias("_upper"),
        F.coalesce(expired, F.lit(False)).alias("_expired"),
        "checksums",
        F.posexplode("msg_ids").alias("idx", "msg_id"),
    ).select(
        "msg_id",
        "file_no",
        "position",
        "idx",
        F.get("checksums", F.col("idx")).alias("checksum"),
        "topic",
        "partition",
        "_committed",
        "_lower",
        "_upper",
        "_expired",
    )
    if carried is not None:  # the blocks redone; the rest is carried
        narrow = narrow.filter(among(block("msg_id"), carried.blocks))
    A = M.filter(F.col("msg_id").isNotNull()).select(
        F.col("msg_id"),
        F.col("topic").alias("a_topic"),
        F.col("partition").alias("a_partition"),
        F.col("offset").alias("a_offset"),
        F.col("checksum").alias("a_checksum"),
    )
    here = (F.col("a_topic") == F.col("topic")) & (F.col("a_partition") == F.col("partition"))
    # grouped by fixed-width columns only (hash aggregation), and with no shuffle: the join
    # output is already partitioned by msg_id
    matched = keep(
        narrow.join(A.hint("shuffle_hash"), "msg_id", "left")
        .groupBy(
            "msg_id",
            "file_no",
            "position",
            "idx",
            "checksum",
            "_committed",
            "_lower",
            "_upper",
            "_expired",
        )
        .agg(
            F.count(F.when(here, 1)).alias("n_here"),
            F.count("a_offset").alias("n_any"),
            F.min(F.when(here, F.col("a_offset"))).alias("found_offset"),
            F.max(F.when(here, F.col("a_checksum"))).alias("found_checksum"),
        )
    )
    detail_cols = [
        "msg_id",
        "tx_key",
        "inc",
        "tx_outcome",
        "topic",
        "partition",
        "checksum",
        "size",
        "file_no",
        "position",
        "has_applied",
        "hint",
        "exp_start",
        "exp_end",
        "idx",
    ]
    details = E_rows.select(
        *[c for c in E_rows.columns if c not in ("msg_ids", "checksums", "sizes", "total")],
        zipped,
    ).select(
        "*",
        F.col("z.msg_ids").alias("msg_id"),
        F.col("z.checksums").alias("checksum"),
        F.col("z.sizes").alias("size"),
    )

    def with_details(rows: DataFrame, small: bool) -> DataFrame:
        """``rows`` of ``matched`` with their transaction's columns (the messages table)."""
        found = rows.select(
            "file_no", "position", "idx", "n_here", "n_any", "found_offset", "found_checksum"
        )
        return details.join(
            F.broadcast(found) if small else found, ["file_no", "position", "idx"]
        ).select(
            "topic",
            "partition",
            *[c for c in detail_cols if c not in ("topic", "partition")],
            "n_here",
            "n_any",
            "found_offset",
            "found_checksum",
            "min_offset",
        )

    messages = None if carried is not None else with_details(matched, small=False)

    # ---------------------------------------------------------------- findings
    say("collecting findings")
    # in_range, lower and expired (above) read the same columns of the detailed rows
    where = F.concat(
        F.lit("expected "),
        F.when(
            in_range,
            F.concat(F.lit("in ["), F.col("exp_start"), F.lit(", "), F.col("exp_end"), F.lit(")")),
        ).otherwise(
            F.concat(
                F.lit("at or after COMMIT hint "),
                F.coalesce(F.col("hint").cast("string"), F.lit("?")),
            )
        ),
    )
    misplaced = F.when(
        in_range,
        (F.col("found_offset") < F.col("exp_start")) | (F.col("found_offset") >= F.col("exp_end")),
    ).otherwise(F.col("hint").isNotNull() & (F.col("found_offset") < F.col("hint")))
    common: dict[str, Column] = {
        "tx_key": F.col("tx_key"),
        "topic": F.col("topic"),
        "partition": F.col("partition"),
        "msg_id": F.col("msg_id"),
        "file": F.concat(F.lit("redo."), F.col("file_no").cast("string")),
        "position": F.col("position"),
    }
    # one pass per input counts what each check would find: only checks with something to
    # report are built (a clean audit does no more scans, and no second join with the log)
    is_committed = F.col("_committed")
    n_here = F.col("n_here")
    m_conds = {
        "committed_missing": is_committed & (n_here == 0) & ~F.col("_expired"),
        "committed_duplicate": is_committed & (n_here > 1),
        "committed_misplaced": is_committed
        & (n_here == 1)
        & ((F.col("found_offset") < F.col("_lower")) | (F.col("found_offset") >= F.col("_upper"))),
        "committed_checksum_differs": is_committed
        & (n_here >= 1)
        & (F.col("found_checksum") != F.col("checksum")),
        "uncommitted_visible": ~is_committed & (F.col("n_any") > 0),
    }
    txlog_conds = {
        "corrupt": F.col("kind") == "CORRUPT",
        "txlog_undecodable": F.col("_new")
        & (F.col("kind") != "CORRUPT")
        & F.col("error").isNotNull(),
    }
    say("counting findings")
    probe: dict[str, int] = {}
    # the same passes count what this run parsed and what came from the state
    stats: dict[str, int] = {}
    # independent jobs, submitted at once (the partitions' pass runs since the start)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="audit-count") as pool:
        m_pass = pool.submit(count, "", matched, m_conds, [], "")
        t_pass = pool.submit(count, "txlog", T, txlog_conds, ["file_no", "kind"], "position")
        for done in (m_pass, t_pass, log_pass):
            found, read_now, _rows = done.result()
            probe.update(found)
            stats.update(read_now)
    # how far this run read each file (save_state records it: the first broken record, else
    # the end of the last whole one), and the redo records by kind (for the summary)
    reach: dict[str, tuple[int | None, int | None]] = {}
    redo_kinds: dict[str, int] = {}

    def reached(path: str | None, bad: int | None, end: int | None, base: int = 0) -> None:
        if path is None:
            return
        b0, e0 = reach.get(path, (None, None))
        if bad is not None:
            b0 = bad - base if b0 is None else min(b0, bad - base)
        if end is not None:
            e0 = end - base if e0 is None else max(e0, end - base)
        reach[path] = (b0, e0)

    # per redo file its records by kind, as the state records them (the ones carried and
    # those parsed now); CORRUPT rows and the checkpoint's are parsed again every run
    file_kinds = {k: dict(v) for k, v in (carried.kinds if carried else {}).items()}
    for r in t_pass.result()[2]:
        kind, n = r["kind"], int(r["_rows_read"])
        if r["file_no"] >= 0 and kind != "CORRUPT":
            fk = file_kinds.setdefault(int(r["file_no"]), {})
            fk[kind] = fk.get(kind, 0) + n
        else:
            redo_kinds[kind] = redo_kinds.get(kind, 0) + n
        if r["file_no"] >= 0:
            reached(redo_paths.get(int(r["file_no"])), r["_bad"], r["_end"])
    for fk in file_kinds.values():
        for kind, n in fk.items():
            redo_kinds[kind] = redo_kinds.get(kind, 0) + n
    for r in log_pass.result()[2]:
        at = (r["topic"], r["partition"], r["segment_start"])
        reached(seg_paths.get(at), r["_bad"], r["_end"], int(r["segment_start"]))
    read_to = {p: b if b is not None else e for p, (b, e) in reach.items()}
    checks4 = [
        "committed_missing",
        "committed_duplicate",
        "committed_misplaced",
        "committed_checksum_differs",
    ]
    n_committed = sum(probe[c] for c in checks4)
    reported = [m_conds[c] for c in checks4 if probe[c]]
    committed = with_details(
        matched.filter(_union_cond(reported)) if reported else matched.limit(0),
        small=n_committed <= 100_000,
    )
    f_list: list[DataFrame] = [
        _findings(
            committed.filter((F.col("n_here") == 0) & ~expired),
            "committed_missing",
            **common,
            offset=lower,
            detail=F.concat(
                F.lit("committed message not in its partition; "),
                where,
                F.when(
                    F.col("n_any") > 0,
                    F.concat(F.lit("; "), F.col("n_any"), F.lit(" copies in other partitions")),
                ).otherwise(F.lit("")),
            ),
        ),
        _findings(
            committed.filter(F.col("n_here") > 1),
            "committed_duplicate",
            **common,
            offset=F.col("found_offset"),
            detail=F.concat(
                F.lit("committed message present "), F.col("n_here"), F.lit(" times; "), where
            ),
        ),
        _findings(
            committed.filter((F.col("n_here") == 1) & misplaced),
            "committed_misplaced",
            **common,
            offset=F.col("found_offset"),
            detail=F.concat(F.lit("found at "), F.col("found_offset"), F.lit("; "), where),
        ),
        _findings(
            committed.filter(
                (F.col("n_here") >= 1) & (F.col("found_checksum") != F.col("checksum"))
            ),
            "committed_checksum_differs",
            **common,
            offset=F.col("found_offset"),
            detail=F.concat(
                F.lit("partition record has checksum "),
                F.col("found_checksum"),
                F.lit(", the transaction log "),
                F.col("checksum"),
            ),
        ),
    ]
    f_list = [df for df, c in zip(f_list, checks4, strict=True) if probe[c]]
    # uncommitted_visible: one finding per copy, where it was found
    n_vis = probe["uncommitted_visible"]
    visible = with_details(
        matched.filter(m_conds["uncommitted_visible"]), small=n_vis <= 100_000
    ).select(
        "msg_id",
        "tx_key",
        "tx_outcome",
        "file_no",
        "position",
        F.col("topic").alias("put_topic"),
        F.col("partition").alias("put_partition"),
    )
    if n_vis:
        visible = A.join(F.broadcast(visible) if n_vis <= 100_000 else visible, "msg_id")
        f_list.append(
            _findings(
                visible,
                "uncommitted_visible",
                tx_key=F.col("tx_key"),
                topic=F.col("a_topic"),
                partition=F.col("a_partition"),
                offset=F.col("a_offset"),
                msg_id=F.col("msg_id"),
                file=F.concat(F.lit("redo."), F.col("file_no").cast("string")),
                position=F.col("position"),
                detail=F.concat(
                    F.lit("message of a "),
                    F.col("tx_outcome"),
                    F.lit(" transaction is visible (put to "),
                    F.col("put_topic"),
                    F.lit("-"),
                    F.col("put_partition"),
                    F.lit(")"),
                ),
            )
        )

    bad = M.filter(log_conds["checksum_mismatch"])
    if probe["checksum_mismatch"]:
        f_list.append(
            _findings(
                bad,
                "checksum_mismatch",
                topic=F.col("topic"),
                partition=F.col("partition"),
                offset=F.col("offset"),
                msg_id=F.col("msg_id"),
                file=seg_file,
                position=F.col("offset") - F.col("segment_start"),
                detail=F.concat(
                    F.lit("payload CRC does not match the stored checksum "), F.col("checksum")
                ),
            )
        )
    seg_err = M.filter(F.col("error").isNotNull()).join(
        F.broadcast(parts.select("topic", "partition", "last_start")),
        ["topic", "partition"],
        "left",
    )
    for check, cond in (
        ()
        if not probe["segment_error"]
        else (
            ("segment_torn_tail", F.col("segment_start") == F.col("last_start")),
            (
                "segment_corrupt",
                (F.col("segment_start") != F.col("last_start")) | F.col("last_start").isNull(),
            ),
        )
    ):
        f_list.append(
            _findings(
                seg_err.filter(cond),
                check,
                topic=F.col("topic"),
                partition=F.col("partition"),
                offset=F.col("offset"),
                file=seg_file,
                position=F.col("offset") - F.col("segment_start"),
                detail=F.col("error"),
            )
        )
    corrupt = T.filter(F.col("kind") == "CORRUPT")
    for check, cond in (
        ()
        if not probe["corrupt"]
        else (
            ("checkpoint_damaged", F.col("file_no") < 0),
            ("txlog_torn_tail", F.col("file_no") == newest_redo),
            ("txlog_corrupt", (F.col("file_no") >= 0) & (F.col("file_no") != newest_redo)),
        )
    ):
        f_list.append(
            _findings(
                corrupt.filter(cond),
                check,
                file=redo_file,
                position=F.col("position"),
                detail=F.col("error"),
            )
        )
    if probe["txlog_undecodable"]:
        f_list.append(
            _findings(
                T.filter(txlog_conds["txlog_undecodable"]),
                "txlog_undecodable",
                tx_key=F.col("tx_key"),
                file=redo_file,
                position=F.col("position"),
                detail=F.col("error"),
            )
        )

    # stuck in doubt
    limit_s = (
        F.lit(float(tx_timeout_s))
        if tx_timeout_s is not None
        else F.coalesce(F.col("timeout_s").cast("double"), F.lit(0.0))
    )
    stuck = (
        tx_all.filter(F.col("outcome") == "prepared")
        .withColumn("age_s", (F.lit(now) - F.col("prepared_at_ms")) / 1000.0)
        .withColumn("timeout_used_s", limit_s)
        .filter(F.col("age_s") > F.col("timeout_used_s"))
        .select(
            "tx_key",
            "inc",
            "xa",
            "prepared_at_ms",
            "age_s",
            "timeout_used_s",
            "timeout_s",
            "producer_group",
            "messages",
            "bytes",
            "first_file_no",
            "first_position",
        )
    )
    f_list.append(
        _findings(
            stuck,
            "stuck_prepared",
            tx_key=F.col("tx_key"),
            file=F.concat(F.lit("redo."), F.col("first_file_no")),
            position=F.col("first_position"),
            detail=F.concat(
                F.lit("prepared "),
                F.format_number(F.col("age_s"), 1),
                F.lit(" s ago (timeout "),
                F.format_number(F.col("timeout_used_s"), 1),
                F.lit(" s), "),
                F.col("messages"),
                F.lit(" messages in doubt"),
            ),
        )
    )

    # coordinator
    coord_df: DataFrame | None = None
    clog: CoordinatorLog | None = None
    if coordinator_log is not None:
        say("reading the coordinator log")
        clog = read_coordinator_log(coordinator_log)
        coord_df, coord_findings = _coordinator_checks(spark, clog, tx_all)
        f_list.extend(coord_findings)

    if carried is not None and carried.findings is not None:
        # the earlier runs' findings that still hold; a missing message's range may have
        # gone below its partition's oldest segment since (retention): no longer reported
        gone = (
            (F.col("check") == "committed_missing")
            & F.col("min_offset").isNotNull()
            & F.col("offset").isNotNull()
            & (F.col("offset") < F.col("min_offset"))
        )
        f_list.append(
            carried.findings.join(
                F.broadcast(parts.select("topic", "partition", "min_offset")),
                ["topic", "partition"],
                "left",
            )
            .filter(~F.coalesce(gone, F.lit(False)))
            .select(*[n for n, _t in FINDING_COLUMNS])
        )

    findings = keep(_union([_empty_findings(spark), *f_list]))

    # ---------------------------------------------------------------- counts
    # small tables, written and summarized: kept once computed. Messages per segment, hour
    # and block (what an incremental run carries of the blocks it does not redo)
    seg_hours = (
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
    if carried is not None and carried.hours is not None:
        seg_hours = seg_hours.unionByName(carried.hours)
    seg_hours = keep(seg_hours)
    topic_hours = keep(
        seg_hours.groupBy("topic", "hour_ms").agg(
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.min("first_ms").alias("first_ms"),
            F.max("last_ms").alias("last_ms"),
        )
    )
    tx_hours = keep(
        tx_all.withColumn(
            "hour_ms",
            F.floor(F.coalesce("decided_at_ms", "first_msg_ms") / HOUR_MS) * HOUR_MS,
        )
        .groupBy("hour_ms", "outcome")
        .agg(F.count("*").alias("transactions"), F.sum("messages").alias("messages"))
    )
    # the state's tables of this run ({name: (rows, partitioned by, files)}; written by
    # AuditResult.state_writes): the redo rows parsed now by file, every record of the
    # blocks matched now and their keys by block, and the whole tables a later run carries
    state_tables: dict[str, tuple[DataFrame, str | None, int]] = {}
    if st is not None:
        keys = append_blocks(T, "tx_key")
        if carried is not None:
            keys = keys.filter(among(F.col("blk"), carried.blocks))
        state_tables = {
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
    return AuditResult(
        findings=findings,
        transactions=tx_all,
        messages=messages,
        stuck_prepared=stuck,
        coordinator=coord_df,
        topic_hours=topic_hours,
        tx_hours=tx_hours,
        txlog=T,
        log=M,
        partitions=parts,
        now_ms=now,
        tx_timeout_s=tx_timeout_s,
        inputs={
            "txlog": str(txlog_dir),
            "data": data_s,
            "coordinator_log": None if coordinator_log is None else str(coordinator_log),
        },
        coordinator_log=clog,
        state=st,
        incremental=incremental,
        starts=starts,
        read_to={p: at for p, at in read_to.items() if at is not None},
        txlog_kinds=redo_kinds,
        stats=stats | (carried.stats if carried else {}),
        blocks=None if carried is None else carried.blocks,
        _tables=state_tables,
        _file_kinds=file_kinds,
        _redo_nos=redo_nos,
        _cached=cached,
    )


_XID_RE: Final = r"^XID:(-?[0-9]+):([0-9a-f]*):([0-9a-f]*):(.*)$"


def _coordinator_checks(
    spark: SparkSession, clog: CoordinatorLog, tx: DataFrame
) -> tuple[DataFrame, list[DataFrame]]:
    dec_schema = StructType(
        [
            StructField("gtrid_hex", StringType()),
            StructField("d_format_id", LongType()),
            StructField("decision", StringType()),
            StructField("decision_source", StringType()),
            StructField("coord_decided_at_ms", LongType()),
            StructField("decided_by", StringType()),
            StructField("branches", ArrayType(StringType())),
            StructField("ended", BooleanType()),
        ]
    )
    decisions = spark.createDataFrame(
        [
            (
                d.gtrid_hex,
                d.format_id,
                d.outcome,
                d.source,
                d.decided_at_ms,
                d.by,
                [bq for _n, bq in d.branches],
                d.ended,
            )
            for d in clog.decisions.values()
        ],
        dec_schema,
    )
    cid = clog.coordinator_id
    fmt = clog.format_id
    xa = (
        tx.filter(F.col("xa"))
        .withColumn("format_id", F.regexp_extract("tx_key", _XID_RE, 1).try_cast("long"))
        .withColumn("gtrid_hex", F.regexp_extract("tx_key", _XID_RE, 2))
        .withColumn("bqual_hex", F.regexp_extract("tx_key", _XID_RE, 3))
        .withColumn("gtrid", F.decode(F.unhex("gtrid_hex"), "UTF-8"))
    )
    if cid is not None:
        xa = xa.filter(F.col("gtrid").startswith(cid + "-"))
    if fmt is not None:
        xa = xa.filter(F.col("format_id") == fmt)
    joined = xa.join(F.broadcast(decisions), "gtrid_hex", "left")
    o, d = F.col("outcome"), F.col("decision")
    committed = o.isin("committed", "heuristic_commit")
    rolled = o.isin("rolled_back", "heuristic_rollback")
    reason = (
        F.when((d == "commit") & rolled, F.lit("coordinator decided commit, broker rolled back"))
        .when(
            (d == "rollback") & committed, F.lit("coordinator decided rollback, broker committed")
        )
        .when(
            d.isNull() & committed & F.lit(clog.complete),
            F.lit("broker committed without a coordinator decision (presumed abort)"),
        )
        .when(
            (d == "commit") & (o == "prepared") & F.col("ended"),
            F.lit("coordinator ended phase 2 but the branch is still prepared"),
        )
        .when(
            d.isNotNull() & (o == "active"),
            F.concat(F.lit("coordinator decided "), d, F.lit(" for a branch never prepared")),
        )
    )
    table = joined.withColumn("mismatch", reason).select(
        "tx_key",
        "inc",
        "gtrid",
        "gtrid_hex",
        "bqual_hex",
        "format_id",
        "outcome",
        "decision",
        "decision_source",
        "coord_decided_at_ms",
        "decided_by",
        "ended",
        "mismatch",
        "first_file_no",
        "first_position",
    )
    common = {
        "tx_key": F.col("tx_key"),
        "file": F.concat(F.lit("redo."), F.col("first_file_no")),
        "position": F.col("first_position"),
    }
    out = [
        _findings(
            table.filter(F.col("mismatch").isNotNull()),
            "heuristic_mismatch",
            **common,
            detail=F.col("mismatch"),
        ),
        _findings(
            table.filter(d.isNull() & committed & ~F.lit(clog.complete)),
            "decision_unknown",
            **common,
            detail=F.lit("broker committed; the coordinator log no longer covers this decision"),
        ),
    ]
    heur = [h for h in clog.heuristics if not h.acknowledged]
    if heur:
        hdf = spark.createDataFrame(
            [
                (
                    f"{h.name}: {h.kind} (decision {h.decided}) gtrid {h.gtrid_hex}: {h.message}",
                    h.at_ms,
                )
                for h in heur
            ],
            "detail string, at_ms long",
        )
        out.append(
            _findings(
                hdf,
                "coordinator_heuristic",
                file=F.lit(clog.path),
                position=F.col("at_ms"),
                detail=F.col("detail"),
            )
        )
    for e in clog.errors:
        out.append(
            _findings(
                spark.createDataFrame([(e,)], "detail string"),
                "coordinator_log_corrupt",
                file=F.lit(clog.path),
                detail=F.concat(F.lit("unreadable coordinator log record: "), F.col("detail")),
            )
        )
    return table, out
