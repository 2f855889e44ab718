"""LLM output rungs: how each endpoint and model takes structured output (json_schema, json_object
or a prompt), as the first extraction that worked found it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kenning.storage.metadata.schema import UtcDateTime

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    # The table as this revision makes it, frozen here: a later change adds a revision of its own.
    op.create_table(
        "llm_output_rungs",
        sa.Column("endpoint", sa.String(512), primary_key=True),
        sa.Column("model", sa.String(255), primary_key=True),
        sa.Column("rung", sa.String(32), nullable=False),
        sa.Column("changed_at", UtcDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("llm_output_rungs")
