"""Tenants, users, API keys and per-dataset grants.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from alembic import op

from kenning.storage.metadata.schema import metadata

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

# Like 0001, the tables come straight from the schema module; a later change to them must
# freeze this revision (copy the table definitions in) and add a revision of `op.*` steps.
TABLES = ("tenants", "users", "api_keys", "dataset_grants")


def upgrade() -> None:
    metadata.create_all(op.get_bind(), tables=[metadata.tables[name] for name in TABLES])


def downgrade() -> None:
    metadata.drop_all(op.get_bind(), tables=[metadata.tables[name] for name in TABLES])
