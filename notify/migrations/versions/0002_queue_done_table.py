"""Queue messages applied by the application's transactions (transactional acknowledgement).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

``notify_queue_done``: one row per queue message an application transaction applied, keyed
by ``(group_id, topic, partition, offset)``; see :mod:`notify.offsets.queue_tx`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLE = "notify_queue_done"


def upgrade() -> None:
    """Create the table."""
    op.create_table(
        TABLE,
        sa.Column("group_id", sa.String(255), primary_key=True),
        sa.Column("topic", sa.String(255), primary_key=True),
        sa.Column("partition", sa.String(255), primary_key=True),
        sa.Column("offset", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("msg_id", sa.BigInteger(), nullable=False),
        sa.Column(
            "done_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.current_timestamp(),
        ),
    )


def downgrade() -> None:
    """Drop the table."""
    op.drop_table(TABLE)
