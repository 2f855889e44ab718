"""Initial metadata tables: datasets, data items, pipeline runs, documents, chunks, extractions.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from kenning.storage.metadata.schema import UtcDateTime, json_type, metadata

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

# It creates the tables straight from the schema module, except those a later revision changed:
# those are frozen here as they were (0007 added `pipeline_runs.mode`). A change to another
# table must freeze it here too and add a revision of explicit `op.*` steps.
TABLES = ("datasets", "data_items", "documents", "chunks", "extractions")
FROZEN = sa.MetaData()
PIPELINE_RUNS = sa.Table(
    "pipeline_runs",
    FROZEN,
    sa.Column("id", sa.String(255), primary_key=True),
    sa.Column("dataset_id", sa.String(64), nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("step", sa.String(255), nullable=False),
    sa.Column("error", sa.Text(), nullable=False),
    sa.Column("stats", json_type(), nullable=False),
    sa.Column("started_at", UtcDateTime(), nullable=False),
    sa.Column("finished_at", UtcDateTime(), nullable=True),
    sa.Index("ix_pipeline_runs_dataset", "dataset_id", "started_at"),
)


def upgrade() -> None:
    metadata.create_all(op.get_bind(), tables=[metadata.tables[name] for name in TABLES])
    FROZEN.create_all(op.get_bind())


def downgrade() -> None:
    FROZEN.drop_all(op.get_bind())
    metadata.drop_all(op.get_bind(), tables=[metadata.tables[name] for name in TABLES])
