"""The other datasets an LLM attempt is charged to: a search of several datasets is charged to each
dataset it read (`llm_attempts.dataset_id` holds the first).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    # The table as this revision makes it, frozen here: a later change adds a revision of its own.
    op.create_table(
        "llm_attempt_datasets",
        sa.Column("attempt_id", sa.String(64), primary_key=True),
        sa.Column("dataset_id", sa.String(64), primary_key=True),
    )
    op.create_index("ix_llm_attempt_datasets_dataset", "llm_attempt_datasets", ["dataset_id"])


def downgrade() -> None:
    op.drop_index("ix_llm_attempt_datasets_dataset", "llm_attempt_datasets")
    op.drop_table("llm_attempt_datasets")
