"""The audit's findings: one row per problem (:data:`FINDING_COLUMNS`), built per check.

Each builder takes the rows a check reads and returns the findings DataFrame(s) of that
check (lazy); :func:`notify.audit.checks.audit` builds only the checks a counting pass found
something for. The checks and their severities: :data:`SEVERITY` (described in
:mod:`notify.audit.checks`).
"""

from __future__ import annotations

from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
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

from notify.audit.coordinator import CoordinatorLog
from notify.audit.matching import expired, lower_bound, misplaced, where_expected, with_details

__all__ = [
    "COMMITTED_CHECKS",
    "FINDING_COLUMNS",
    "SEVERITY",
    "committed_findings",
    "coordinator_findings",
    "empty_findings",
    "finding_rows",
    "log_findings",
    "still_holding",
    "stuck_findings",
    "stuck_prepared",
    "txlog_findings",
    "visible_findings",
]

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

#: the checks of a committed transaction's messages, in the order they are reported
COMMITTED_CHECKS: Final = (
    "committed_missing",
    "committed_duplicate",
    "committed_misplaced",
    "committed_checksum_differs",
)
#: at most this many rows are broadcast to the joins that give a finding its details
BROADCAST_ROWS: Final = 100_000


def finding_rows(df: DataFrame, check: str, **cols: Column) -> DataFrame:
    """``df`` as findings of ``check``: the :data:`FINDING_COLUMNS` from ``cols`` (null
    where not given), with the check's severity."""
    out = [F.lit(check).alias("check"), F.lit(SEVERITY[check]).alias("severity")]
    for name, t in FINDING_COLUMNS[2:]:
        c = cols.get(name)
        out.append((c if c is not None else F.lit(None).cast(t)).cast(t).alias(name))
    return df.select(*out)


def empty_findings(spark: SparkSession) -> DataFrame:
    """No findings, with the :data:`FINDING_COLUMNS` schema."""
    schema = StructType([StructField(n, t) for n, t in FINDING_COLUMNS])
    return spark.createDataFrame([], schema)


def _message_columns() -> dict[str, Column]:
    return {
        "tx_key": F.col("tx_key"),
        "topic": F.col("topic"),
        "partition": F.col("partition"),
        "msg_id": F.col("msg_id"),
        "file": F.concat(F.lit("redo."), F.col("file_no").cast("string")),
        "position": F.col("position"),
    }


def committed_findings(
    matched: DataFrame,
    details: DataFrame,
    conds: dict[str, Column],
    counts: dict[str, int],
) -> list[DataFrame]:
    """The findings of the :data:`COMMITTED_CHECKS` with a row counted in ``counts``:
    the rows of ``matched`` (:func:`~notify.audit.matching.match_messages`) one of them
    holds (``conds``: :func:`~notify.audit.matching.match_conditions`), with their
    ``details`` (:func:`~notify.audit.matching.message_details`)."""
    n_committed = sum(counts[c] for c in COMMITTED_CHECKS)
    reported = [conds[c] for c in COMMITTED_CHECKS if counts[c]]
    if not reported:
        return []
    either = reported[0]
    for c in reported[1:]:
        either = either | c
    committed = with_details(details, matched.filter(either), small=n_committed <= BROADCAST_ROWS)
    where = where_expected()
    n_here, found = F.col("n_here"), F.col("found_offset")
    copies = F.when(
        F.col("n_any") > 0,
        F.concat(F.lit("; "), F.col("n_any"), F.lit(" copies in other partitions")),
    ).otherwise(F.lit(""))
    #: per check: the rows it reports, the offset and the detail it gives them
    made = {
        "committed_missing": (
            (n_here == 0) & ~expired(),
            lower_bound(),
            F.concat(F.lit("committed message not in its partition; "), where, copies),
        ),
        "committed_duplicate": (
            n_here > 1,
            found,
            F.concat(F.lit("committed message present "), n_here, F.lit(" times; "), where),
        ),
        "committed_misplaced": (
            (n_here == 1) & misplaced(),
            found,
            F.concat(F.lit("found at "), found, F.lit("; "), where),
        ),
        "committed_checksum_differs": (
            (n_here >= 1) & (F.col("found_checksum") != F.col("checksum")),
            found,
            F.concat(
                F.lit("partition record has checksum "),
                F.col("found_checksum"),
                F.lit(", the transaction log "),
                F.col("checksum"),
            ),
        ),
    }
    return [
        finding_rows(committed.filter(rows), c, **_message_columns(), offset=offset, detail=detail)
        for c, (rows, offset, detail) in made.items()
        if counts[c]
    ]


