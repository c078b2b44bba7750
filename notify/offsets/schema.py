"""The SQL offsets table (MetaQ's ``meta_topic_partition_group_offset`` plus ``updated_at``).

Columns as in MetaQ's MySQL offset storage, so MetaQ tooling can read them: ``id``
(surrogate key), ``topic``, ``partition`` (``"<brokerId>-<part>"``), ``group_id``,
``offset`` (byte offset of the next record to consume), ``msg_id`` (id of the last consumed
message, -1 if unknown); plus ``updated_at`` (UTC) and a unique key on
``(group_id, topic, partition)`` that the one-statement upserts rely on.

This describes the table for the runtime; the DDL is owned by the Alembic revisions in
:mod:`notify.migrations` (``notify db upgrade``), which must stay in step with it.
"""

from __future__ import annotations

import sqlalchemy as sa

#: MetaQ's table name.
OFFSET_TABLE = "meta_topic_partition_group_offset"
#: The unique key over ``(group_id, topic, partition)``.
OFFSET_UNIQUE = "uq_meta_offset_group_topic_partition"
#: Longest topic/group/partition text the table holds.
NAME_LENGTH = 255


def offsets_table(metadata: sa.MetaData, name: str = OFFSET_TABLE) -> sa.Table:
    """The offsets :class:`~sqlalchemy.Table` bound to ``metadata``."""
    return sa.Table(
        name,
        metadata,
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("topic", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("partition", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("group_id", sa.String(NAME_LENGTH), nullable=False),
        sa.Column("offset", sa.BigInteger(), nullable=False),
        sa.Column("msg_id", sa.BigInteger(), nullable=False, server_default=sa.text("-1")),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            nullable=True,
            server_default=sa.func.current_timestamp(),
        ),
        sa.UniqueConstraint("group_id", "topic", "partition", name=OFFSET_UNIQUE),
    )


metadata = sa.MetaData()
#: The default table.
offsets = offsets_table(metadata)

#: The queue messages an application's transactions applied (:mod:`notify.offsets.queue_tx`).
QUEUE_DONE_TABLE = "notify_queue_done"


def queue_done_table(metadata: sa.MetaData, name: str = QUEUE_DONE_TABLE) -> sa.Table:
    """One row per queue message applied in the application's database, keyed by
    ``(group_id, topic, partition, offset)`` (``partition`` is ``"<brokerId>-<part>"``);
    ``done_at`` (UTC) is when the transaction wrote it, for pruning."""
    return sa.Table(
        name,
        metadata,
        sa.Column("group_id", sa.String(NAME_LENGTH), primary_key=True),
        sa.Column("topic", sa.String(NAME_LENGTH), primary_key=True),
        sa.Column("partition", sa.String(NAME_LENGTH), primary_key=True),
        sa.Column("offset", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("msg_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "done_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.current_timestamp(),
        ),
    )


#: The default queue table.
queue_done = queue_done_table(metadata)
