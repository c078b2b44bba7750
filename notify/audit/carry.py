"""The incremental run's inputs: what it redoes and what it carries from the state.

A run with a usable state (:mod:`notify.audit.state`) checks these rows again, and carries
every other result:

* keys ``K``: the transaction keys of the records parsed now and of the redo files deleted
  since (their transactions change);
* blocks ``D`` (``msg_id >> BLOCK_SHIFT``): those of the records parsed now, of the deleted
  segments, and of every message of a key in ``K`` (earlier or now);
* keys ``K_all``: ``K`` and every key with a message in a block of ``D``;
* the redo rows of ``K_all`` (parsed now, or read back from the redo files their earlier
  transactions span: the ``tx`` table's ``first_file_no.._last_file_no``), and every record
  of the blocks of ``D`` (parsed now, or from ``log`` where its segment still exists).

The checks then run on these rows only: each transaction of ``K_all`` is aggregated from all
its records, and each message of a block of ``D`` is matched with all the records of its
block, so what they give is what a full audit gives for them. Every transaction outside
``K_all`` and every match outside ``D`` is unchanged since the last run (no record added or
removed), apart from the expiry of a missing message below today's oldest segment, which the
caller applies again to the carried findings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegerType, LongType, StructField, StructType

from notify.audit.state import BLOCK_SHIFT, AuditState

__all__ = [
    "CARRIED_CHECKS",
    "MATCH_CHECKS",
    "Carried",
    "among",
    "append_blocks",
    "block",
    "carried_findings",
    "select",
]

#: findings made by matching messages with records (carried by block)
MATCH_CHECKS = (
    "committed_missing",
    "committed_duplicate",
    "committed_misplaced",
    "committed_checksum_differs",
    "uncommitted_visible",
)
#: the findings a later run carries (the others are made again every run)
CARRIED_CHECKS = (*MATCH_CHECKS, "checksum_mismatch", "txlog_undecodable")
#: keys set below this are broadcast to the joins that pick rows by key
BROADCAST_KEYS = 500_000


def block(c: Column | str) -> Column:
    """The block of a message id column."""
    return F.shiftright(F.col(c) if isinstance(c, str) else c, BLOCK_SHIFT)


def among(c: Column, values: list[int]) -> Column:
    """``c`` is one of ``values`` (false for none)."""
    return c.isin(values) if values else F.lit(False)


@dataclass
class Carried:
    """An incremental run's rows to check (``T``, ``M``, with ``_new``) and what it carries."""

    T: DataFrame
    M: DataFrame
    blocks: list[int]
    keys: DataFrame
    tx: DataFrame | None
    hours: DataFrame | None
    findings: DataFrame | None
    kinds: dict[int, dict[str, int]] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    #: the key sets cached here (the caller unpersists them with its own)
    cached: list[DataFrame] = field(default_factory=list)


def _with(schema: StructType, *cols: tuple[str, Any]) -> StructType:
    out = [f for f in schema.fields if f.name not in {n for n, _ in cols}]
    return StructType(out + [StructField(n, t) for n, t in cols])


def _read(spark: SparkSession, base: str, paths: list[str], schema: StructType) -> DataFrame:
    if not paths:
        return spark.createDataFrame([], schema)
    return spark.read.schema(schema).option("basePath", base).parquet(*paths)


def append_blocks(rows: DataFrame, *cols: str) -> DataFrame:
    """``cols`` and ``blk`` of every message of the APPEND_MSG rows of ``rows`` (redo rows)."""
    return rows.filter(F.col("kind") == "APPEND_MSG").select(
        *cols, F.explode(F.transform("msg_ids", lambda x: block(x))).alias("blk")
    )


def carried_findings(findings: DataFrame) -> DataFrame:
    """The findings a later run may carry, with what it picks them by: ``_blk`` (a message
    match's block), ``_seg_start`` (a checksum mismatch's segment), ``_file_no`` (an
    undecodable redo record's file)."""
    return findings.filter(F.col("check").isin(*CARRIED_CHECKS)).select(
        "*",
        block("msg_id").alias("_blk"),
        F.when(F.col("check") == "checksum_mismatch", F.col("offset") - F.col("position")).alias(
            "_seg_start"
        ),
        F.when(
            F.col("check") == "txlog_undecodable",
            F.regexp_extract("file", r"redo\.([0-9]+)$", 1).cast("int"),
        ).alias("_file_no"),
    )


