"""Run mode: which runner runs a pipeline run (embedded or distributed), from its first write.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    # Runs recorded before have no mode (""): readers tell an embedded one by its process id.
    op.add_column("pipeline_runs", sa.Column("mode", sa.String(32), nullable=False, server_default=""))


def downgrade() -> None:
    with op.batch_alter_table("pipeline_runs") as table:
        table.drop_column("mode")
