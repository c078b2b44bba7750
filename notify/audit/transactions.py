"""The audit's transactions: redo records grouped into transaction incarnations.

Stages, in the order :func:`notify.audit.checks.audit` runs them (each takes and returns
lazy DataFrames; only :func:`incarnations` runs a job):

1. :func:`tx_records`: the redo rows of transaction records, with the columns used below;
2. :func:`incarnations`: one aggregated row per key (``inc`` 0) and, for the few keys used
   again after a final record, one per incarnation; every record with its ``inc``;
3. :func:`tx_partitions`: per incarnation and partition, the bytes put there, the APPLIED
   placement's end and the COMMIT hint;
4. :func:`transactions`: the transactions table (outcome, partitions, times).

A key may be reused once its transaction ended: each run of records from an APPEND_MSG that
follows a final record (APPLIED, ROLLBACK, HEURISTIC, FORGET) to the next such record is one
incarnation. Almost every key has one: keys are aggregated by key alone, with fixed-width
buffers only (hash aggregation, combined map-side; no lists of messages carried through the
shuffle), and only keys with an APPEND_MSG after a final record are redone over a window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

__all__ = [
    "FINAL_KINDS",
    "NAMED_KINDS",
    "TX_KINDS",
    "UNCOMMITTED",
    "append_rows",
    "incarnations",
    "sizes_sum",
    "transactions",
    "tx_aggregate",
    "tx_partitions",
    "tx_records",
]

TX_KINDS: Final = ("APPEND_MSG", "PREPARE", "COMMIT", "ROLLBACK", "APPLIED", "HEURISTIC", "FORGET")
FINAL_KINDS: Final = ("APPLIED", "ROLLBACK", "HEURISTIC", "FORGET")
#: the kinds whose string columns the transactions table takes (aggregated apart)
NAMED_KINDS: Final = ("HEURISTIC", "PREPARE", "ROLLBACK")
UNCOMMITTED: Final = ("rolled_back", "heuristic_rollback", "prepared", "active")
#: keys used again at most this many are broadcast to the join that picks their records
BROADCAST_REUSED: Final = 200_000

#: the columns of the aggregated rows, in order (then ``_reused`` on the first pass)
AGG_ORDER: Final = (
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
)


def tx_records(T: DataFrame) -> DataFrame:
    """The transaction records of the redo rows ``T`` (kinds :data:`TX_KINDS`, with a key),
    with the columns the transactions and the expected messages are built from."""
    return T.filter(F.col("kind").isin(*TX_KINDS) & F.col("tx_key").isNotNull()).select(
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


def append_rows(base_i: DataFrame, *cols: str | Column) -> DataFrame:
    """The APPEND_MSG records of ``base_i`` (records with their ``inc``): ``tx_key, inc,
    topic, partition`` and ``cols``."""
    return base_i.filter(F.col("kind") == "APPEND_MSG").select(
        "tx_key", "inc", "topic", "partition", *cols
    )


def pos_code() -> Column:
    """A record's place in the redo log as one long: ``file_no << 40 | position``."""
    return F.col("file_no") * F.lit(1 << 40) + F.col("position")


def sizes_sum() -> Column:
    """The bytes of an APPEND_MSG row's records (the sum of ``sizes``)."""
    return F.aggregate("sizes", F.lit(0).cast("long"), lambda a, x: a + x)


def _when_kind(kind: str, c: str | Column) -> Column:
    return F.when(F.col("kind") == kind, F.col(c) if isinstance(c, str) else c)


def _has(kind: str) -> Column:
    return F.coalesce(F.max(F.col("kind") == kind), F.lit(False))


def _fixed_aggs() -> list[Column]:
    # fixed-width buffers only (a string max would make the whole aggregate sort-based)
    placed_sum = F.aggregate(
        "placements", F.lit(0).cast("long"), lambda acc, p: acc + p["count"].cast("long")
    )
    return [
        _has("COMMIT").alias("has_commit"),
        _has("APPLIED").alias("has_applied"),
        _has("ROLLBACK").alias("has_rollback"),
        _has("PREPARE").alias("has_prepare"),
        _has("APPEND_MSG").alias("has_append"),
        F.min(pos_code()).alias("_first"),
        F.max("file_no").alias("_last_file_no"),
        F.min(_when_kind("APPEND_MSG", "time_ms")).alias("first_msg_ms"),
        F.max(_when_kind("PREPARE", "time_ms")).alias("prepared_at_ms"),
        F.max(_when_kind("PREPARE", "timeout_s")).alias("timeout_s"),
        F.max(_when_kind("COMMIT", "time_ms")).alias("committed_at_ms"),
        F.coalesce(F.sum(_when_kind("APPEND_MSG", F.size("msg_ids"))), F.lit(0))
        .cast("long")
        .alias("n_ids"),
        F.coalesce(F.sum(_when_kind("APPEND_MSG", "msg_count")), F.lit(0))
        .cast("long")
        .alias("messages"),
        F.coalesce(F.sum(_when_kind("APPEND_MSG", sizes_sum())), F.lit(0))
        .cast("long")
        .alias("bytes"),
        F.count("*").alias("records"),
        F.coalesce(F.sum(_when_kind("APPLIED", placed_sum)), F.lit(0))
        .cast("long")
        .alias("_placed"),
    ]