def select(
    spark: SparkSession,
    st: AuditState,
    T_new: DataFrame,
    M_new: DataFrame,
    redo_nos: set[int],
    segments: DataFrame,
) -> Carried:
    """Pick the rows an incremental run checks (``T_new``/``M_new``: the rows parsed now;
    ``redo_nos``: the redo files on disk; ``segments``: ``topic, partition, segment_start``
    of the segments on disk)."""
    t_schema = _with(T_new.schema, ("run", IntegerType()))
    m_schema = _with(M_new.schema, ("run", IntegerType()), ("blk", LongType()))
    k_schema = StructType(
        [
            StructField("tx_key", T_new.schema["tx_key"].dataType),
            StructField("run", IntegerType()),
            StructField("blk", LongType()),
        ]
    )
    txlog_base = str(st.path / "txlog")
    txlog_parts = st.parts("txlog", "file_no")
    gone = sorted(k for k in txlog_parts if k not in redo_nos)

    def redo_rows(files: set[int]) -> DataFrame:
        paths = [p for k in sorted(files) for p in txlog_parts.get(k, [])]
        return _read(spark, txlog_base, paths, t_schema).drop("run")

    tx_dir = st.latest("tx")
    tx_prev = spark.read.parquet(tx_dir) if tx_dir else None
    hours_dir = st.latest("hours")
    hours_prev = spark.read.parquet(hours_dir) if hours_dir else None
    find_dir = st.latest("findings")
    find_prev = spark.read.parquet(find_dir) if find_dir else None

    def files_of(keys: DataFrame) -> set[int]:
        if tx_prev is None:
            return set()
        first = F.greatest(F.col("first_file_no"), F.lit(0))
        rows = (
            tx_prev.select("tx_key", "first_file_no", "_last_file_no")
            .join(keys, "tx_key", "left_semi")
            .filter(F.col("_last_file_no") >= 0)
            .select(F.explode(F.sequence(first, F.col("_last_file_no"))).alias("f"))
            .distinct()
            .collect()
        )
        return {int(r["f"]) for r in rows} & redo_nos

    def pick(rows: DataFrame, keys: DataFrame, n: int) -> DataFrame:
        return rows.join(F.broadcast(keys) if n <= BROADCAST_KEYS else keys, "tx_key", "left_semi")

    gone_rows = redo_rows(set(gone))
    keys_now = T_new.filter(F.col("tx_key").isNotNull()).select("tx_key")
    K = keys_now.unionByName(gone_rows.select("tx_key")).distinct().cache()
    n_k = K.count()
    earlier_k = pick(redo_rows(files_of(K)), K, n_k)
    # the blocks to redo
    parts = [
        M_new.filter(F.col("msg_id").isNotNull()).select(block("msg_id").alias("blk")),
        append_blocks(T_new),
        append_blocks(earlier_k),
        append_blocks(gone_rows),
    ]
    if hours_prev is not None:  # the blocks of the segments deleted since
        parts.append(
            hours_prev.join(
                F.broadcast(segments), ["topic", "partition", "segment_start"], "left_anti"
            ).select("blk")
        )
    u = parts[0]
    for p in parts[1:]:
        u = u.unionByName(p)
    D = sorted(int(r["blk"]) for r in u.distinct().collect())
    key_parts = st.parts("keys", "blk")
    kpaths = [p for b in D for p in key_parts.get(b, [])]
    in_blocks = _read(spark, str(st.path / "keys"), kpaths, k_schema).select("tx_key")
    K_all = K.unionByName(in_blocks).distinct().cache()
    n_all = K_all.count()
    T_old = pick(redo_rows(files_of(K_all)), K_all, n_all)
    log_parts = st.parts("log", "blk")
    mpaths = [p for b in D for p in log_parts.get(b, [])]
    M_old = (
        _read(spark, str(st.path / "log"), mpaths, m_schema)
        .join(F.broadcast(segments), ["topic", "partition", "segment_start"], "left_semi")
        .select(*M_new.columns)
    )
    T = T_old.withColumn("_new", F.lit(False)).unionByName(T_new.withColumn("_new", F.lit(True)))
    M = M_old.withColumn("_new", F.lit(False)).unionByName(M_new.withColumn("_new", F.lit(True)))
    in_d = among(F.col("blk"), D)
    tx_kept = None
    if tx_prev is not None:
        tx_kept = tx_prev.join(
            F.broadcast(K_all) if n_all <= BROADCAST_KEYS else K_all, "tx_key", "left_anti"
        )
    hours = None
    if hours_prev is not None:
        hours = hours_prev.filter(~in_d).join(
            F.broadcast(segments), ["topic", "partition", "segment_start"], "left_semi"
        )
    found = None
    if find_prev is not None:
        seg_ok = F.col("_seg_start").isNull() | F.col("_seg_ok")
        found = (
            find_prev.join(
                F.broadcast(segments.withColumn("_seg_ok", F.lit(True))).withColumnRenamed(
                    "segment_start", "_seg_start"
                ),
                ["topic", "partition", "_seg_start"],
                "left",
            )
            .filter(
                (F.col("check").isin(*MATCH_CHECKS) & ~among(F.col("_blk"), D))
                | ((F.col("check") == "checksum_mismatch") & seg_ok)
                | (
                    (F.col("check") == "txlog_undecodable")
                    & among(F.col("_file_no"), sorted(redo_nos))
                )
            )
            .drop("_seg_ok")
        )
    kinds = {k: v for k, v in st.kinds.items() if k in redo_nos}
    return Carried(
        T=T,
        M=M,
        blocks=D,
        keys=K_all,
        tx=tx_kept,
        hours=hours,
        findings=found,
        kinds=kinds,
        stats={"keys_changed": n_k, "keys_redone": n_all, "blocks_redone": len(D)},
        cached=[K, K_all],
    )
