"""LLM attempts: every request a run sent, with the tokens billed for its answer.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kenning.storage.metadata.schema import UtcDateTime

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

# The table as this revision made it (0008 added what each attempt was for, and its session).
FROZEN = sa.MetaData()
LLM_ATTEMPTS = sa.Table(
    "llm_attempts",
    FROZEN,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(255), nullable=False),
    sa.Column("dataset_id", sa.String(64), nullable=False),
    sa.Column("model", sa.String(255), nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
    sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
    sa.Column("sent_at", UtcDateTime(), nullable=False),
    sa.Index("ix_llm_attempts_run", "run_id"),
)


def upgrade() -> None:
    FROZEN.create_all(op.get_bind(), tables=[LLM_ATTEMPTS])


def downgrade() -> None:
    FROZEN.drop_all(op.get_bind(), tables=[LLM_ATTEMPTS])
