"""Initial metadata tables: datasets, data items, pipeline runs, documents, chunks, extractions.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

from alembic import op

from kenning.storage.metadata.schema import metadata

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

# While this is the only revision, it creates the tables straight from the schema module, so
# the two cannot drift. The first schema change must freeze this revision (copy today's table
# definitions into it) and add a new revision of explicit `op.*` steps.
TABLES = ("datasets", "data_items", "pipeline_runs", "documents", "chunks", "extractions")


def upgrade() -> None:
    metadata.create_all(op.get_bind(), tables=[metadata.tables[name] for name in TABLES])


def downgrade() -> None:
    metadata.drop_all(op.get_bind(), tables=[metadata.tables[name] for name in TABLES])
