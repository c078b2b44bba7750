"""The audit's message matching: each message a transaction logged, found in the partitions.

Stages, in the order :func:`notify.audit.checks.audit` runs them (lazy DataFrames):

1. :func:`expected_rows`: one row per APPEND_MSG of a checkable transaction, with its
   partition's placement, hint and total bytes and the partition's oldest offset;
2. :func:`expected_messages`: exploded to one narrow row per message, with the bounds it
   must lie in (only fixed-width columns go through the join that follows);
3. :func:`partition_messages`: the partitions' records with an id;
4. :func:`match_messages`: per expected message, how often it is in its partition and
   elsewhere, where and with which checksum (:data:`MATCH_CONDITIONS` count the findings);
5. :func:`with_details`: matched rows joined back with their transaction's columns (the
   messages table, and the few rows a check reports).

Where a message must be: with APPLIED, in the byte range the placement names
(``[exp_start, exp_end)``); else at or after the COMMIT hint. A lower bound below the
partition's oldest segment (retention deleted it) makes the message ``_expired``: its
absence is not reported.
"""

from __future__ import annotations

from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from notify.audit.carry import among, block
from notify.audit.transactions import UNCOMMITTED, append_rows

__all__ = [
    "DETAIL_COLUMNS",
    "expected_messages",
    "expected_rows",
    "expired",
    "in_range",
    "lower_bound",
    "match_conditions",
    "match_messages",
    "message_details",
    "misplaced",
    "partition_messages",
    "where_expected",
    "with_details",
]

#: the columns of :func:`message_details` a matched row is reported with (then the match's)
DETAIL_COLUMNS: Final = (
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
)


def in_range() -> Column:
    """The expected row has an APPLIED placement range to check against."""
    return F.col("has_applied") & F.col("exp_start").isNotNull()


def lower_bound() -> Column:
    """The lowest offset the message may be at: the placement's start, else the hint."""
    return F.when(in_range(), F.col("exp_start")).otherwise(F.col("hint"))


def expired() -> Column:
    """The lower bound lies below the partition's oldest segment (``min_offset``)."""
    low = lower_bound()
    return F.col("min_offset").isNotNull() & low.isNotNull() & (low < F.col("min_offset"))


def where_expected() -> Column:
    """``expected in [start, end)`` or ``expected at or after COMMIT hint h`` (details)."""
    return F.concat(
        F.lit("expected "),
        F.when(
            in_range(),
            F.concat(F.lit("in ["), F.col("exp_start"), F.lit(", "), F.col("exp_end"), F.lit(")")),
        ).otherwise(
            F.concat(
                F.lit("at or after COMMIT hint "),
                F.coalesce(F.col("hint").cast("string"), F.lit("?")),
            )
        ),
    )


def misplaced() -> Column:
    """The message was found (``found_offset``) outside where it is expected."""
    return F.when(
        in_range(),
        (F.col("found_offset") < F.col("exp_start")) | (F.col("found_offset") >= F.col("exp_end")),
    ).otherwise(F.col("hint").isNotNull() & (F.col("found_offset") < F.col("hint")))


def expected_rows(base_i: DataFrame, tp: DataFrame, tx: DataFrame, parts: DataFrame) -> DataFrame:
    """The APPEND_MSG rows of ``base_i`` (records with their ``inc``) of the transactions of
    ``tx`` whose history is complete and whose outcome is committed or uncommitted, joined
    with their partition's row of ``tp`` (``total``, ``exp_end``, ``hint``; ``exp_start`` =
    ``exp_end - total``) and the partition's ``min_offset`` from ``parts``."""
    checkable = tx.filter(
        F.col("history_complete") & F.col("outcome").isin("committed", *UNCOMMITTED)
    ).select("tx_key", "inc", F.col("outcome").alias("tx_outcome"), "has_applied")
    return (
        append_rows(base_i, "file_no", "position", "msg_ids", "checksums", "sizes")
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


def expected_messages(E_rows: DataFrame, blocks: list[int] | None = None) -> DataFrame:
    """One row per message of ``E_rows`` (:func:`expected_rows`): ``msg_id``, where it was
    logged (``file_no, position, idx``), its logged ``checksum``, ``topic, partition``, and
    ``_committed``, ``_lower``, ``_upper`` (null without a placement) and ``_expired``.
    ``blocks``: only the messages of these id blocks (an incremental run's)."""
    narrow = E_rows.select(
        "file_no",
        "position",
        "topic",
        "partition",
        (F.col("tx_outcome") == "committed").alias("_committed"),
        lower_bound().alias("_lower"),
        F.when(in_range(), F.col("exp_end")).alias("_upper"),
        F.coalesce(expired(), F.lit(False)).alias("_expired"),
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
    if blocks is not None:  # the blocks redone; the rest is carried
        narrow = narrow.filter(among(block("msg_id"), blocks))
    return narrow


def partition_messages(M: DataFrame) -> DataFrame:
    """The partitions' records with an id (``M``: the ``notify-log`` rows): ``msg_id``,
    ``a_topic``, ``a_partition``, ``a_offset``, ``a_checksum``."""
    return M.filter(F.col("msg_id").isNotNull()).select(
        F.col("msg_id"),
        F.col("topic").alias("a_topic"),
        F.col("partition").alias("a_partition"),
        F.col("offset").alias("a_offset"),
        F.col("checksum").alias("a_checksum"),
    )


def match_messages(narrow: DataFrame, A: DataFrame) -> DataFrame:
    """Each expected message (:func:`expected_messages`) with what the partitions hold under
    its id (:func:`partition_messages`): ``n_here`` copies in its own partition, ``n_any``
    anywhere, the lowest ``found_offset`` and a ``found_checksum`` in its partition.

    Grouped by fixed-width columns only (hash aggregation), and with no shuffle: the join
    output is already partitioned by ``msg_id``."""
    here = (F.col("a_topic") == F.col("topic")) & (F.col("a_partition") == F.col("partition"))
    return (
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


def match_conditions() -> dict[str, Column]:
    """Per match check, the condition a row of :func:`match_messages` reports it on."""
    is_committed = F.col("_committed")
    n_here = F.col("n_here")
    return {
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


def message_details(E_rows: DataFrame) -> DataFrame:
    """``E_rows`` (:func:`expected_rows`) exploded to one row per message with every
    column (``msg_id``, ``checksum``, ``size``, ``idx`` and the row's)."""
    zipped = F.posexplode(F.arrays_zip("msg_ids", "checksums", "sizes")).alias("idx", "z")
    return E_rows.select(
        *[c for c in E_rows.columns if c not in ("msg_ids", "checksums", "sizes", "total")],
        zipped,
    ).select(
        "*",
        F.col("z.msg_ids").alias("msg_id"),
        F.col("z.checksums").alias("checksum"),
        F.col("z.sizes").alias("size"),
    )


def with_details(details: DataFrame, rows: DataFrame, small: bool) -> DataFrame:
    """``rows`` of :func:`match_messages` with their transaction's columns from ``details``
    (:func:`message_details`): the :data:`DETAIL_COLUMNS` (topic and partition first), the
    match's counts and ``min_offset``. ``small``: broadcast ``rows`` to the join."""
    found = rows.select(
        "file_no", "position", "idx", "n_here", "n_any", "found_offset", "found_checksum"
    )
    return details.join(
        F.broadcast(found) if small else found, ["file_no", "position", "idx"]
    ).select(
        "topic",
        "partition",
        *[c for c in DETAIL_COLUMNS if c not in ("topic", "partition")],
        "n_here",
        "n_any",
        "found_offset",
        "found_checksum",
        "min_offset",
    )