def visible_findings(
    matched: DataFrame, details: DataFrame, A: DataFrame, cond: Column, n: int
) -> list[DataFrame]:
    """``uncommitted_visible``: one finding per copy, where it was found (``A``:
    :func:`~notify.audit.matching.partition_messages`), of each message of an uncommitted
    transaction whose row of ``matched`` holds ``cond``; none when ``n`` (the rows counted)
    is 0."""
    if not n:
        return []
    small = n <= BROADCAST_ROWS
    visible = with_details(details, matched.filter(cond), small=small).select(
        "msg_id",
        "tx_key",
        "tx_outcome",
        "file_no",
        "position",
        F.col("topic").alias("put_topic"),
        F.col("partition").alias("put_partition"),
    )
    copies = A.join(F.broadcast(visible) if small else visible, "msg_id")
    return [
        finding_rows(
            copies,
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
    ]


def log_findings(
    M: DataFrame,
    parts: DataFrame,
    data: str,
    mismatch: Column,
    n_mismatch: int,
    n_errors: int,
) -> list[DataFrame]:
    """Findings of the partitions' records ``M``: ``checksum_mismatch`` (rows holding
    ``mismatch``) when ``n_mismatch``; when ``n_errors``, each segment's framing error as
    ``segment_torn_tail`` in its partition's newest segment (``parts.last_start``), else
    ``segment_corrupt``. ``data``: the dataPath the segment files are named under."""
    seg_file = F.format_string(
        "%s/%s-%d/%020d.meta",
        F.lit(data),
        F.col("topic"),
        F.col("partition"),
        F.col("segment_start"),
    )
    out: list[DataFrame] = []
    if n_mismatch:
        out.append(
            finding_rows(
                M.filter(mismatch),
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
    if not n_errors:
        return out
    seg_err = M.filter(F.col("error").isNotNull()).join(
        F.broadcast(parts.select("topic", "partition", "last_start")),
        ["topic", "partition"],
        "left",
    )
    for check, cond in (
        ("segment_torn_tail", F.col("segment_start") == F.col("last_start")),
        (
            "segment_corrupt",
            (F.col("segment_start") != F.col("last_start")) | F.col("last_start").isNull(),
        ),
    ):
        out.append(
            finding_rows(
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
    return out


def txlog_findings(
    T: DataFrame,
    txlog_dir: str,
    newest_redo: int,
    undecodable: Column,
    n_corrupt: int,
    n_undecodable: int,
) -> list[DataFrame]:
    """Findings of the redo rows ``T``: when ``n_corrupt``, each CORRUPT row as
    ``checkpoint_damaged`` (the checkpoint file), ``txlog_torn_tail`` (in the newest redo
    file, ``newest_redo``) or ``txlog_corrupt``; ``txlog_undecodable`` (rows holding
    ``undecodable``) when ``n_undecodable``. ``txlog_dir`` names the files."""
    redo_file = F.when(
        F.col("file_no") >= 0,
        F.concat(F.lit(txlog_dir + "/redo."), F.col("file_no").cast("string")),
    ).otherwise(F.lit(txlog_dir + "/checkpoint"))
    out: list[DataFrame] = []
    if n_corrupt:
        corrupt = T.filter(F.col("kind") == "CORRUPT")
        for check, cond in (
            ("checkpoint_damaged", F.col("file_no") < 0),
            ("txlog_torn_tail", F.col("file_no") == newest_redo),
            ("txlog_corrupt", (F.col("file_no") >= 0) & (F.col("file_no") != newest_redo)),
        ):
            out.append(
                finding_rows(
                    corrupt.filter(cond),
                    check,
                    file=redo_file,
                    position=F.col("position"),
                    detail=F.col("error"),
                )
            )
    if n_undecodable:
        out.append(
            finding_rows(
                T.filter(undecodable),
                "txlog_undecodable",
                tx_key=F.col("tx_key"),
                file=redo_file,
                position=F.col("position"),
                detail=F.col("error"),
            )
        )
    return out


def stuck_prepared(tx: DataFrame, now_ms: int, tx_timeout_s: float | None) -> DataFrame:
    """The prepared transactions of ``tx`` older (at ``now_ms``) than their timeout:
    ``tx_timeout_s``, else the one logged with their PREPARE (none: 0). Columns: the key,
    ``age_s``, ``timeout_used_s`` and what is in doubt."""
    limit_s = (
        F.lit(float(tx_timeout_s))
        if tx_timeout_s is not None
        else F.coalesce(F.col("timeout_s").cast("double"), F.lit(0.0))
    )
    return (
        tx.filter(F.col("outcome") == "prepared")
        .withColumn("age_s", (F.lit(now_ms) - F.col("prepared_at_ms")) / 1000.0)
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


def stuck_findings(stuck: DataFrame) -> DataFrame:
    """``stuck_prepared`` findings of the rows of :func:`stuck_prepared`."""
    return finding_rows(
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


def still_holding(carried: DataFrame, parts: DataFrame) -> DataFrame:
    """The findings an incremental run carries (``carried``) that still hold: a missing
    message whose expected offset now lies below its partition's oldest segment
    (``parts.min_offset``: retention deleted the range since) is no longer reported."""
    gone = (
        (F.col("check") == "committed_missing")
        & F.col("min_offset").isNotNull()
        & F.col("offset").isNotNull()
        & (F.col("offset") < F.col("min_offset"))
    )
    return (
        carried.join(
            F.broadcast(parts.select("topic", "partition", "min_offset")),
            ["topic", "partition"],
            "left",
        )
        .filter(~F.coalesce(gone, F.lit(False)))
        .select(*[n for n, _t in FINDING_COLUMNS])
    )


_XID_RE: Final = r"^XID:(-?[0-9]+):([0-9a-f]*):([0-9a-f]*):(.*)$"


def _decisions(spark: SparkSession, clog: CoordinatorLog) -> DataFrame:
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
    return spark.createDataFrame(
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


def coordinator_table(spark: SparkSession, clog: CoordinatorLog, tx: DataFrame) -> DataFrame:
    """The broker's XA branches of this coordinator (``tx``: the transactions table) with
    the coordinator's decision and ``mismatch``, why they disagree (null when they agree)."""
    xa = (
        tx.filter(F.col("xa"))
        .withColumn("format_id", F.regexp_extract("tx_key", _XID_RE, 1).try_cast("long"))
        .withColumn("gtrid_hex", F.regexp_extract("tx_key", _XID_RE, 2))
        .withColumn("bqual_hex", F.regexp_extract("tx_key", _XID_RE, 3))
        .withColumn("gtrid", F.decode(F.unhex("gtrid_hex"), "UTF-8"))
    )
    if clog.coordinator_id is not None:
        xa = xa.filter(F.col("gtrid").startswith(clog.coordinator_id + "-"))
    if clog.format_id is not None:
        xa = xa.filter(F.col("format_id") == clog.format_id)
    joined = xa.join(F.broadcast(_decisions(spark, clog)), "gtrid_hex", "left")
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
    return joined.withColumn("mismatch", reason).select(
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


def coordinator_findings(
    spark: SparkSession, clog: CoordinatorLog, table: DataFrame
) -> list[DataFrame]:
    """Findings of the coordinator's log against the broker (``table``:
    :func:`coordinator_table`): ``heuristic_mismatch``, ``decision_unknown`` (committed, and
    the log no longer covers it), ``coordinator_heuristic`` (unacknowledged heuristic
    reports) and ``coordinator_log_corrupt`` (unreadable records)."""
    d = F.col("decision")
    committed = F.col("outcome").isin("committed", "heuristic_commit")
    common = {
        "tx_key": F.col("tx_key"),
        "file": F.concat(F.lit("redo."), F.col("first_file_no")),
        "position": F.col("first_position"),
    }
    out = [
        finding_rows(
            table.filter(F.col("mismatch").isNotNull()),
            "heuristic_mismatch",
            **common,
            detail=F.col("mismatch"),
        ),
        finding_rows(
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
            finding_rows(
                hdf,
                "coordinator_heuristic",
                file=F.lit(clog.path),
                position=F.col("at_ms"),
                detail=F.col("detail"),
            )
        )
    for e in clog.errors:
        out.append(
            finding_rows(
                spark.createDataFrame([(e,)], "detail string"),
                "coordinator_log_corrupt",
                file=F.lit(clog.path),
                detail=F.concat(F.lit("unreadable coordinator log record: "), F.col("detail")),
            )
        )
    return out
