"""Consumer offsets table (MetaQ's meta_topic_partition_group_offset + updated_at).

Revision ID: 0001
Revises:
Create Date: 2025-11-22

Creates the table; if MetaQ's own table is already there (created by MetaQ's DDL), adopts it
instead: adds the missing ``msg_id``/``updated_at`` columns and the unique key on
``(group_id, topic, partition)`` the upserts need.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "meta_topic_partition_group_offset"
UNIQUE = "uq_meta_offset_group_topic_partition"
KEY = ["group_id", "topic", "partition"]


def _updated_at(with_default: bool) -> sa.Column[object]:
    return sa.Column(
        "updated_at",
        sa.DateTime(timezone=True),
        nullable=True,
        server_default=sa.func.current_timestamp() if with_default else None,
    )


def upgrade() -> None:
    """Create (or adopt) the offsets table."""
    bind = op.get_bind()
    insp = sa.inspect(bind)
    if not insp.has_table(TABLE):
        op.create_table(
            TABLE,
            sa.Column(
                "id",
                sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                primary_key=True,
                autoincrement=True,
            ),
            sa.Column("topic", sa.String(255), nullable=False),
            sa.Column("partition", sa.String(255), nullable=False),
            sa.Column("group_id", sa.String(255), nullable=False),
            sa.Column("offset", sa.BigInteger(), nullable=False),
            sa.Column("msg_id", sa.BigInteger(), nullable=False, server_default=sa.text("-1")),
            _updated_at(True),
            sa.UniqueConstraint(*KEY, name=UNIQUE),
        )
        return
    cols = {c["name"] for c in insp.get_columns(TABLE)}
    missing = {"topic", "partition", "group_id", "offset"} - cols
    if missing:
        raise RuntimeError(f"existing table {TABLE} lacks columns {sorted(missing)}")
    if "msg_id" not in cols:
        op.add_column(
            TABLE, sa.Column("msg_id", sa.BigInteger(), nullable=False, server_default="-1")
        )
    if "updated_at" not in cols:
        # SQLite cannot add a column whose default is not constant.
        op.add_column(TABLE, _updated_at(bind.dialect.name != "sqlite"))
    candidates: list[dict[str, Any]] = [
        *({"unique": True, **u} for u in insp.get_unique_constraints(TABLE)),
        *(dict(i) for i in insp.get_indexes(TABLE)),
    ]
    keyed = any(
        sorted(c.get("column_names") or []) == sorted(KEY) for c in candidates if c.get("unique")
    )
    if not keyed:
        op.create_index(UNIQUE, TABLE, KEY, unique=True)


def downgrade() -> None:
    """Drop the offsets table."""
    op.drop_table(TABLE)