def tx_aggregate(rows: DataFrame, keys: list[str], *more: Column) -> DataFrame:
    """``rows`` (of :func:`tx_records`) aggregated by ``keys``: the :data:`AGG_ORDER`
    columns, plus ``_reused`` when ``more`` (the first pass's extra aggregate) is given.

    The string columns (heuristic outcome, producer group, rollback reason) come from the
    few PREPARE/ROLLBACK/HEURISTIC rows, aggregated apart and joined back, so the main
    aggregate keeps fixed-width buffers (hash-based)."""
    fixed = rows.groupBy(*keys).agg(*_fixed_aggs(), *more)
    named = rows.filter(F.col("kind").isin(*NAMED_KINDS))
    strings = named.groupBy(*keys).agg(
        F.max(_when_kind("HEURISTIC", "outcome")).alias("heuristic"),
        F.max(_when_kind("PREPARE", "producer_group")).alias("producer_group"),
        F.max(_when_kind("ROLLBACK", "reason")).alias("rollback_reason"),
    )
    extra = ["_reused"] if more else []
    return fixed.join(strings, keys, "left").select(*keys, *AGG_ORDER, *extra)


def incarnations(
    base: DataFrame,
    keep: Callable[[DataFrame], DataFrame],
    say: Callable[[str], None] = lambda _m: None,
) -> tuple[DataFrame, DataFrame]:
    """The transaction incarnations of ``base`` (:func:`tx_records`): ``(agg, base_i)``.

    ``agg``: one row per incarnation (``tx_key, inc``, the :data:`AGG_ORDER` columns and a
    ``_reused`` column to drop); ``base_i``: every record of ``base`` with its ``inc``.
    Keys are aggregated by key alone first (``inc`` 0; cached with ``keep``); one job counts
    the keys with an APPEND_MSG after a final record, and only those are split over a
    window, an incarnation starting at each APPEND_MSG right after a final record."""
    reused = (
        F.max(_when_kind("APPEND_MSG", pos_code()))
        > F.min(F.when(F.col("kind").isin(*FINAL_KINDS), pos_code()))
    ).alias("_reused")
    agg0 = tx_aggregate(base, ["tx_key"], F.coalesce(reused, F.lit(False)).alias("_reused"))
    agg0 = keep(agg0.withColumn("inc", F.lit(0)))
    say("looking for reused transaction keys")
    n_reused = agg0.filter("_reused").count()
    if not n_reused:
        return agg0, base.withColumn("inc", F.lit(0))
    keys = agg0.filter("_reused").select("tx_key")
    if n_reused <= BROADCAST_REUSED:
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
    return agg0.filter(~F.col("_reused")).unionByName(again), base_i


def tx_partitions(base_i: DataFrame) -> DataFrame:
    """Per incarnation and partition (``tx_key, inc, topic, partition``): ``total``, the
    bytes its APPEND_MSG records put there (null where it put none); ``exp_end``, the end
    of the first APPLIED placement there; ``hint``, the first COMMIT hint there (first in
    log order)."""
    ord_code = pos_code() * F.lit(4096)
    none_l = F.lit(None).cast("long")
    values = ("total", "pl_end", "pl_ord", "hint", "h_ord")

    def elements(kind: str, column: str, **got: Column) -> DataFrame:
        # one row per element of the ``kind`` records' ``column`` (placements, hints):
        # ``got`` of ``col`` (the element), ``pos`` (its index) and ``_o`` (record order)
        return (
            base_i.filter(F.col("kind") == kind)
            .select("tx_key", "inc", ord_code.alias("_o"), F.posexplode(column))
            .select(
                "tx_key",
                "inc",
                F.col("col.topic").alias("topic"),
                F.col("col.partition").alias("partition"),
                *[got.get(v, none_l).alias(v) for v in values],
            )
        )

    tp_rows = (
        append_rows(base_i, *[(sizes_sum() if v == "total" else none_l).alias(v) for v in values])
        .unionByName(
            elements(
                "APPLIED",
                "placements",
                pl_end=F.col("col.offset") + F.col("col.bytes"),
                pl_ord=F.col("_o") + F.col("pos"),
            )
        )
        .unionByName(
            elements("COMMIT", "hints", hint=F.col("col.hint"), h_ord=F.col("_o") + F.col("pos"))
        )
        .select("tx_key", "inc", "topic", "partition", *values)
    )
    return tp_rows.groupBy("tx_key", "inc", "topic", "partition").agg(
        F.sum("total").alias("total"),
        F.min_by("pl_end", "pl_ord").alias("exp_end"),
        F.min_by("hint", "h_ord").alias("hint"),
    )


def transactions(agg: DataFrame, tp: DataFrame) -> DataFrame:
    """The transactions table: ``agg`` (of :func:`incarnations`) with ``partitions`` (how
    many partitions its messages went to, from ``tp``), ``outcome``, ``history_complete``
    (has its APPEND_MSG records, and as many ids as its APPLIED placed), where it starts in
    the redo log, ``xa`` and its times (``_last_file_no`` kept for the incremental state).

    Outcome: ``committed`` (COMMIT or APPLIED), ``rolled_back``, ``heuristic_commit`` /
    ``heuristic_rollback``, ``prepared`` (PREPARE and nothing after), ``active`` (messages
    only), ``unknown``."""
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
    return (
        agg.drop("_reused")
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
