"""LLM attempts say what they were for (a run's extraction or a search's completion) and the agent
session they were made in; indexes to sum them per dataset and per session.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

COLUMNS = (
    # Every attempt recorded before was a run's: searches were not recorded.
    sa.Column("kind", sa.String(16), nullable=False, server_default="extraction"),
    sa.Column("tenant", sa.String(255), nullable=False, server_default=""),
    sa.Column("user_id", sa.String(255), nullable=False, server_default=""),
    sa.Column("session_id", sa.String(255), nullable=False, server_default=""),
)


def upgrade() -> None:
    for column in COLUMNS:
        op.add_column("llm_attempts", column)
    op.create_index("ix_llm_attempts_dataset", "llm_attempts", ["dataset_id"])
    op.create_index("ix_llm_attempts_session", "llm_attempts", ["tenant", "user_id", "session_id"])


def downgrade() -> None:
    op.drop_index("ix_llm_attempts_session", "llm_attempts")
    op.drop_index("ix_llm_attempts_dataset", "llm_attempts")
    with op.batch_alter_table("llm_attempts") as table:
        for column in reversed(COLUMNS):
            table.drop_column(column.name)
